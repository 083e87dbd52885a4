"""``GET /metrics``: the control plane in the Prometheus text format (docs/metrics.md).

A scrape reads what the server already holds: the queue and the slots in use (memory), the
connected workers (memory) and their rows, the runs per status and target and the database's files
(sqlite and the disk, read in a thread, never on the event loop), the event loop's lag
(:mod:`cdui.plane.looplag`), and what :mod:`cdui.plane.counts` counted as it happened. Nothing runs
between scrapes. The text itself is made by the Prometheus client library.

Label values are bounded: statuses and states are fixed sets, targets are ``local``, ``any``,
``pool/NAME`` or ``worker/NAME``, and worker names are those of the workers table. No run id is
ever a label.

Who may read it (``metrics_allowed``): the session token (``X-CodefyUI-Token``), the metrics token
(``Authorization: Bearer``, from ``CODEFYUI_METRICS_TOKEN_FILE``: read-only, so a Prometheus server
holds no key to the runs), or, while ``CODEFYUI_METRICS_LOOPBACK`` is on (the default), any client
on this machine's loopback that came through no proxy and not through an SSH tunnel listener.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cdui import __version__
from cdui.core.diskfull import free_bytes
from cdui.core.errors import CduiError
from cdui.core.netaddr import is_loopback
from cdui.plane.appkeys import CONFIG, LOOP_LAG, SESSION_TOKEN, STORE, TUNNEL_LISTENER
from cdui.plane.http import proxies
from cdui.plane.runs import RUNS
from cdui.plane.workers import WORKERS

# The text format generate_latest writes (0.0.4, which every Prometheus reads; the library's newest name
# says 1.0.0, which older servers such as Debian's may not accept).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATUSES = ("queued", "running", "disconnected", "succeeded", "failed", "cancelled", "interrupted")
WORKER_STATES = ("online", "disconnected", "draining", "degraded", "disabled")
TOKEN_SETTING = "CODEFYUI_METRICS_TOKEN_FILE"
TOKEN_RE = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")
METRICS_TOKEN: web.AppKey[str | None] = web.AppKey("metrics_token")
SCRAPE_LOCK: web.AppKey[asyncio.Lock] = web.AppKey("metrics_lock")


def read_token_file(path: Path) -> str:
    """The metrics token in ``path`` (a Kubernetes Secret's file, or one written by the operator)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        raise CduiError("bad_setting", f"{TOKEN_SETTING}={path}: cannot read it: {exc.strerror or exc}",
                        hint="name a file holding the token Prometheus sends (e.g. `openssl rand -hex 24 > FILE`), "
                             "or unset it") from None
    if not TOKEN_RE.fullmatch(text):
        raise CduiError("bad_setting", f"{TOKEN_SETTING}={path} does not hold a token (16 to 256 characters of "
                        "letters, digits and ._~+/=-)", hint="write one with `openssl rand -hex 24 > FILE`")
    return text


def target_label(target: Any) -> str:
    """``local``, ``any``, ``pool/NAME`` or ``worker/NAME`` for a target in its stored JSON (text or parsed)."""
    if isinstance(target, str):
        try:
            target = json.loads(target)
        except ValueError:
            return "other"
    if target in ("local", "any"):
        return str(target)
    if isinstance(target, dict) and len(target) == 1:
        ((kind, name),) = target.items()
        if kind in ("worker", "pool") and isinstance(name, str):
            return f"{kind}/{name}"
    return "other"


@dataclass
class Snapshot:
    """Everything one scrape reports, gathered before the text is made."""
    families: list[Metric] = field(default_factory=list)

    def gauge(self, name: str, doc: str, value: float | None = None,
              labels: Iterable[str] = (), samples: Iterable[tuple[list[str], float]] = ()) -> None:
        g = GaugeMetricFamily(name, doc, value=value, labels=None if value is not None else list(labels))
        for values, v in samples:
            g.add_metric(values, v)
        self.families.append(g)


class _Fixed(Collector):
    """A collector that hands over one scrape's snapshot."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        yield from self.snap.families


def metrics_allowed(request: web.Request) -> bool:
    app = request.app
    token = request.headers.get("X-CodefyUI-Token")
    if token and secrets.compare_digest(token, app[SESSION_TOKEN]):
        return True
    auth = request.headers.get("Authorization", "")
    own = app.get(METRICS_TOKEN)
    if own and auth.lower().startswith("bearer ") and secrets.compare_digest(auth[7:].strip(), own):
        return True
    return bool(app[CONFIG]["CODEFYUI_METRICS_LOOPBACK"] and is_loopback(request)
                and not app.get(TUNNEL_LISTENER, False) and not proxies.forwarding_headers(request.headers))


async def metrics_route(request: web.Request) -> web.Response:
    if not metrics_allowed(request):
        how = ("send the metrics token as `Authorization: Bearer TOKEN` (bearer_token_file in Prometheus)"
               if request.app.get(METRICS_TOKEN) else
               f"set {TOKEN_SETTING} to a file holding a token and have Prometheus send it as a bearer token")
        raise CduiError("unauthorized", f"/metrics from {request.remote} needs a token",
                        hint=f"{how}, or scrape from this machine's loopback (CODEFYUI_METRICS_LOOPBACK=1, the "
                             "default); see docs/metrics.md", status=401)
    async with request.app[SCRAPE_LOCK]:  # one scrape at a time: each reads the database once
        snap = await gather(request.app)
        body = await asyncio.to_thread(_render, request.app, snap)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _render(app: web.Application, snap: Snapshot) -> bytes:
    """In a thread: the database's figures, then the text (the client library's)."""
    _database(app, snap)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Fixed(snap))
    return generate_latest(reg) + generate_latest(app[RUNS].counts.registry)


async def gather(app: web.Application) -> Snapshot:
    """What the event loop holds (the queue, the slots, the connections), read on the loop in one go."""
    runs, manager, lag = app[RUNS], app[WORKERS], app[LOOP_LAG]
    snap = Snapshot()
    snap.gauge("cdui_build_info", "This control plane's version (value 1)", labels=["version"],
               samples=[([__version__], 1)])
    # The queue, per target: how many wait and for how long the oldest has.
    now = runs.clock.time()
    depth: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for lane in list(runs.queue.lanes.values()):
        head = lane.head()
        if head is None:
            continue
        t = target_label(json.loads(lane.key)[0])
        depth[t] = depth.get(t, 0) + len(lane.runs)
        oldest[t] = max(oldest.get(t, 0.0), now - head.created_at)
    snap.gauge("cdui_queue_depth", "Queued runs, by target", labels=["target"],
               samples=[([t], n) for t, n in sorted(depth.items())])
    snap.gauge("cdui_queue_oldest_age_seconds", "Seconds the oldest queued run of each target has waited",
               labels=["target"], samples=[([t], max(0.0, a)) for t, a in sorted(oldest.items())])
    # Workers: each one's state, online flag, slots and last contact.
    rows = await manager.worker_rows()
    used: dict[tuple[str, str], int] = {}
    for _, ex, dev in runs.runs_on():
        used[(ex, dev)] = used.get((ex, dev), 0) + 1
    states = dict.fromkeys(WORKER_STATES, 0)
    online, slots, in_use, age = [], [], [], []
    mono = manager.clock.monotonic()
    for r in rows:
        name = r["name"]
        conn = manager.conns.get(name)
        if conn is not None and conn.ws.closed:
            conn = None
        cat = manager.catalog_state(name) if conn is not None else None
        state = ("disabled" if r["disabled"] else "disconnected" if conn is None else
                 "draining" if r["drained"] else "degraded" if cat is not None and cat.degraded else "online")
        states[state] += 1
        online.append(([name], 1.0 if conn is not None else 0.0))
        if conn is not None:
            age.append(([name], max(0.0, mono - conn.alive_at)))
            for dev in conn.hello.devices:
                slots.append(([name, dev], runs.caps.slots(name, dev)))
                in_use.append(([name, dev], used.get((name, dev), 0)))
        elif r["last_seen"]:
            age.append(([name], max(0.0, time.time() - float(r["last_seen"]))))
    snap.gauge("cdui_workers", "Enrolled workers, by state", labels=["state"],
               samples=[([s], n) for s, n in states.items()])
    snap.gauge("cdui_worker_online", "1 while the worker is connected, else 0", labels=["worker"], samples=online)
    snap.gauge("cdui_worker_slots", "Run slots of each connected worker's device", labels=["worker", "device"],
               samples=slots)
    snap.gauge("cdui_worker_slots_in_use", "Runs holding a slot of each connected worker's device",
               labels=["worker", "device"], samples=in_use)
    snap.gauge("cdui_worker_heartbeat_age_seconds", "Seconds since each worker was last heard from",
               labels=["worker"], samples=age)
    local = [(d, n) for (ex, d), n in used.items() if ex == "local"]
    snap.gauge("cdui_local_slots_in_use", "Runs holding a slot of this machine's devices", labels=["device"],
               samples=[([d], n) for d, n in sorted(local)])
    snap.gauge("cdui_event_loop_lag_seconds", "How late the event loop woke lately (99th percentile of the last "
               "10 s; see /api/health?detail=1)", value=lag.p99() / 1000)
    snap.gauge("cdui_disk_full", "1 while the database's disk is full and writes are refused",
               value=1.0 if app[STORE].full else 0.0)
    return snap


def _database(app: web.Application, snap: Snapshot) -> None:
    """In a thread: the runs per status and target, the database's files and the user-data disk."""
    store, config = app[STORE], app[CONFIG]
    counts: dict[tuple[str, str], int] = {}
    for status, target, n in store.run_counts_sync():
        key = (status, target_label(target))
        counts[key] = counts.get(key, 0) + n
    snap.gauge("cdui_runs", "Runs in the database, by status and target", labels=["status", "target"],
               samples=[([s, t], n) for (s, t), n in sorted(counts.items())])
    db = Path(store.path)
    snap.gauge("cdui_database_size_bytes", "Size of the database file", value=_size(db))
    snap.gauge("cdui_database_wal_size_bytes", "Size of the database's write-ahead log",
               value=_size(db.with_name(db.name + "-wal")))
    folder = config.user_data
    snap.gauge("cdui_user_data_free_bytes", "Bytes still free on the user-data folder's disk",
               value=free_bytes(folder))
    try:
        st = os.statvfs(folder)
        total = float(st.f_blocks * st.f_frsize)
    except OSError:
        total = 0.0
    snap.gauge("cdui_user_data_size_bytes", "Size of the user-data folder's disk", value=total)


def _size(path: Path) -> float:
    try:
        return float(path.stat().st_size)
    except OSError:
        return 0.0


def setup(app: web.Application) -> None:
    # No `_created` series (each counter's creation time): they double the text and Prometheus stores
    # them as plain gauges. A process-wide switch of the library; this process serves one control plane.
    disable_created_metrics()
    token_file = app[CONFIG]["CODEFYUI_METRICS_TOKEN_FILE"]
    app[METRICS_TOKEN] = read_token_file(Path(token_file)) if token_file else None
    app[SCRAPE_LOCK] = asyncio.Lock()
    app.router.add_get("/metrics", metrics_route)

"""Published apps (docs/apps.md): a saved graph frozen as numbered versions behind a slug, called with
an API key, served by a warm process on the control plane.

- **Versions** are immutable snapshots (the graph as :meth:`RunService.admit` stores a run's: its
  installed presets embedded), made by ``publish``, which checks the graph as ``/api/graph/run``
  does (its contract, then every graph error) and activates the new version at once. ``activate``
  names any version (rollback), ``unpublish`` leaves none active (invokes are refused, nothing is
  lost), ``delete`` removes the app, its versions and its invoke records.
- **API keys** (``cdui_`` and 43 random characters) are shown once; the store keeps their first
  :data:`PREFIX_CHARS` characters and the sha256 of the whole key. A revoked key is refused from the
  next request on; its row stays.
- **Warm serving**: each active app version an invoke asks for gets a process (a canvas process,
  :mod:`cdui.run.canvas_proc`: forked from the zygote, torch imported) that runs one invoke's graph
  after another and keeps between them what does not depend on the inputs (its execution cache), so a
  model is built once and only what the inputs change runs. No run is stored for an invoke: its record
  is a row of ``app_invokes``. One invoke runs at a time per process; a version has up to
  ``CODEFYUI_APP_PROCESSES`` of them on a device (one more starts when every one is busy), and
  ``CODEFYUI_APP_MAX_WAITING`` invokes of an app may be in flight or waiting (429 ``app_busy``
  beyond). A process ends after ``CODEFYUI_APP_IDLE_TIMEOUT_S`` idle, when it holds more than
  ``CODEFYUI_APP_MAX_RSS_MB`` after an invoke, and once its version is no longer the active one and
  its last invoke has answered: activating another version never drops an invoke in flight. A crash
  fails only the invoke in flight (503 ``app_process_lost``); the next invoke starts a fresh process.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.core.paths import sha256_file
from cdui.graph.contract import Contract, contract_of, fill_inputs
from cdui.nodes.builtin.graph_io import GRAPH_OUTPUT_EVENT
from cdui.plane.runs import RunService
from cdui.run import canvas_proc, runner
from cdui.run.spare import RunProcess, exit_text
from cdui.wire.devicesets import device_matches
from cdui.wire.job import Job, JobFiles

log = logging.getLogger(__name__)

SLUG = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
KEY_PREFIX = "cdui_"
PREFIX_CHARS = 12  # of a key, kept and listed so that its owner can tell keys apart
KEY_NAME_MAX = 100
NOTE_MAX = 2000
GIT_COMMIT = re.compile(r"^[0-9a-fA-F]{4,64}$")
# A version's weights files are copied at publish into this folder of the models folder, by content
# (WEIGHTS_FOLDER/<sha256>/<name>), and its graph names the copies: saving new weights over the original
# never changes a published version. At most SNAPSHOT_MAX_BYTES of them per publish.
WEIGHTS_FOLDER = "app-weights"
SNAPSHOT_MAX_BYTES = 8 * 1024 ** 3
SNAPSHOTS_KEPT = 32  # versions' graphs kept in memory for invokes (each up to CODEFYUI_MAX_GRAPH_BYTES)
STOP_WAIT_S = 5.0  # how long an invoke past its timeout has to end after its stop, before its process is killed
SWEEP_EVERY_S = 5.0
STDERR_KEPT = 20  # the last lines of a warm process's stderr, for the message when it dies
DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S = 60.0, 3600.0
INVOKES_LISTED_MAX = 500
# The start of the event lines an invoke reads (the run process writes "kind" first: cdui/run/runproc.py).
_WANTED = (b'{"kind": "' + GRAPH_OUTPUT_EVENT.encode() + b'"', b'{"kind": "result"')
LOST = "the app's serving process ended during this invoke; the next invoke starts a new one"


def check_slug(slug: str) -> str:
    if not SLUG.match(slug):
        raise CduiError("invalid_slug", f"app slug {slug[:100]!r} is not valid",
                        hint="use 1 to 64 lower-case letters, digits and '-', starting with a letter "
                             "(^[a-z][a-z0-9-]{0,63}$)", status=422)
    return slug


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _optional_str(body: dict[str, Any], name: str, limit: int) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise CduiError("bad_request", f"{name} must be a string of at most {limit} characters",
                        hint=f'give "{name}": "..." or leave it out')
    return v


def _optional_bool(body: dict[str, Any], name: str) -> bool | None:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise CduiError("bad_request", f"{name}={v!r} is not true or false", hint=f'give "{name}": true or false')
    return v


def bounded_json(value: Any, limit: int) -> str:
    """``value`` as JSON text for an invoke record, or only its size when it is longer than ``limit``."""
    text = json.dumps(value, default=str)
    if len(text) > limit:
        return json.dumps({"__omitted__": "larger than CODEFYUI_APP_RECORD_MAX_BYTES", "bytes": len(text)})
    return text


@dataclass
class _Call:
    """One invoke on a warm process: what its graph's GraphOutputs gave, and its end."""
    done: asyncio.Future[dict[str, Any]]
    outputs: dict[str, Any] = field(default_factory=dict)
    output_error: dict[str, Any] | None = None


class WarmProcess:
    """One app version's serving process, seen from the control plane."""

    def __init__(self, slug: str, version: int, slot: str, proc: RunProcess, index: int = 0) -> None:
        self.slug, self.version, self.slot, self.proc, self.index = slug, version, slot, proc, index
        self.lock = asyncio.Lock()  # one invoke at a time
        self.waiting = 0  # invokes holding or waiting for the lock
        self.current: _Call | None = None
        self.last_used = time.monotonic()
        self.retired = False  # its version is no longer active: it ends once its last invoke has answered
        self.invokes = 0
        self.exited = asyncio.Event()
        self.stderr: list[str] = []
        self.ending: str | None = None
        self.tasks: list[asyncio.Task[Any]] = []

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.exited.is_set()

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr()),
                      asyncio.ensure_future(self._watch())]

    async def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue  # longer than any event may be: dropped
            if not line:
                return
            call = self.current
            # Only two kinds of line matter here; the others (node statuses, logs) are not decoded at all.
            if call is None or call.done.done() or not line.startswith(_WANTED):
                continue
            try:
                ev = json.loads(line)
                kind, data = ev["kind"], ev.get("data")
            except (ValueError, KeyError, TypeError):
                continue
            if kind == GRAPH_OUTPUT_EVENT and isinstance(data, dict):
                if "error" in data and call.output_error is None:
                    call.output_error = {**data["error"], "node_id": data.get("node_id")}
                elif "value" in data:
                    call.outputs[str(data.get("name"))] = data["value"]
            elif kind == "result" and isinstance(data, dict):
                call.done.set_result(data)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode(errors="replace").rstrip("\n")
            if text.strip():
                self.stderr = [*self.stderr[-(STDERR_KEPT - 1):], text[:1000]]
                log.debug("app %s v%d process %s: %s", self.slug, self.version, self.proc.pid, text[:1000])

    async def _watch(self) -> None:
        rc = await self.proc.wait()
        await asyncio.gather(*self.tasks[:2], return_exceptions=True)
        self.exited.set()
        call, self.current = self.current, None
        if call is not None and not call.done.done():
            why = self.ending or exit_text(self.proc, rc)
            call.done.set_exception(CduiError(
                "app_process_lost", f"app {self.slug!r} version {self.version}: the {why}; {LOST}",
                hint="call again: a new process serves it", status=503,
                details={"stderr_tail": self.stderr[-5:]}))

    async def call(self, job: Job, timeout: float) -> tuple[dict[str, Any], _Call]:
        """Run one job; its result line and what its outputs gave. Holds :attr:`lock`."""
        if not self.alive:
            raise CduiError("app_process_lost", f"app {self.slug!r} version {self.version}: its serving process "
                            f"has ended; {LOST}", hint="call again", status=503)
        call = _Call(asyncio.get_running_loop().create_future())
        self.current = call
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((canvas_proc.JOB + job.to_json() + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            pass  # the process is gone: its watch fails the call
        try:
            result = await asyncio.wait_for(asyncio.shield(call.done), timeout)
        except TimeoutError:
            await self._stop(call)
            raise CduiError("timeout", f"the invoke did not end within {timeout:g} s; it was stopped",
                            hint="raise timeout_s, or make the graph faster", status=504) from None
        finally:
            if self.current is call:
                self.current = None
            self.invokes += 1
            self.last_used = time.monotonic()
        return result, call

    async def _stop(self, call: _Call) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((canvas_proc.STOP + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            return
        try:
            await asyncio.wait_for(asyncio.shield(call.done), STOP_WAIT_S)
        except Exception:  # noqa: BLE001 - it did not end (or its process died): a fresh one serves the next
            self.kill("it did not stop within its invoke's timeout")
            # Gone before the lock is let go: the invoke waiting for it must find it dead, not write to it.
            await self.exited.wait()
            if call.done.done():
                call.done.exception()  # its loss is this timeout's, already answered

    def kill(self, why: str) -> None:
        self.ending = self.ending or why
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        return {"slug": self.slug, "version": self.version, "pid": self.proc.pid, "device": self.slot,
                "state": "busy" if self.current is not None else "idle", "waiting": self.waiting,
                "invokes": self.invokes, "idle_s": round(time.monotonic() - self.last_used, 1),
                "rss_bytes": _rss_bytes(self.proc.pid), "retired": self.retired}


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class AppService:
    def __init__(self, service: RunService) -> None:
        self.service = service
        self.store = service.store
        cfg = service.config
        self.idle_timeout = float(cfg["CODEFYUI_APP_IDLE_TIMEOUT_S"])
        self.max_rss = int(cfg["CODEFYUI_APP_MAX_RSS_MB"]) * 1024 * 1024
        self.max_waiting = int(cfg["CODEFYUI_APP_MAX_WAITING"])
        self.record_max = int(cfg["CODEFYUI_APP_RECORD_MAX_BYTES"])
        self.records_kept = int(cfg["CODEFYUI_APP_INVOKES_KEPT"])
        self.cache_max = int(cfg["CODEFYUI_CANVAS_CACHE_MAX_MB"]) * 1024 * 1024
        self.per_version = int(cfg["CODEFYUI_APP_PROCESSES"])
        # (slug, version, device, index) -> its process; up to per_version of them for one version and device.
        self.procs: dict[tuple[str, int, str, int], WarmProcess] = {}
        self._starting: dict[tuple[str, int, str, int], asyncio.Lock] = {}
        self._launching: set[tuple[str, int, str, int]] = set()  # processes being started
        self.waiting: dict[str, int] = {}  # invokes of each app in flight or waiting
        # Each active version's snapshot and contract, read once from the store (versions never change).
        self._snapshots: dict[tuple[str, int], tuple[dict[str, Any], Contract]] = {}
        # Each app's row and each live key's id, as last read: every change of either is made through this
        # service (or the routes that call it), which drops what it changed, so an invoke reads the store only
        # to record itself. Unknown keys are never kept: made-up keys cannot grow it.
        # A read under way while a change is made must not keep what it read: each change moves its
        # generation, and a read keeps its row only if the generation did not move meanwhile.
        self._apps: dict[str, dict[str, Any]] = {}
        self._keys: dict[str, int] = {}
        self._apps_gen = 0
        self._keys_gen = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def close(self) -> None:
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for p in list(self.procs.values()):
            await self._end(p, "the server stopped")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(SWEEP_EVERY_S, max(0.5, self.idle_timeout / 4)))
            now = time.monotonic()
            for p in list(self.procs.values()):
                if not p.alive:
                    self._forget(p)
                elif p.waiting == 0 and now - p.last_used > self.idle_timeout:
                    log.info("app %s v%d: its process %s was idle %.0f s: ended", p.slug, p.version, p.proc.pid,
                             now - p.last_used)
                    await self._end(p, "idle")

    def _forget(self, p: WarmProcess) -> None:
        key = (p.slug, p.version, p.slot, p.index)
        if self.procs.get(key) is p:
            del self.procs[key]

    async def _end(self, p: WarmProcess, why: str) -> None:
        self._forget(p)
        if p.proc.stdin is not None:
            with contextlib.suppress(Exception):
                p.proc.stdin.close()
        p.kill(why)
        await p.exited.wait()

    async def retire(self, slug: str, keep: int | None) -> None:
        """Every process of ``slug`` but version ``keep``'s ends, each once its invokes have answered."""
        for p in list(self.procs.values()):
            if p.slug == slug and p.version != keep:
                p.retired = True
                self._forget(p)
                if p.waiting == 0:
                    await self._end(p, "its version is no longer the active one")

    # -- publish and versions ----------------------------------------------------------
    async def publish(self, slug: str, body: dict[str, Any], source: str, graph: dict[str, Any]) -> dict[str, Any]:
        """Check the graph as a call of it is checked, store it as the next version and activate it."""
        check_slug(slug)
        create = _optional_bool(body, "create") or False
        record_io = _optional_bool(body, "record_io")
        git_dirty = _optional_bool(body, "git_dirty")
        note = _optional_str(body, "note", NOTE_MAX)
        git_commit = _optional_str(body, "git_commit", 64)
        if git_commit is not None and not GIT_COMMIT.match(git_commit):
            raise CduiError("bad_request", f"git_commit {git_commit[:70]!r} is not a commit id",
                            hint="give the commit's hexadecimal id (4 to 64 digits), e.g. from `git rev-parse HEAD`")
        contract = contract_of(graph)  # 409 with the reason, as /api/graph/run answers
        try:
            admitted = await self.service.admit(graph, {"target": "local"})
        except CduiError as exc:
            if exc.code == "invalid_graph":
                exc.status = 409
            raise
        if admitted.secrets:
            raise CduiError("secret_in_graph", f"the graph holds {len(admitted.secrets)} saved secret value(s); a "
                            "published version is stored for good and must not keep one",
                            hint="blank the secret params (save the graph again: PUT /api/graphs/{name} blanks "
                                 "them) and publish again", status=409)
        snapshot, copied = await asyncio.to_thread(self._keep_weights, admitted.stored_graph)
        got = await self.store.apps.publish(slug, create, source, snapshot, contract.to_json(), note,
                                            record_io, git_commit, git_dirty, self.service.clock.time())
        if got is None:
            raise CduiError("app_not_found", f"app {slug!r} does not exist",
                            hint='pass "create": true to create it (cdui apps publish does on its first publish)',
                            status=404)
        version, created = got
        self._forget_app(slug)
        await self.retire(slug, version)
        return {"slug": slug, "version": version, "active": True, "created": created, "graph_name": source,
                "note": note, "git_commit": git_commit, "git_dirty": git_dirty, "weights": copied}

    def _keep_weights(self, graph: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The graph with each of its top-level nodes' weights files (``model_file`` params naming a file of
        the models folder) replaced by a copy kept for the app; and what was copied. (A preset's own nodes
        keep their paths.)"""
        layout, registry = self.service.layout, self.service.registry
        out = json.loads(json.dumps(graph))
        copied: list[dict[str, Any]] = []
        total = 0
        for node in out.get("nodes") or []:
            kind = node.get("type") if isinstance(node, dict) else None
            cls = registry.get(kind) if isinstance(kind, str) else None
            data = node.get("data") if cls is not None else None
            params = data.get("params") if isinstance(data, dict) else None
            if cls is None or not isinstance(params, dict):
                continue
            for p in cls.define_params():
                value = params.get(p.name)
                if p.param_type != "model_file" or not isinstance(value, str) or not value.strip() \
                        or value.strip().startswith(WEIGHTS_FOLDER + "/"):
                    continue
                try:
                    src = layout.resolve_upload("models", value)
                except CduiError:
                    continue  # the node says why when it runs, as in any run
                if not src.is_file():
                    continue
                size, digest = sha256_file(src)
                total += size
                if total > SNAPSHOT_MAX_BYTES:
                    raise CduiError("snapshot_too_large", f"the graph's weights files are more than "
                                    f"{SNAPSHOT_MAX_BYTES // 1024 ** 3} GiB together; a version keeps a copy of each",
                                    hint="publish a graph that loads smaller weights", status=413)
                name = f"{WEIGHTS_FOLDER}/{digest}/{src.name}"
                dest = layout.resolve_upload("models", name)
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    part = dest.with_name(dest.name + ".part")
                    shutil.copyfile(src, part)
                    os.replace(part, dest)
                params[p.name] = name
                copied.append({"node_id": node.get("id"), "param": p.name, "from": value, "to": name, "bytes": size})
        return out, copied

    def _forget_app(self, slug: str) -> None:
        """After a change of the app's row: a read under way when it was made keeps nothing."""
        self._apps_gen += 1
        self._apps.pop(slug, None)

    async def app(self, slug: str) -> dict[str, Any]:
        row = self._apps.get(slug)
        if row is None:
            gen = self._apps_gen
            row = await self.store.apps.get(check_slug(slug))
            if row is None:
                raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps",
                                status=404)
            if gen == self._apps_gen:
                self._apps[slug] = row
        return dict(row)

    async def set_record_io(self, slug: str, record: bool) -> None:
        changed = await self.store.apps.set_record_io(check_slug(slug), record, self.service.clock.time())
        self._forget_app(slug)
        if not changed:
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)

    async def activate(self, slug: str, version: int | None) -> dict[str, Any]:
        check_slug(slug)
        missing = await self.store.apps.activate(slug, version, self.service.clock.time())
        self._forget_app(slug)
        if missing == "app":
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)
        if missing == "version":
            raise CduiError("version_not_found", f"app {slug!r} has no version {version}",
                            hint=f"list them: GET /api/apps/{slug}/versions", status=404)
        await self.retire(slug, version)
        return {"slug": slug, "active_version": version}

    async def delete(self, slug: str) -> dict[str, Any]:
        check_slug(slug)
        deleted = await self.store.apps.delete(slug)
        self._forget_app(slug)
        if not deleted:
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)
        await self.retire(slug, None)
        for key in [k for k in self._snapshots if k[0] == slug]:
            del self._snapshots[key]
        for lock_key in [k for k in self._starting if k[0] == slug]:
            del self._starting[lock_key]
        return {"slug": slug, "deleted": True}

    async def snapshot(self, slug: str, version: int) -> tuple[dict[str, Any], Contract]:
        got = self._snapshots.get((slug, version))
        if got is None:
            row = await self.store.apps.version(slug, version)
            if row is None:
                raise NotFound("app version", f"{slug} v{version}")
            got = (row["graph"], contract_of(row["graph"]))
            self._snapshots[(slug, version)] = got
            while len(self._snapshots) > SNAPSHOTS_KEPT:  # the least recently read first
                del self._snapshots[next(iter(self._snapshots))]
        else:
            self._snapshots[(slug, version)] = self._snapshots.pop((slug, version))
        return got

    # -- keys ------------------------------------------------------------------------
    async def create_key(self, name: Any) -> dict[str, Any]:
        if not isinstance(name, str) or not name.strip() or len(name) > KEY_NAME_MAX:
            raise CduiError("bad_request", f"name={str(name)[:120]!r} is not a key name",
                            hint=f'give "name": 1 to {KEY_NAME_MAX} characters saying who uses the key')
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        prefix = key[:PREFIX_CHARS]
        key_id = await self.store.apps.add_key(name, prefix, hash_key(key), self.service.clock.time())
        return {"id": key_id, "name": name, "prefix": prefix, "key": key, "token": key}

    async def key_auth(self, request: web.Request) -> int | None:
        """The id of the live API key in ``Authorization: Bearer``, or None."""
        given = request.headers.get("Authorization", "")[7:].strip()
        if not given.startswith(KEY_PREFIX):
            return None
        h = hash_key(given)
        known = self._keys.get(h)
        if known is not None:
            return known
        gen = self._keys_gen
        row = await self.store.apps.key_by_hash(h)
        if row is None or row["revoked_at"] is not None:
            return None
        if gen == self._keys_gen:
            self._keys[h] = int(row["id"])
        return int(row["id"])

    async def revoke_key(self, key_id: int) -> dict[str, Any] | None:
        """Refused from the next request on: the kept ids are dropped before the store is changed, and a
        read that was under way meanwhile finds the key revoked."""
        self._keys_gen += 1
        self._keys.clear()
        row = await self.store.apps.revoke_key(key_id, self.service.clock.time())
        self._keys_gen += 1
        self._keys.clear()
        return row

    # -- invoke ------------------------------------------------------------------------
    def _slot(self, wanted: Any) -> str:
        if wanted is not None and not isinstance(wanted, str):
            raise CduiError("bad_request", f"device={wanted!r} is not a device name",
                            hint='leave it out, or give e.g. "cpu" or "cuda:0"')
        local = self.service.executors.get("local")
        devices = local.devices() if local is not None else ["cpu"]
        fits = [d for d in devices if device_matches(wanted, d)]
        if wanted in (None, "", "auto"):
            fits.sort(key=lambda d: (d == "cpu", d))
        if not fits:
            raise CduiError("bad_device", f"device {wanted!r} is not one of the control plane's: "
                            f"{', '.join(devices)}", hint="leave device out, or name one of those")
        return fits[0]

    async def _process(self, slug: str, version: int, slot: str) -> WarmProcess:
        """An idle process of this version on ``slot``; else a new one while there are fewer than
        CODEFYUI_APP_PROCESSES (started or starting); else the one with the fewest invokes waiting."""
        while True:
            pool = [p for (s, v, d, _i), p in self.procs.items() if (s, v, d) == (slug, version, slot) and p.alive]
            idle = [p for p in pool if p.waiting == 0]
            if idle:
                return idle[0]
            taken = {p.index for p in pool} | {k[3] for k in self._launching if k[:3] == (slug, version, slot)}
            free = [i for i in range(self.per_version) if i not in taken]
            if free:
                return await self._start(slug, version, slot, free[0])
            if pool:
                return min(pool, key=lambda p: p.waiting)
            # Every process this version may have is still starting: wait for one, then choose again.
            starting = next(k for k in self._launching if k[:3] == (slug, version, slot))
            async with self._starting.setdefault(starting, asyncio.Lock()):
                pass

    async def _start(self, slug: str, version: int, slot: str, index: int) -> WarmProcess:
        key = (slug, version, slot, index)
        self._launching.add(key)  # before any wait: invokes arriving meanwhile count it as taken
        try:
            async with self._starting.setdefault(key, asyncio.Lock()):
                env, _device = runner.run_env(slot)
                proc = await self.service.spares.process(*runner.process_shape(), env)
                assert proc.stdin is not None
                hello = {"tab": f"app-{slug}", "cache_max_bytes": self.cache_max}
                proc.stdin.write((canvas_proc.HELLO + json.dumps(hello) + "\n").encode())
                await proc.stdin.drain()
                p = WarmProcess(slug, version, slot, proc, index)
                p.start()
                self.procs[key] = p
                log.info("app %s v%d: process %s started on %s", slug, version, proc.pid, slot)
                return p
        finally:
            self._launching.discard(key)

    def _job(self, slug: str, version: int, graph: dict[str, Any], slot: str) -> Job:
        svc = self.service
        _env, proc_device = runner.run_env(slot)
        return Job(run_id=f"app-{slug}-v{version}", graph=graph,
                   options={"graph_max_nodes": svc.config["CODEFYUI_GRAPH_MAX_NODES"], canvas_proc.SERVING: True},
                   slot_device=slot,
                   process_device=proc_device, layout=svc.layout.to_json(),
                   custom_nodes_dir=str(svc.config.custom_nodes_dir), plugins_dir=str(svc.config.plugins_dir),
                   files=JobFiles(None, (), svc.config["CODEFYUI_MOUNT_LABEL"]))

    async def invoke(self, slug: str, body: Any, key_id: int | None) -> tuple[int, dict[str, Any]]:
        """Run the active version on ``inputs``; the HTTP status and CodefyUI's envelope. Recorded
        whatever its end, once the app and its active version are known."""
        started = time.monotonic()
        if not isinstance(body, dict):
            raise CduiError("bad_request", "the body must be an object: {inputs, timeout_s, device}")
        app = await self.app(slug)
        version = app["active_version"]
        if version is None:
            raise CduiError("app_unpublished", f"app {slug!r} is unpublished: no version is active",
                            hint=f"activate one: POST /api/apps/{slug}/activate {{\"version\": N}}", status=409)
        envelope: dict[str, Any] = {"status": None, "run_id": None, "invoke_id": None, "graph": app["graph_name"],
                                    "app": slug, "version": version, "device": None, "outputs": {}, "error": None,
                                    "timing": {}}
        status = 200
        try:
            raw = body.get("timeout_s", DEFAULT_TIMEOUT_S)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= MAX_TIMEOUT_S:
                raise CduiError("bad_timeout", f"timeout_s={raw!r} is not a number of seconds in "
                                f"(0, {MAX_TIMEOUT_S:.0f}]", hint="give timeout_s in seconds, or leave it out")
            graph, contract = await self.snapshot(slug, version)
            filled = fill_inputs(graph, contract, body.get("inputs"))
            slot = self._slot(body.get("device"))
            envelope["device"] = slot
            if self.waiting.get(slug, 0) >= self.max_waiting:
                raise CduiError("app_busy", f"app {slug!r} has {self.max_waiting} invokes in flight or waiting, "
                                "the most CODEFYUI_APP_MAX_WAITING allows", hint="retry shortly", status=429)
            if self._closing:
                raise CduiError("shutting_down", "the server is stopping", hint="call again once it is back",
                                status=503)
            self.waiting[slug] = self.waiting.get(slug, 0) + 1
            try:
                result, call = await self._run(slug, version, slot, filled, float(raw))
            finally:
                self.waiting[slug] -= 1
                if not self.waiting[slug]:
                    del self.waiting[slug]
            envelope["outputs"] = call.outputs
            envelope["status"] = str(result.get("status") or "failed")
            if envelope["status"] != "succeeded":
                envelope["error"] = call.output_error or {
                    "code": f"run_{envelope['status']}", "message": result.get("error") or envelope["status"],
                    "node_id": result.get("node_id"), "details": None}
                envelope["error"].setdefault("details", None)
            else:
                missing = sorted(set(contract.outputs) - set(call.outputs))
                if missing:
                    envelope["status"] = "failed"
                    envelope["error"] = {"code": "missing_outputs", "message": f"the invoke ended without "
                                         f"output(s) {missing}", "node_id": None, "details": None}
        except CduiError as exc:
            status = exc.status
            envelope["status"] = "timeout" if exc.code == "timeout" else "failed"
            envelope["error"] = {"code": exc.code, "message": exc.message, "node_id": None, "details": exc.details}
            if exc.hint:
                envelope["error"]["hint"] = exc.hint
        took = time.monotonic() - started
        envelope["timing"] = {"total_s": round(took, 4)}
        record = app["record_io"]
        inputs_text = bounded_json(body.get("inputs"), self.record_max) if record else None
        outputs_text = bounded_json(envelope["outputs"], self.record_max) if record else None
        err = envelope["error"]
        error_text = f"{err['code']}: {err['message']}"[:2000] if err else None
        envelope["invoke_id"] = await self.store.apps.record_invoke(
            slug, version, key_id, str(envelope["status"]), error_text, round(took * 1000, 3), inputs_text,
            outputs_text, self.service.clock.time(), self.records_kept)
        return status, envelope

    async def _run(self, slug: str, version: int, slot: str, graph: dict[str, Any],
                   timeout: float) -> tuple[dict[str, Any], _Call]:
        job = self._job(slug, version, graph, slot)
        while True:
            p = await self._process(slug, version, slot)
            p.waiting += 1
            try:
                async with p.lock:
                    if p.alive:
                        return await p.call(job, timeout)
                # It died while this invoke waited behind another: this one runs on a fresh process.
            finally:
                p.waiting -= 1
                await self._after(p)

    async def _after(self, p: WarmProcess) -> None:
        if not p.alive or p.waiting:
            return
        rss = _rss_bytes(p.proc.pid) if self.max_rss > 0 else None
        if p.retired:
            await self._end(p, "its version is no longer the active one")
        elif rss is not None and rss > self.max_rss:
            log.warning("app %s v%d: its process %s holds %d MB, over CODEFYUI_APP_MAX_RSS_MB=%d: ended",
                        p.slug, p.version, p.proc.pid, rss // 2**20, self.max_rss // 2**20)
            await self._end(p, "over its memory bound")

    def describe(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.procs.values() if p.alive]


APPS: web.AppKey[AppService] = web.AppKey("apps")
# The id of the API key a request was let in with (the auth middleware sets it on invokes).
API_KEY_ID: web.RequestKey[int] = web.RequestKey("api_key_id")

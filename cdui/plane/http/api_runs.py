"""HTTP routes for runs, their events, artifacts, and the node catalog."""
from __future__ import annotations

import asyncio
import json
import math
import mimetypes
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from cdui.core.errors import CduiError, NotFound
from cdui.graph.secrets import split_secrets
from cdui.nodes.layer_types import layer_types
from cdui.plane.files.artifact_files import KEPT_BACKENDS, MAX_HASH_BYTES, ArtifactRefused, confine
from cdui.plane.files.s3_plane import backend_of
from cdui.plane.http.httpjson import read_json
from cdui.plane.runs import RUNS, check_tag, iso
from cdui.plane.store import TERMINAL, RunFilter
from cdui.wire.target import parse_target, target_json


def _runs(request: web.Request):
    return request.app[RUNS]


async def _read_graph_body(request: web.Request) -> Any:
    limit = _runs(request).config["CODEFYUI_MAX_GRAPH_BYTES"]
    return await read_json(request, limit, "CODEFYUI_MAX_GRAPH_BYTES")


def _event_out(ev: dict[str, Any]) -> dict[str, Any]:
    return {"seq": ev["seq"], "kind": ev["kind"], "data": ev["data"], "at": iso(ev["at"])}


async def submit(request: web.Request) -> web.Response:
    body = await _read_graph_body(request)
    if not isinstance(body, dict) or "graph" not in body:
        raise CduiError("bad_request", "the body must be an object with a 'graph' (and optional 'options')",
                        hint='POST {"graph": {...}, "options": {"target": "local"}}')
    run = await _runs(request).submit(body["graph"], body.get("options"))
    return web.json_response(run, status=201)


# sqlite's integers are 64-bit: a larger ?limit= or ?after= would fail inside the query.
MAX_INT64 = 2 ** 63 - 1


MAX_SEARCH = 200  # characters of ?search=


async def list_runs(request: web.Request) -> web.Response:
    # Not below 0: sqlite reads LIMIT -1 as "no limit".
    limit = _int_query(request, "limit", 200, 0, MAX_INT64, "e.g. ?limit=200 for the newest 200 runs")
    q = request.query
    target = None
    if "target" in q:
        try:
            target = json.dumps(target_json(parse_target(q["target"])))
        except CduiError as exc:
            raise CduiError("bad_query", f"target={q['target'][:80]!r}: {exc.message}",
                            hint="target=local, any, one-shot or a worker's name") from None
    tag = check_tag(q["tag"], "tag=") if "tag" in q else None
    search = q.get("search") or None
    if search is not None and len(search) > MAX_SEARCH:
        raise CduiError("bad_query", f"search= is {len(search)} characters; at most {MAX_SEARCH}")
    after = q.get("after") or None
    runs = _runs(request)
    if after is not None and await runs.store.get_run(after) is None:
        raise CduiError("bad_query", f"after={after[:80]!r}: no such run to list the runs after",
                        hint="after= takes the id of the last run of the page before")
    where = RunFilter(status=q.get("status") or None, target=target, worker=q.get("worker") or None, tag=tag,
                      search=search, after=after)
    body = await runs.list_json(None, limit, where)
    return web.Response(body=body, content_type="application/json", charset="utf-8")  # as json_response says it


async def run_graph(request: web.Request) -> web.Response:
    """The run's graph as it was stored at submit: what a clone starts from. Its secrets were never
    stored (they live in memory for the run only), so a clone gives them again."""
    run_id = request.match_info["run_id"]
    run = await _runs(request).store.get_run(run_id, with_graph=True)
    if run is None:
        raise NotFound("run", run_id, hint="list runs with GET /api/runs")
    return web.json_response({"run_id": run.id, "graph": run.graph})


async def patch_run(request: web.Request) -> web.Response:
    body = await read_json(request, 64 * 1024)
    return web.json_response(await _runs(request).set_labels(request.match_info["run_id"], body))


async def count_runs(request: web.Request) -> web.Response:
    counts = await _runs(request).store.count_runs()
    return web.json_response({"counts": counts, "total": sum(counts.values())})


async def get_run(request: web.Request) -> web.Response:
    return web.json_response(await _runs(request).get(request.match_info["run_id"]))


# Events per answer of the events route (its default and its maximum) and per
# page of a WebSocket's backlog: one page is read and encoded at a time, so a
# run of millions of events costs bounded memory per request.
EVENTS_PAGE = 10000
BATCH_EVENTS = 256  # events in one message of a ?batch=1 stream, at most
BATCH_BYTES = 256 * 1024  # and about this many bytes (one event more may pass it)


def _batched(request: web.Request) -> bool:
    raw = request.query.get("batch", "0")
    if raw not in ("0", "1"):
        raise CduiError("bad_query", f"batch={raw[:20]!r} is not 0 or 1",
                        hint="?batch=1 sends the events that are ready as one JSON array per message; "
                             "leave it out (or 0) for one event per message")
    return raw == "1"


def _int_query(request: web.Request, name: str, default: int, low: int, high: int | None, hint: str) -> int:
    raw = request.query.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bounds = f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"
        raise CduiError("bad_query", f"{name}={raw!r} is not {bounds}", hint=hint)
    return value


def _after(request: web.Request) -> int:
    return _int_query(request, "after", 0, 0, MAX_INT64, "give the last seq you have, e.g. ?after=42")


async def events(request: web.Request) -> web.Response:
    """One page of a run's events; a full page says where the next one starts.

    The body stays a JSON array (the contract); the cursor travels in headers:
    ``X-CodefyUI-Next-After: SEQ`` and ``Link: <...?after=SEQ&limit=N>; rel="next"``,
    present only when more events follow right now."""
    run_id = request.match_info["run_id"]
    await _runs(request).get(run_id)
    after = _after(request)
    limit = _int_query(request, "limit", EVENTS_PAGE, 1, EVENTS_PAGE,
                       f"ask for at most {EVENTS_PAGE} events per call and follow X-CodefyUI-Next-After")
    evs = await _runs(request).store.events(run_id, after, limit + 1)
    headers = {}
    if len(evs) > limit:
        evs = evs[:limit]
        nxt = evs[-1]["seq"]
        headers["X-CodefyUI-Next-After"] = str(nxt)
        headers["Link"] = f'<{request.path}?after={nxt}&limit={limit}>; rel="next"'
    return web.json_response([_event_out(e) for e in evs], headers=headers)


# A run's metric series (GET /api/runs/{id}/metrics): at most this many series, each thinned to at
# most ?points= values (default and bound below), so a run of a million batches answers in a few KiB.
MAX_METRIC_SERIES = 64
METRIC_POINTS, MAX_METRIC_POINTS = 1000, 10000
MAX_METRIC_NAME = 128


class _Series:
    """One metric of one node, thinned as it grows: every ``stride``-th value is kept, and when twice
    ``cap`` are held every other one is dropped and the stride doubles (memory stays under 2 x cap).
    The last value, the count and the finite min/max are of every value, thinned or not."""

    def __init__(self, name: str, node_id: str | None, cap: int) -> None:
        self.name, self.node_id, self.cap = name, node_id, cap
        self.steps: list[float] = []
        self.values: list[float | None] = []
        self.stride, self.count = 1, 0
        self.last: tuple[float, float | None] | None = None
        self.low: float | None = None
        self.high: float | None = None

    def add(self, step: float, value: float | None) -> None:
        if value is not None:
            self.low = value if self.low is None else min(self.low, value)
            self.high = value if self.high is None else max(self.high, value)
        if self.count % self.stride == 0:
            self.steps.append(step)
            self.values.append(value)
            if len(self.steps) >= 2 * self.cap:
                self.steps, self.values, self.stride = self.steps[::2], self.values[::2], self.stride * 2
        self.count += 1
        self.last = (step, value)

    def out(self) -> dict[str, Any]:
        steps, values = self.steps, self.values
        if self.last is not None and (not steps or steps[-1] != self.last[0]):
            steps, values = [*steps, self.last[0]], [*values, self.last[1]]
        if len(steps) > self.cap:  # evenly picked, the last one always kept
            pick = [round(i * (len(steps) - 1) / (self.cap - 1)) for i in range(self.cap)] if self.cap > 1 \
                else [len(steps) - 1]
            steps, values = [steps[i] for i in pick], [values[i] for i in pick]
        return {"name": self.name, "node_id": self.node_id, "count": self.count, "steps": steps, "values": values,
                "last": None if self.last is None else {"step": self.last[0], "value": self.last[1]},
                "min": self.low, "max": self.high}


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    value = float(raw)
    return value if math.isfinite(value) else None


async def metrics(request: web.Request) -> web.Response:
    """A run's ``metric`` events as series (one per metric name and node), read from its stored
    events a page at a time and thinned to ``?points=``: what the run view's charts and the
    comparison page draw without replaying every event."""
    run_id = request.match_info["run_id"]
    run = await _runs(request).get(run_id)
    cap = _int_query(request, "points", METRIC_POINTS, 2, MAX_METRIC_POINTS,
                     f"e.g. ?points={METRIC_POINTS}: values kept per series, from 2 to {MAX_METRIC_POINTS}")
    series: dict[tuple[str, str | None], _Series] = {}
    dropped: set[tuple[str, str | None]] = set()
    after = 0
    store = _runs(request).store
    while True:
        evs = await store.events(run_id, after, EVENTS_PAGE)
        for ev in evs:
            d = ev["data"]
            after = ev["seq"]
            if ev["kind"] != "metric" or not isinstance(d, dict) or not isinstance(d.get("name"), str):
                continue
            raw = d.get("value")
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) and raw is not None:
                continue
            node = d.get("node_id") if isinstance(d.get("node_id"), str) else None
            key = (d["name"][:MAX_METRIC_NAME], node)
            s = series.get(key)
            if s is None:
                if len(series) >= MAX_METRIC_SERIES:
                    dropped.add(key)
                    continue
                s = series[key] = _Series(key[0], node, cap)
            step = _number(d.get("step"))
            s.add(step if step is not None else float(s.count + 1), _number(raw))
        if len(evs) < EVENTS_PAGE:
            break
    # last_seq: the last event read; the live stream continues after it (/ws/runs/{id}?after=last_seq).
    return web.json_response({"run_id": run_id, "status": run.get("status"), "last_seq": after,
                              "points": cap, "series": [s.out() for s in series.values()],
                              "series_left_out": len(dropped)})


async def stream(request: web.Request) -> web.WebSocketResponse:
    """Live events: everything after ``?after=SEQ``, then new events as they come.

    Invariant: every event is sent exactly once, in ``seq`` order. The
    subscription starts before the backlog is read, so nothing stored
    meanwhile is missed; the backlog is read from the store a page at a time
    until caught up; a live event at or below what was sent is a duplicate and
    dropped, and one that skips ahead (two batches broadcast out of order)
    sends the missing events from the store first. Whatever is broadcast has
    been committed, with every lower ``seq`` before it."""
    service = _runs(request)
    run_id = request.match_info["run_id"]
    await service.get(run_id)
    after = _after(request)
    batched = _batched(request)
    ws = web.WebSocketResponse(heartbeat=20)
    await ws.prepare(request)
    q = service.subscribe(run_id)
    last = after
    # ?batch=1: the events that are ready go out together, as one JSON array per message (at most
    # BATCH_EVENTS events or about BATCH_BYTES), so a watcher of a run that logs thousands of lines a
    # second handles tens of messages a second, not thousands. Without it, one event per message.
    pending: list[str] = []
    pending_bytes = 0

    async def flush() -> None:
        nonlocal pending_bytes
        if pending:
            text = "[" + ",".join(pending) + "]"
            pending.clear()
            pending_bytes = 0
            await ws.send_str(text)

    async def send(ev: dict[str, Any]) -> None:
        nonlocal pending_bytes
        if not batched:
            await ws.send_json(_event_out(ev))
            return
        text = json.dumps(_event_out(ev))
        pending.append(text)
        pending_bytes += len(text)
        if len(pending) >= BATCH_EVENTS or pending_bytes >= BATCH_BYTES:
            await flush()

    async def catch_up(upto: int | None = None) -> None:
        nonlocal last
        while upto is None or last < upto:
            page = await service.store.events(run_id, last, EVENTS_PAGE)
            for ev in page:
                if upto is not None and ev["seq"] > upto:
                    return
                await send(ev)
                last = ev["seq"]
            if len(page) < EVENTS_PAGE:
                return

    try:
        await catch_up()
        run = await service.store.get_run(run_id)
        done = run is None or run.status in TERMINAL and run.last_seq <= last

        async def reader() -> None:
            async for msg in ws:
                if msg.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
                    return
        rtask = asyncio.create_task(reader())
        while not done and not ws.closed:
            if batched and pending and not q.empty() and not q.overflowed:
                ev = q.get_nowait()  # more is ready: it joins the message being gathered
            else:
                await flush()
                woke = await q.wait_ready(rtask, 15)
                if woke == "other":  # the watcher's connection closed
                    break
                if woke == "timeout":
                    run = await service.store.get_run(run_id)
                    if run is not None and run.last_seq > last:
                        await catch_up()  # stored but not broadcast to us (e.g. dropped while we were behind)
                    if run is None or (run.status in TERMINAL and run.last_seq <= last):
                        break
                    continue
                ev = q.get_nowait()
            if q.overflowed:
                # This watcher fell too far behind and events were dropped for it: every
                # broadcast event is committed, so read the rest from the store instead.
                q.overflowed = False
                while not q.empty():
                    q.get_nowait()
                await catch_up()
                run = await service.store.get_run(run_id)
                done = run is None or run.status in TERMINAL and run.last_seq <= last
                continue
            if ev["seq"] <= last:
                continue
            if ev["seq"] > last + 1:
                await catch_up(ev["seq"])
            else:
                await send(ev)
                last = ev["seq"]
            if ev["kind"] == "status" and ev["data"].get("status") in TERMINAL:
                # Give the status row time to land before we say goodbye.
                run = await service.store.get_run(run_id)
                done = run is None or run.status in TERMINAL
        rtask.cancel()
        if not ws.closed:
            await flush()
    finally:
        service.unsubscribe(run_id, q)
        await ws.close()
    return ws


async def stop(request: web.Request) -> web.Response:
    return web.json_response(await _runs(request).stop(request.match_info["run_id"]))


async def delete(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    warning = await _runs(request).delete(run_id)
    return web.json_response({"deleted": run_id, **({"warning": warning} if warning else {})})


def _artifact_out(a: dict[str, Any]) -> dict[str, Any]:
    return {"id": a["id"], "kind": a["kind"], "name": a["name"], "backend": a["backend"], "path": a["path"],
            "relative_path": a["relative_path"], "label": a.get("label"), "size": a["size"], "sha256": a["sha256"],
            "created_at": iso(a["created_at"])}


async def artifacts(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    await _runs(request).get(run_id)
    return web.json_response([_artifact_out(a) for a in await _runs(request).store.artifacts(run_id)])


async def download_artifact(request: web.Request) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    raw = request.match_info["artifact_id"]
    try:
        aid = int(raw)
    except ValueError:
        raise CduiError("bad_request", f"artifact id {raw!r} is not a number") from None
    a = await _runs(request).store.artifact(run_id, aid)
    if a is None:
        raise NotFound("artifact", raw, hint=f"list them with GET /api/runs/{run_id}/artifacts")
    if a["backend"] == "left_on_worker":
        # The path is the worker's own: shown for the user, never opened here.
        raise CduiError("not_here", f"artifact {aid} stayed on the worker, at {a['path']} there; "
                                    f"this server does not have it",
                        hint="copy it from the worker machine", status=404)
    if a["backend"] == "s3":
        bucket = backend_of(request.app)
        if bucket is None:
            raise CduiError("not_here", f"artifact {aid} is in {a['path']}, and the S3 backend is off here",
                            hint="set CODEFYUI_S3_ENABLED=1 with the bucket's settings, or use `mc`/`aws s3`",
                            status=404)
        return await bucket.download(request, a)
    service = _runs(request)
    sha = a["sha256"]
    if isinstance(sha, str) and a["backend"] in KEPT_BACKENDS:
        # A recorded artifact is immutable: its own bytes, wherever the named path has moved on.
        fd = await asyncio.to_thread(service.kept.open_verified, sha)
        if fd is None:
            fd = await _from_named_file(service, a)
        return await _send_fd(request, fd, Path(a["path"] or a["name"]).name)
    path = _served_path(service, a)
    if path.is_dir():
        return await _zip_dir(request, path, a["name"])
    if not path.is_file() or path.is_symlink():
        raise CduiError("gone", f"artifact file {a['path']} no longer exists", status=410)
    if isinstance(a["size"], int) and path.stat().st_size != a["size"]:
        # Too big to hash when it was recorded, so not kept: its size at least tells a replaced file.
        raise await _replaced(service, a, "now holds a file of another size")
    return web.FileResponse(path, headers={"Content-Disposition": f'attachment; filename="{path.name}"'})


def _served_path(service: Any, a: dict[str, Any]) -> Path:
    """The row's path on this server, refused unless it is inside this server's data folders."""
    if not a["path"]:
        raise CduiError("not_here", f"artifact {a['id']} is not stored on this server ({a['backend']})",
                        hint="it lives on the worker or mount that produced it", status=404)
    try:
        # Whatever a row says, only files inside this server's data folders are served.
        return confine(a["path"], service.artifact_roots(), [service.config.user_data])
    except ArtifactRefused as exc:
        raise CduiError("not_here", f"artifact {a['id']} is not served: {exc.reason}",
                        hint="only files inside this server's data folders are downloadable", status=404) from None


async def _from_named_file(service: Any, a: dict[str, Any]) -> int:
    """No kept bytes (a row recorded before they were kept, or a kept file changed in place): the file
    at the row's path if it still holds the row's bytes (kept from now on), else a plain refusal."""
    path = _served_path(service, a)
    try:
        facts = await asyncio.to_thread(service.kept.keep, path, MAX_HASH_BYTES, a["sha256"])
    except ArtifactRefused as exc:
        raise await _replaced(service, a, f"cannot be used ({exc.reason})") from None
    if facts is not None and facts.sha256 == a["sha256"]:
        fd = await asyncio.to_thread(service.kept.open_verified, a["sha256"])
        if fd is None:  # the store could not take it (a full disk): the named file itself, checked again
            fd = await asyncio.to_thread(service.kept.open_matching, path, a["sha256"])
        if fd is not None:
            return int(fd)
    raise await _replaced(service, a, "no longer exists" if facts is None else "now holds other bytes")


async def _replaced(service: Any, a: dict[str, Any], what: str) -> CduiError:
    """The 410 that says which run replaced the file, when one recorded it."""
    by = await service.store.artifact_replaced_by(a["path"], a["sha256"] or "", a["id"])
    who = f" (run {by['run_id']} wrote its {by['kind']} {by['name']!r} there)" if by is not None else ""
    shown = f"sha256 {a['sha256']}" if a["sha256"] else f"{a['size']} bytes"
    return CduiError("replaced", f"artifact {a['id']} ({a['name']}) of run {a['run_id']} cannot be served: the "
                                 f"file at {a['path']} {what}{who}, and the recorded bytes ({shown}) were not kept",
                     hint="this server keeps a recorded file's bytes (data/artifacts/) until its run is deleted; "
                          "this one was recorded before that, or is too big to hash", status=410)


async def _send_fd(request: web.Request, fd: int, name: str) -> web.StreamResponse:
    """Stream an open file (a verified kept artifact) and close it: the bytes sent are the ones checked."""
    fh = os.fdopen(fd, "rb")
    try:
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        resp = web.StreamResponse(headers={"Content-Disposition": f'attachment; filename="{name}"',
                                           "Content-Type": ctype})
        resp.content_length = os.fstat(fh.fileno()).st_size
        await resp.prepare(request)
        while chunk := await asyncio.to_thread(fh.read, 1 << 20):
            await resp.write(chunk)
    finally:
        fh.close()
    await resp.write_eof()
    return resp


async def _zip_dir(request: web.Request, folder: Path, name: str) -> web.StreamResponse:
    def build() -> str:
        fd, tmp = tempfile.mkstemp(suffix=".zip")
        with open(fd, "wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as z:
            # Links are never followed out of the folder (nor into other folders);
            # FIFOs and devices are not files.
            for root, _dirs, names in os.walk(folder, followlinks=False):
                for n in sorted(names):
                    p = Path(root) / n
                    if p.is_file() and not p.is_symlink():
                        z.write(p, p.relative_to(folder))
        return tmp
    tmp = await asyncio.to_thread(build)
    resp = web.StreamResponse(headers={"Content-Type": "application/zip",
                                       "Content-Disposition": f'attachment; filename="{name}.zip"'})
    await resp.prepare(request)
    # The zip may be large and the disk slow: its reads run in a thread, as its building did.
    try:
        fh = await asyncio.to_thread(open, tmp, "rb")
        with fh:
            while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                await resp.write(chunk)
    finally:
        await asyncio.to_thread(Path(tmp).unlink, missing_ok=True)
    await resp.write_eof()
    return resp


async def nodes(request: web.Request) -> web.Response:
    reg = _runs(request).registry
    return web.json_response({"nodes": reg.catalog(), "load_errors": reg.load_errors,
                              "layer_types": layer_types()})


def _ports(raw: Any) -> list[dict[str, Any]]:
    out = []
    for p in raw if isinstance(raw, list) else []:
        if isinstance(p, dict) and isinstance(p.get("name"), str):
            out.append({"name": p["name"], "type": str(p.get("data_type") or "ANY"),
                        "description": str(p.get("description") or "")})
    return out


# What of a preset's file the canvas's preset sub-canvas draws (web/canvas/presets.js).
PRESET_DEFINITION_KEYS = ("nodes", "edges", "exposed_inputs", "exposed_outputs", "exposed_params")


def _definitions(runs: Any, lib: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each preset's inner graph, with every value a secret param of an inner node would get blanked
    (a preset saved in data/presets/ may hold an API key: the page never gets it back)."""
    own = [{**{k: p.get(k) for k in PRESET_DEFINITION_KEYS if isinstance(p.get(k), list)}, "name": name}
           for name, p in lib.items()]
    blanked, _ = split_secrets({"nodes": [], "edges": [], "presets": own}, runs.registry, None)
    return {p["name"]: {k: v for k, v in p.items() if k != "name"} for p in blanked["presets"]}


async def presets(request: web.Request) -> web.Response:
    """The installed presets as the canvas palette shows them: a node of type ``preset:NAME``
    whose ports are the preset's exposed inputs and outputs, and its inner graph."""
    runs = _runs(request)
    lib = await asyncio.to_thread(runs.preset_library)
    defs = await asyncio.to_thread(_definitions, runs, lib)
    return web.json_response({"presets": [
        {"name": name, "category": str(p.get("category") or ""), "description": str(p.get("description") or ""),
         "inputs": _ports(p.get("exposed_inputs")), "outputs": _ports(p.get("exposed_outputs")),
         "nodes": len(p.get("nodes") or []), "definition": defs[name]}
        for name, p in sorted(lib.items())]})


# Refusals that stay HTTP errors on both routes (documented so in docs/api.md): the graph is too big
# to look at, or the control plane cannot answer now. Every other refusal of submit is an answer
# about this graph on this target, so validate reports it as ``valid: false``.
VALIDATE_RAISES = frozenset({"graph_too_large"})


async def validate(request: web.Request) -> web.Response:
    body = await _read_graph_body(request)
    with_options = isinstance(body, dict) and "graph" in body
    graph = body.get("graph") if with_options else body
    options = body.get("options") if with_options else None
    try:
        # The very checks submit makes (same target, device, machine), so the two answers agree.
        admitted = await _runs(request).admit(graph, options)
    except CduiError as exc:
        if exc.code in VALIDATE_RAISES or exc.status >= 500:
            raise
        if exc.code == "invalid_graph" and isinstance(exc.details, list):
            errors = exc.details
        else:
            one: dict[str, Any] = {"node_id": None, "code": exc.code, "message": exc.message}
            if exc.hint:
                one["hint"] = exc.hint
            if exc.details is not None:
                one["details"] = exc.details
            errors = [one]
        return web.json_response({"valid": False, "errors": errors, "nodes": []})
    return web.json_response({"valid": True, "errors": [], "nodes": [p.id for p in admitted.plan.order]})


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/runs", submit)
    r.add_get("/api/runs", list_runs)
    r.add_get("/api/runs/counts", count_runs)  # before {run_id}, which would match it
    r.add_get("/api/runs/{run_id}", get_run)
    r.add_get("/api/runs/{run_id}/events", events)
    r.add_get("/ws/runs/{run_id}", stream)
    r.add_post("/api/runs/{run_id}/stop", stop)
    r.add_delete("/api/runs/{run_id}", delete)
    r.add_patch("/api/runs/{run_id}", patch_run)
    r.add_get("/api/runs/{run_id}/graph", run_graph)
    r.add_get("/api/runs/{run_id}/metrics", metrics)
    r.add_get("/api/runs/{run_id}/artifacts", artifacts)
    r.add_get("/api/runs/{run_id}/artifacts/{artifact_id}/download", download_artifact)
    r.add_get("/api/nodes", nodes)
    r.add_get("/api/presets", presets)
    r.add_post("/api/graphs/validate", validate)

"""A worker's log, read over its connection: ``GET /api/workers/{name}/log`` (``cdui logs --worker NAME``).

The control plane sends the agent a ``log_request`` and waits for its ``log_answer`` as it waits for
recorded outputs (:func:`cdui.plane.http.api_outputs._ask`, ``CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S``).
The agent answers from the newest lines it keeps in memory (:class:`cdui.core.logfile.LogRing`), never
from a file, so nothing here or there opens a path the other side names. Bounded both ways: the answer's
size when it is parsed (:data:`cdui.wire.protocol.LOG_ANSWER_CHARS`), and how often one worker is asked
(:data:`MIN_INTERVAL_S`), so a client polling in a loop cannot keep a worker's connection busy.
"""
from __future__ import annotations

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.plane.appkeys import CLOCK
from cdui.plane.http.api_outputs import _ask
from cdui.plane.workers import WORKERS
from cdui.wire import protocol

MIN_INTERVAL_S = 0.5  # one worker's log is asked for at most this often (a --follow asks every second)
ASKED: web.AppKey[dict[str, float]] = web.AppKey("worker_log_asked")


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise CduiError("bad_query", f"{name}={raw[:40]!r} is not valid: expected an integer from {low} to {high}")
    return value


async def worker_log(request: web.Request) -> web.Response:
    app = request.app
    name = request.match_info["name"]
    after = _query_int(request, "after", 0, 0, 2 ** 53)
    lines = _query_int(request, "lines", 50, 1, protocol.LOG_MAX_LINES)
    if name not in app[WORKERS].conns and not await app[WORKERS].store.workers.exists(name):
        raise NotFound("worker", name, hint="list workers with GET /api/workers")
    now = app[CLOCK].monotonic()
    asked = app[ASKED]
    if now - asked.get(name, -MIN_INTERVAL_S) < MIN_INTERVAL_S:
        raise CduiError("too_many_requests", f"worker {name}'s log was asked for less than {MIN_INTERVAL_S:g} s ago",
                        hint=f"ask at most every {MIN_INTERVAL_S:g} s", status=429)
    asked[name] = now
    answer = await _ask(app, name, lambda rid: protocol.LogRequest(rid, after, lines), "its log")
    if not isinstance(answer, protocol.LogAnswer):
        raise CduiError("worker_bad_answer", f"worker {name} answered a log request with another kind of message",
                        status=502)
    return web.json_response({"worker": name, "lines": answer.lines, "first": answer.first, "last": answer.last})


def setup(app: web.Application) -> None:
    app[ASKED] = {}
    app.router.add_get("/api/workers/{name}/log", worker_log)

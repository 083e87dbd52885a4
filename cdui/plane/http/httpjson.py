"""The one reader of JSON request bodies.

Every JSON route reads its body through :func:`read_json` with a limit that
fits the route (a client may be hostile, and an unauthenticated one may try
to make the server buffer gigabytes):

- ``PUBLIC_LIMIT`` for routes anyone on the network reaches
  (``/api/workers/enroll``);
- ``DEFAULT_LIMIT`` for other authenticated JSON routes;
- ``CODEFYUI_MAX_GRAPH_BYTES`` for the graph routes (``POST /api/runs``,
  ``POST /api/graphs/validate``).

A declared ``Content-Length`` over the limit is refused before a byte of the
body is read; a chunked body is read only up to the limit and then refused.
Both answer ``413 too_large`` naming the limit (and the setting, where there
is one). ``NaN`` and ``Infinity``, which Python's json accepts, are refused
like any other invalid JSON, as is nesting too deep to parse. Only the two
upload routes stream large bodies (they read multipart parts themselves).

The one error shape on the way out is here too: :func:`error_middleware` turns a
:class:`~cdui.core.errors.CduiError` (or an aiohttp HTTP error, or a bug) into
``{"error": {"code", "message", "hint"}}``, for the main app and each SSH tunnel's app.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.core.units import size_text
from cdui.wire.protocol import loads  # the same strict JSON as the worker protocol

# The server's logger, where an unhandled error was always logged (cdui.log names it).
log = logging.getLogger("cdui.plane.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC_LIMIT = 16 * 1024
DEFAULT_LIMIT = 64 * 1024
# Bodies above this are parsed in a thread so a big graph does not stall the event loop.
_THREAD_PARSE = 256 * 1024
_MISSING = object()


def too_large(limit: int, setting: str | None, got: int | None = None) -> CduiError:
    size = f"of {size_text(got)} " if got is not None else ""
    where = f" ({setting})" if setting else ""
    hint = (f"send a smaller body, or raise {setting} on the server" if setting
            else "this route takes small JSON bodies only; files go to the upload routes")
    return CduiError("too_large", f"the request body {size}is over this route's limit of {size_text(limit)}{where}",
                     hint=hint, status=413)


async def read_json(request: web.Request, limit: int, setting: str | None = None,
                    default: Any = _MISSING) -> Any:
    """The parsed JSON body, read at most ``limit`` bytes far.

    ``default`` is returned for an absent body where the route allows one."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(limit, setting, declared)
    if not request.body_exists:
        if default is not _MISSING:
            return default
        raise CduiError("bad_json", "the request has no body; this route needs a JSON object",
                        hint="send a JSON object with Content-Type: application/json")
    buf = bytearray()
    while chunk := await request.content.read(64 * 1024):
        buf += chunk
        if len(buf) > limit:
            raise too_large(limit, setting)
    if not buf and default is not _MISSING:
        return default
    try:
        if len(buf) > _THREAD_PARSE:
            return await asyncio.to_thread(loads, bytes(buf))
        return loads(bytes(buf))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CduiError("bad_json", f"the request body is not valid JSON: {exc}",
                        hint="send a JSON object with Content-Type: application/json") from None


async def read_object(request: web.Request, limit: int, setting: str | None = None) -> dict[str, Any]:
    """A JSON object body (an absent body counts as ``{}``)."""
    body = await read_json(request, limit, setting, default={})
    if not isinstance(body, dict):
        raise CduiError("bad_request", f"the request body must be a JSON object, got {type(body).__name__}",
                        hint='send e.g. {"ttl_s": 3600}')
    return body


def query_limit(request: web.Request, default: int, maximum: int) -> int:
    """The ``limit`` query parameter, an integer from 1 to ``maximum`` (``default`` when absent); else 400
    ``bad_query`` naming the value."""
    raw = request.query.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise CduiError("bad_query", f"limit={raw[:50]!r} is not an integer from 1 to {maximum}",
                        hint=f"e.g. ?limit={min(50, maximum)}")
    return int(raw)


def error_response(err: CduiError) -> web.Response:
    return web.json_response(err.to_json(), status=err.status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except CduiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status, "http_error")
        msg = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
        if exc.status == 404:
            msg = f"no such path: {request.method} {request.path}"
        if exc.status == 405:
            msg = f"{request.method} is not allowed on {request.path}"
        return web.json_response(CduiError(code, msg, status=exc.status).to_json(), status=exc.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return web.json_response(CduiError("internal", "internal server error; nothing was changed by this request",
                                           "see the server log (cdui.log in the user data dir)", 500).to_json(),
                                 status=500)

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
"""
from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.wire.protocol import loads  # the same strict JSON as the worker protocol

PUBLIC_LIMIT = 16 * 1024
DEFAULT_LIMIT = 64 * 1024
# Bodies above this are parsed in a thread so a big graph does not stall the event loop.
_THREAD_PARSE = 256 * 1024
_MISSING = object()


def too_large(limit: int, setting: str | None, got: int | None = None) -> CduiError:
    size = f"of {got} bytes " if got is not None else ""
    where = f" ({setting})" if setting else ""
    hint = (f"send a smaller body, or raise {setting} on the server" if setting
            else "this route takes small JSON bodies only; files go to the upload routes")
    return CduiError("too_large", f"the request body {size}is over this route's limit of {limit} bytes{where}",
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

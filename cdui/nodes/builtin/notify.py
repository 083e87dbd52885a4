"""Webhook: tell another service that a run got here, with an API key.

The key is a ``secret`` param: the UI masks it, saved graphs drop it, and this
node sends it only in the request header (``Authorization: Bearer <key>`` by
default, or any header and scheme, e.g. ``X-API-Key`` with no scheme). The key
never appears in logs, errors, outputs or the payload, and redirects are not
followed (they would carry the header to another host). A target on this
machine's own loopback or link-local addresses is refused unless its port is
allowed (``CODEFYUI_NODE_NET_ALLOW_LOCAL``, see :mod:`._netguard`), whatever
``fail_on_error`` says: a refusal is the machine's rule, not a network failure.

The body is JSON: ``{"run_id", "node_id", "message", "value"}``, where
``value`` is a JSON-safe summary of the input (tensors as shape/dtype, plus
their values when small). Standard library only (urllib).
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cdui.nodes.base import ANY, SCALAR, STRING, Node, Param, Port
from cdui.nodes.builtin import _netguard
from cdui.nodes.builtin._util import as_bool, summarize

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

MAX_RESPONSE_BYTES = 64 * 1024


def build_request(url: str, payload: dict[str, Any], api_key: str, header: str, scheme: str,
                  method: str) -> urllib.request.Request:
    """The request to send (pure: easy to check without a server)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"Webhook: url must be an http(s) URL, got {url!r}")
    body = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json", "User-Agent": "cdui-webhook"}
    if api_key:
        name = header.strip() or "Authorization"
        headers[name] = f"{scheme.strip()} {api_key}" if scheme.strip() else api_key
    return urllib.request.Request(url, data=body, headers=headers, method=method)


class WebhookNode(Node):
    NODE_NAME = "Webhook"
    CACHEABLE = False  # reads the network
    CATEGORY = "Notify"
    DESCRIPTION = "POST a JSON notification (with an optional API key header) to a URL"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("value", ANY, "Value to include in the notification", optional=True)]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [
            Port("status", SCALAR, "HTTP status code (0 when the request failed)"),
            Port("response", STRING, "Response body (first 64 KiB)"),
            Port("value", ANY, "Pass-through of the input value"),
        ]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [
            Param("url", "string", "", "Webhook URL (http or https)", required=True),
            Param("message", "string", "", "Text sent as the 'message' field"),
            Param("api_key", "secret", "", "API key; sent only in the header below, never logged"),
            Param("auth_header", "string", "Authorization", "Header that carries the key, e.g. X-API-Key"),
            Param("auth_scheme", "string", "Bearer", "Prefix before the key (empty: the bare key)"),
            Param("method", "select", "POST", "HTTP method", options=["POST", "PUT"]),
            Param("timeout", "float", 10.0, "Seconds to wait for the server", min_value=0.1),
            Param("fail_on_error", "bool", True,
                  "Fail the node on a network error or non-2xx status (off: warn and go on)"),
        ]

    def execute(self, inputs: dict[str, Any], params: dict[str, Any],
                ctx: RunContext) -> dict[str, Any]:
        url = str(params.get("url") or "").strip()
        if not url:
            raise ValueError("Webhook: the `url` param is required")
        value = inputs.get("value")
        payload = {"run_id": ctx.run_id, "node_id": ctx.node_id,
                   "message": str(params.get("message") or ""), "value": summarize(value)}
        api_key = str(params.get("api_key") or "")
        request = build_request(url, payload, api_key, str(params.get("auth_header") or ""),
                                str(params.get("auth_scheme") or ""),
                                str(params.get("method") or "POST").upper())
        safe_url = _redact(url)
        _netguard.check_url("Webhook", url)
        status, body, problem = 0, "", None
        try:
            with _netguard.opener("Webhook").open(request, timeout=float(params.get("timeout") or 10.0)) as resp:
                status = int(resp.status)
                body = resp.read(MAX_RESPONSE_BYTES).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status = int(exc.code)
            body = exc.read(MAX_RESPONSE_BYTES).decode("utf-8", "replace") if exc.fp else ""
            problem = f"{safe_url} answered HTTP {status}"
        except _netguard.TargetRefused:
            raise
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            problem = f"could not reach {safe_url}: {type(reason).__name__}: {reason}"
        if problem is None and not 200 <= status < 300:
            problem = f"{safe_url} answered HTTP {status}"
        if problem:
            # The key is only ever in the request headers; never in these texts.
            problem = problem.replace(api_key, "***") if api_key else problem
            if as_bool(params.get("fail_on_error"), True):
                raise RuntimeError(f"Webhook: {problem}")
            ctx.warning("webhook_failed", problem)
        else:
            ctx.log(f"Webhook: {request.get_method()} {safe_url} -> HTTP {status}")
        return {"status": status, "response": body, "value": value}


def _redact(url: str) -> str:
    """The URL without user:password and query string (which may hold tokens)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"

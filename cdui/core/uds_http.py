"""A JSON POST over a Unix socket (stdlib): how an SSH worker's agent enrolls through its tunnel.

The URL's host is only the ``Host`` header (the tunnel listener answers any);
the connection goes to the socket. Errors come back as the same
:class:`~cdui.core.errors.CduiError` that :class:`cdui.cli.client.Client` raises.
"""
from __future__ import annotations

import http.client
import json
import socket
from typing import Any

from cdui.core.errors import CduiError

MAX_ANSWER = 64 * 1024


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, host: str, timeout: float) -> None:
        super().__init__(host, timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


def post_json(uds: str, host: str, path: str, body: dict[str, Any], timeout: float = 30.0) -> Any:
    conn = _UnixConnection(uds, host, timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, payload = resp.status, resp.read(MAX_ANSWER)
    except (OSError, http.client.HTTPException) as exc:
        raise CduiError("unreachable", f"cannot reach the control plane through {uds}: {exc}",
                        hint="the SSH tunnel is not up (yet); the control plane restarts it") from None
    finally:
        conn.close()
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = None
    if status >= 400:
        err = (parsed or {}).get("error", {}) if isinstance(parsed, dict) else {}
        raise CduiError(err.get("code", "http_error"), err.get("message") or f"HTTP {status} from {path}",
                        err.get("hint"), status=status)
    return parsed

"""A small stdlib HTTP client for the CLI: finds the server, carries the token."""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cdui.core.errors import CduiError
from cdui.core.trust import Trust, untrusted_error


class ApiError(CduiError):
    pass


def server_info(user_data: Path) -> dict[str, Any] | None:
    try:
        return json.loads((user_data / "server.json").read_text())
    except (OSError, ValueError):
        return None


class Client:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0,
                 trust: Trust | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # How an https:// server's certificate is checked: the system's CAs unless a pin is given.
        self.trust = trust or Trust()

    @classmethod
    def for_user_data(cls, user_data: Path, control: str | None = None) -> Client:
        info = server_info(user_data)
        url = control or (info or {}).get("url")
        if not url:
            raise CduiError("no_server", f"no running cdui server is recorded in {user_data}",
                            hint="start one with `cdui start`, or give --control URL")
        token = None
        try:
            token = (user_data / "session-token").read_text().strip()
        except OSError:
            pass
        return cls(url, token)

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float | None = None) -> tuple[int, Any]:
        if not path.startswith("/"):
            path = "/" + path
        data = raw
        hdrs = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if self.token:
            hdrs["X-CodefyUI-Token"] = self.token
        req = urllib.request.Request(self.base + path, data=data, method=method.upper(), headers=hdrs)
        try:
            with self.trust.opener().open(req, timeout=timeout or self.timeout) as resp:
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                # Not "unreachable": retrying cannot make an untrusted certificate trusted.
                raise untrusted_error(self.base, reason) from None
            raise CduiError("unreachable", f"cannot reach the cdui server at {self.base}: {reason}",
                            hint="is it running? `cdui start` starts it; `cdui status` shows it") from None
        try:
            parsed = json.loads(payload) if payload else None
        except ValueError:
            parsed = payload.decode(errors="replace")
        return status, parsed

    def download(self, path: str, out: Any, progress: Any = None, chunk: int = 1 << 20) -> tuple[int, int | None]:
        """GET ``path`` into the binary file ``out`` piece by piece (never all in memory); ``progress(done,
        total)`` after each piece. (bytes written, the declared length or None); an error answer raises
        what :meth:`call` raises."""
        hdrs = {"X-CodefyUI-Token": self.token} if self.token else {}
        req = urllib.request.Request(self.base + path, method="GET", headers=hdrs)
        try:
            resp = self.trust.opener().open(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                parsed = json.loads(payload) if payload else None
            except ValueError:
                parsed = payload.decode(errors="replace")
            raise api_error(exc.code, parsed, f"GET {path}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise CduiError("unreachable", f"cannot reach the cdui server at {self.base}: "
                                           f"{getattr(exc, 'reason', exc)}",
                            hint="is it running? `cdui start` starts it; `cdui status` shows it") from None
        with resp:
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            done = 0
            while True:
                piece = resp.read(chunk)
                if not piece:
                    break
                out.write(piece)
                done += len(piece)
                if progress is not None:
                    progress(done, total)
        return done, total

    def call(self, method: str, path: str, body: Any = None) -> Any:
        status, parsed = self.request(method, path, body)
        if status >= 400:
            raise api_error(status, parsed, f"{method.upper()} {path}")
        return parsed


def _one_line(text: Any, limit: int = 2000) -> str:
    return " ".join(str(text).split())[:limit]


def api_error(status: int, parsed: Any, what: str) -> ApiError:
    """An error answer as one error, whatever its shape: ours (``{"error": {code, message, hint, details}}``),
    a bare ``{"error": "text"}`` or ``{"message": ...}``, a proxy's HTML page, or nothing at all. Its message and
    hint are single lines, so the CLI prints one line however the server or a proxy wrote them."""
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(parsed, dict) and not isinstance(err, dict):
        err = {"message": err if isinstance(err, str) else parsed.get("message")}
    if not isinstance(err, dict):
        err = {}
    code = err["code"] if isinstance(err.get("code"), str) else "http_error"
    message = _one_line(err["message"]) if isinstance(err.get("message"), str) and err["message"].strip() else ""
    if not message:
        page = f": {_one_line(parsed, 200)}" if isinstance(parsed, str) and parsed.strip() else ""
        message = f"{what} answered HTTP {status}{page}"
    hint = _one_line(err["hint"]) if isinstance(err.get("hint"), str) and err["hint"].strip() else None
    return ApiError(code, message, hint, status=status, details=err.get("details"))

"""One error type for every surface.

An error says what happened (``message``), carries the offending value inside
that message, and, where there is one, what to do about it (``hint``). HTTP
renders it as ``{"error": {"code", "message", "hint"}}``; the CLI renders it
as one ``cdui: error: ...`` line.
"""
from __future__ import annotations

from typing import Any


class CduiError(Exception):
    """A user-facing error with a stable ``code`` and an HTTP status."""

    def __init__(self, code: str, message: str, hint: str | None = None,
                 status: int = 400, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.status = status
        self.details = details

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        if self.details is not None:
            body["details"] = self.details
        return {"error": body}

    def __str__(self) -> str:
        return self.message + (f" ({self.hint})" if self.hint else "")


class NotFound(CduiError):
    def __init__(self, what: str, value: str, hint: str | None = None) -> None:
        super().__init__("not_found", f"{what} {value!r} does not exist", hint, status=404)


class PathRefused(CduiError, ValueError):
    """A path from outside refused by the safe-join rules. Also a ``ValueError``: a node that
    refuses a path param raises what CodefyUI's nodes raise for it."""

    def __init__(self, value: str, reason: str, hint: str | None = None) -> None:
        super().__init__("path_refused", f"path {value!r} refused: {reason}",
                         hint or "use a relative path inside the folder, without '..'", status=400)
        self.value, self.reason = value, reason


def human_size(n: float) -> str:
    """A byte count for a message: ``512 B``, ``1.50 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"

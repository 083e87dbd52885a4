"""The size bound of one run event (``CODEFYUI_RUN_EVENT_MAX_BYTES``).

A node can log or report anything (a 7 MiB log message, a huge metrics list); stored whole, one
event would bloat the database, every event page and every WebSocket frame. An event whose data
encodes (JSON, UTF-8) to more than the bound is never kept whole:

- a ``graph_output`` event becomes the output's error ``output_too_large`` (name and node kept),
  so a graph called as an API function answers a clear error instead of a cut value;
- any other event keeps its keys and small values; each long string is cut and ends with a
  marker saying so, each long list keeps its first items and the marker, and ``data.truncated``
  says ``{"original_bytes", "limit"}``. If that is still too large, the data is replaced by the
  marker alone (``message`` and ``truncated``).

The bound is applied where an event is born (the run's launcher, :class:`cdui.run.runner.RunHandle`,
on the control plane or an agent, with the setting of that machine) and again where it is stored
(:meth:`cdui.plane.store.Store.append_events`, with the control plane's setting that
:meth:`cdui.plane.runs.RunService.record_events` passes), since a worker may be hostile. The result
depends only on the event and the bound, so a replayed event is cut the same.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cdui.core.config import SETTINGS_BY_NAME

SETTING = "CODEFYUI_RUN_EVENT_MAX_BYTES"
GRAPH_OUTPUT = "graph_output"
# Room left for the ``truncated`` note and the event's own envelope.
_SLACK = 256


def limit_from_env(env: Mapping[str, str] | None = None) -> int:
    """This machine's bound, as the settings table parses it (the default when unset or invalid:
    a process that got this far already had its settings checked at start)."""
    env = os.environ if env is None else env
    s = SETTINGS_BY_NAME[SETTING]
    try:
        return int(s.parse(env[SETTING])) if env.get(SETTING, "").strip() else int(s.default)
    except (ValueError, TypeError):
        return int(s.default)


def encoded_size(data: Any) -> int:
    return len(json.dumps(data, default=str, ensure_ascii=False).encode("utf-8", "replace"))


def marker(size: int, limit: int) -> str:
    return (f"…[cut by cdui: this event was {size:,} bytes, more than {SETTING}={limit:,}; "
            f"write large data to a file instead]")


def _cut(obj: Any, cap: int, note: str) -> Any:
    if isinstance(obj, str):
        return obj[:cap] + note if len(obj) > cap else obj
    if isinstance(obj, dict):
        return {k: _cut(v, cap, note) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = max(1, cap // 64)
        kept = [_cut(v, cap, note) for v in list(obj)[:items]]
        return kept + [note] if len(obj) > items else kept
    return obj


def bound_event(kind: str, data: Any, limit: int) -> Any:
    """``data`` itself when it fits in ``limit`` bytes (or ``limit`` is 0), else its bounded form."""
    if limit <= 0:
        return data
    size = encoded_size(data)
    if size <= limit:
        return data
    note = marker(size, limit)
    info = {"original_bytes": size, "limit": limit}
    if kind == GRAPH_OUTPUT and isinstance(data, dict):
        name, node = data.get("name"), data.get("node_id")
        return {"name": str(name)[:200] if name is not None else None, "node_id": str(node)[:200] if node else None,
                "error": {"code": "output_too_large", "message": f"the output is {size:,} bytes as JSON, more than "
                          f"{SETTING}={limit:,}; return a smaller value or save it to a file and return its path",
                          "details": info}}
    cap = max(64, limit // 2)
    while cap >= 64:
        out = _cut(data, cap, note)
        if isinstance(out, dict):
            out = {**out, "truncated": info}
        if encoded_size(out) + _SLACK <= limit:
            return out
        cap //= 4
    return {"message": note, "truncated": info}

"""One event of a run as its source recorded it, before the store gives it the run's ``seq``.

A source (the run process's recorder on this machine, an agent's recorder, the control plane itself)
numbers its own events ``src_seq`` 1, 2, 3, ...; the store accepts each source's next number only (see
:mod:`cdui.plane.store`). Events born on the control plane carry no ``src_seq``: the store numbers them in
the transaction that stores them. The recorders and the ``events`` message of ``/ws/worker`` keep their
JSON objects (``{src_seq, kind, data, at}``); the control plane reads each into an :class:`Event` once,
where it arrives, and :meth:`Event.to_wire` gives the store that same object back.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    at: float | None = None         # when it happened at its source (None: when it is stored)
    src_seq: int | None = None      # its number at its source (None: born here, numbered by the store)

    @classmethod
    def from_wire(cls, e: Mapping[str, Any]) -> Event:
        """From a recorder's object: a local run's, or an agent's (already checked by
        :func:`cdui.wire.protocol.parse_agent_message`)."""
        src_seq = e.get("src_seq")
        return cls(str(e["kind"]), e.get("data") or {}, e.get("at"), None if src_seq is None else int(src_seq))

    def to_wire(self) -> dict[str, Any]:
        """The object the recorders write, which the store takes."""
        out: dict[str, Any] = {"kind": self.kind, "data": self.data, "at": self.at}
        if self.src_seq is not None:
            out["src_seq"] = self.src_seq
        return out

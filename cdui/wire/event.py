"""One event of a run as its source recorded it, before the store gives it the run's ``seq``.

A source (the run process's recorder on this machine, an agent's recorder, the control plane itself)
numbers its own events ``src_seq`` 1, 2, 3, ...; the store accepts each source's next number only (see
:mod:`cdui.plane.store`). Events born on the control plane carry no ``src_seq``: the store numbers them in
the transaction that stores them. The recorders and the ``events`` message of ``/ws/worker`` keep their
JSON objects (``{src_seq, kind, data, at}``); the control plane reads each into an :class:`Event` once,
where it arrives, and :meth:`Event.to_wire` gives the store that same object back.

:func:`event_json` is the one JSON encoder of events and their data on the hot paths (the agent's
spool and messages, the store's rows): a run logging flat out makes hundreds of thousands a second.
"""
from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

# The C encoder json.dumps itself uses (None only where json has no C speedups).
c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
encode_basestring_ascii = json.encoder.encode_basestring_ascii


def _encoder(allow_nan: bool) -> Callable[[Any], str]:
    """A JSON encoder of dicts as ``json.dumps(obj, default=str, allow_nan=...)`` writes them, made once.

    ``json.dumps`` and ``JSONEncoder.encode`` build a new C encoder at every call, which costs more
    than encoding a small event does. Circular structures are not looked for: events are made of
    decoded JSON and of plain dicts built for them."""
    if c_make_encoder is None:  # pragma: no cover
        return json.JSONEncoder(default=str, allow_nan=allow_nan).encode
    enc = c_make_encoder(None, str, encode_basestring_ascii, None, ": ", ", ", False, False, allow_nan)

    def encode(obj: Any) -> str:
        return "".join(enc(obj, 0))
    return encode


# JSON of an event or of its data: NaN and infinity written as Python's json writes them
# (what the store has always kept), and ...
event_json = _encoder(allow_nan=True)
# ... refused (ValueError): what goes on the wire, which is strict JSON.
event_json_strict = _encoder(allow_nan=False)

_new = tuple.__new__


class Event(NamedTuple):
    kind: str
    data: dict[str, Any]
    at: float | None = None         # when it happened at its source (None: when it is stored)
    src_seq: int | None = None      # its number at its source (None: born here, numbered by the store)

    @classmethod
    def from_wire(cls, e: Mapping[str, Any]) -> Event:
        """From a recorder's object: a local run's, or an agent's (already checked by
        :func:`cdui.wire.protocol.parse_agent_message`)."""
        src_seq = e.get("src_seq")
        # A tuple made directly: a flood reads hundreds of thousands a second.
        return _new(cls, (str(e["kind"]), e.get("data") or {}, e.get("at"),
                          None if src_seq is None else int(src_seq)))

    def to_wire(self) -> dict[str, Any]:
        """The object the recorders write, which the store takes."""
        out: dict[str, Any] = {"kind": self.kind, "data": self.data, "at": self.at}
        if self.src_seq is not None:
            out["src_seq"] = self.src_seq
        return out

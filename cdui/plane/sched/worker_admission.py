"""Whether a worker connection on ``/ws/worker`` is let in: one pure decision.

Everything it depends on is read by the caller first (the credential's
``workers`` row, its ``old_credentials`` row, the first message's text, the
address of a connection already open under the same name), so the decision
itself is a table: :func:`decide` returns :class:`Accept` or :class:`Refuse`,
and ``tests/test_worker_refusal.py`` checks every row of it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdui.wire import protocol


@dataclass(frozen=True)
class NoHello:
    """The first message never came as text (the reason says what came instead)."""

    reason: str


@dataclass(frozen=True)
class Accept:
    name: str
    hello: protocol.Hello
    # The open connection under this name is this same agent's, from before a drop the control
    # plane has not noticed yet (the same agent id): it is closed and this one takes its place.
    replaces: bool = False


@dataclass(frozen=True)
class Refuse:
    code: str       # the ``refused`` message's code, for the agent
    message: str    # what the agent is told
    # What the operator sees in the list of refused connections (GET /api/workers);
    # None: not listed (an unknown credential names no worker, so it would only be noise).
    listed_name: str | None = None
    listed_reason: str | None = None
    # Set for a revoked credential: its refusals are listed once an hour, not at every retry.
    listed_once_per: str | None = None
    # A version refusal of a worker whose owner let it follow `cdui update` (the Workers panel).
    update: bool = False


Decision = Accept | Refuse


def decide(row: Mapping[str, Any] | None, old: Mapping[str, Any] | None, first: str | NoHello | None,
           existing_address: str | None, server_version: str, credential_hash: str = "",
           existing_agent_id: str | None = None) -> Decision:
    """``row``: the enrolled worker whose credential was presented (None: none is);
    ``old``: that credential's row among removed/superseded ones; ``first``: the first
    message (None: not read, which only happens when ``row`` is None);
    ``existing_address``: where an open connection of the same worker comes from, and
    ``existing_agent_id`` the agent id its hello gave."""
    if row is None:
        if old is not None:
            what = "was removed" if old["reason"] == "removed" else "was superseded by a reissue"
            return Refuse("revoked", f"the credential of worker {old['worker']} {what}; "
                                     f"this agent can no longer connect",
                          old["worker"], f"revoked credential ({what})", credential_hash or None)
        return Refuse("unknown_credential", "this control plane does not know the agent's credential")
    name = str(row["name"])
    if first is None or isinstance(first, NoHello):
        return Refuse("bad_hello", first.reason if first is not None else "no hello")
    version = protocol.peek_version(first)
    if version != server_version:
        msg = f"version mismatch: worker {version or 'unknown'}, control plane {server_version}"
        follows = bool(row.get("auto_update"))
        # What to do about it, for the agent's one refusal line (the list of refused connections keeps the short
        # form). After the versions, past a ';': the SSH supervisor reads the two versions up to it.
        told = msg + ("; the owner lets this worker follow the update: an agent that allows it "
                      "(CODEFYUI_AGENT_AUTO_UPDATE not 0) installs it and restarts" if follows else
                      f"; to follow, copy the control plane's update bundle here and run `cdui update --from BUNDLE`, "
                      f"or let the agent update itself: CODEFYUI_AGENT_AUTO_UPDATE=1 on this machine, or "
                      f"\"follow updates\" for worker {name} in the Workers panel (docs/updating.md)")
        return Refuse("version_mismatch", told, name, msg, update=follows)
    try:
        hello = protocol.parse_agent_message(first)
        if not isinstance(hello, protocol.Hello):
            raise protocol.ProtocolError("the first message must be a hello")
    except protocol.ProtocolError as exc:
        return Refuse("bad_hello", str(exc), name, f"bad hello: {exc}")
    if hello.name != name:
        return Refuse("credential_mismatch", f"this credential belongs to worker {name}, not {hello.name}",
                      hello.name, f"its credential belongs to worker {name}")
    if existing_address is not None:
        if hello.agent_id is not None and hello.agent_id == existing_agent_id:
            # The same agent process: its old connection is dead on its side. Refusing it would
            # leave it no way back until the control plane's heartbeat watchdog gave up on the
            # old one, and a one-shot agent takes a refusal as final (its run would be lost).
            return Accept(name, hello, replaces=True)
        return Refuse("name_in_use", f"worker {name} is already connected from {existing_address}; "
                                     f"stop the other agent first",
                      name, f"worker {name} is already connected from {existing_address}")
    return Accept(name, hello)

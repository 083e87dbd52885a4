"""The connect decision of /ws/worker as a table: (credential row, old-credential
row, first message, open connection) -> Accept or Refuse(code, message, listing)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from cdui.plane.sched.worker_admission import Accept, NoHello, Refuse, decide
from cdui.wire import protocol

V = "9.9.9"
ROW = {"name": "gpu1"}


def hello(name: str = "gpu1", version: str = V) -> str:
    return json.dumps(protocol.hello(version, name, ["cpu"], {}, "m1", []))


TO_FOLLOW = ("; to follow, copy the control plane's update bundle here and run `cdui update --from BUNDLE`, or let "
             "the agent update itself: CODEFYUI_AGENT_AUTO_UPDATE=1 on this machine, or \"follow updates\" for worker "
             "gpu1 in the Workers panel (docs/updating.md)")

CASES: list[tuple[str, Any, Any, Any, Any, Refuse]] = [
    ("unknown credential", None, None, None, None,
     Refuse("unknown_credential", "this control plane does not know the agent's credential")),
    ("removed credential", None, {"worker": "gpu1", "reason": "removed"}, None, None,
     Refuse("revoked", "the credential of worker gpu1 was removed; this agent can no longer connect",
            "gpu1", "revoked credential (was removed)", "h1")),
    ("superseded credential", None, {"worker": "gpu1", "reason": "superseded"}, None, None,
     Refuse("revoked", "the credential of worker gpu1 was superseded by a reissue; this agent can no longer "
                       "connect", "gpu1", "revoked credential (was superseded by a reissue)", "h1")),
    ("no hello in time", ROW, None, NoHello("no hello within 30 s"), None,
     Refuse("bad_hello", "no hello within 30 s")),
    # The agent is told what to do about it; the list of refused connections keeps the short form.
    ("older agent", ROW, None, hello(version="1.0.0"), None,
     Refuse("version_mismatch", f"version mismatch: worker 1.0.0, control plane {V}{TO_FOLLOW}", "gpu1",
            f"version mismatch: worker 1.0.0, control plane {V}")),
    ("no version at all", ROW, None, "{}", None,
     Refuse("version_mismatch", f"version mismatch: worker unknown, control plane {V}{TO_FOLLOW}", "gpu1",
            f"version mismatch: worker unknown, control plane {V}")),
    ("older agent of a worker whose owner lets it follow updates", {**ROW, "auto_update": 1}, None,
     hello(version="1.0.0"), None,
     Refuse("version_mismatch", f"version mismatch: worker 1.0.0, control plane {V}; the owner lets this worker "
                                "follow the update: an agent that allows it (CODEFYUI_AGENT_AUTO_UPDATE not 0) "
                                "installs it and restarts", "gpu1",
            f"version mismatch: worker 1.0.0, control plane {V}", update=True)),
    ("first message not a hello", ROW, None, json.dumps({"version": V, "type": "heartbeat", "runs": []}), None,
     Refuse("bad_hello", "the first message must be a hello", "gpu1", "bad hello: the first message must be a hello")),
    ("another worker's credential", ROW, None, hello(name="gpu2"), None,
     Refuse("credential_mismatch", "this credential belongs to worker gpu1, not gpu2", "gpu2",
            "its credential belongs to worker gpu1")),
    ("name already connected", ROW, None, hello(), "10.0.0.7",
     Refuse("name_in_use", "worker gpu1 is already connected from 10.0.0.7; stop the other agent first",
            "gpu1", "worker gpu1 is already connected from 10.0.0.7")),
]


@pytest.mark.parametrize("case,row,old,first,existing,expected", CASES, ids=[c[0] for c in CASES])
def test_refusal_table(case: str, row: Any, old: Any, first: Any, existing: Any, expected: Refuse) -> None:
    assert decide(row, old, first, existing, V, "h1") == expected


def test_a_good_hello_is_accepted() -> None:
    decision = decide(ROW, None, hello(), None, V, "h1")
    assert isinstance(decision, Accept)
    assert (decision.name, decision.hello.name, decision.hello.devices) == ("gpu1", "gpu1", ["cpu"])


def _from_agent(agent_id: str | None) -> str:
    obj = protocol.hello(V, "gpu1", ["cpu"], {}, "m1", [])
    obj["agent_id"] = agent_id
    return json.dumps(obj)


# (the new hello's agent id, the open connection's) -> replaced (True) or refused name_in_use (False)
SAME_NAME = [
    ("a1", "a1", True),   # the same agent, back before its drop was noticed
    ("a1", "b2", False),  # another agent
    (None, None, False),  # agents that give no id are never taken for one another
    ("a1", None, False),
    (None, "a1", False),
]


@pytest.mark.parametrize("new,open_one,replaced", SAME_NAME)
def test_a_connected_name_is_replaced_only_by_its_own_agent(new: str | None, open_one: str | None,
                                                            replaced: bool) -> None:
    decision = decide(ROW, None, _from_agent(new), "10.0.0.7", V, "h1", open_one)
    if replaced:
        assert decision == Accept("gpu1", protocol.parse_agent_message(_from_agent(new)), replaces=True)
    else:
        assert isinstance(decision, Refuse) and decision.code == "name_in_use", decision

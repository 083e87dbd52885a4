"""What the agent does when a connection fails, as a table: (failure, one-shot state, tunnel)
-> Stop(exit code, stderr line) or Retry(log line). The control plane's side of the same
refusals is tests/test_worker_refusal.py."""
from __future__ import annotations

import logging

import pytest

from cdui.agent.connect_policy import (
    PinMismatch,
    Refusal,
    Retry,
    Stop,
    Unreachable,
    Untrusted,
    advice,
    decide,
    follows_update,
    reset_backoff,
    tunnel_gone,
)
from cdui.core.exit_codes import FAILED, REFUSED

VERSION = Refusal("version_mismatch", "version mismatch: worker 1.0.0, control plane 1.1.0")
REVOKED = Refusal("revoked", "the credential of worker gpu1 was removed; this agent can no longer connect")
MISMATCH = Refusal("credential_mismatch", "this credential belongs to worker gpu1, not gpu2")
UNKNOWN = Refusal("unknown_credential", "this control plane does not know the agent's credential")
NAME = Refusal("name_in_use", "worker gpu1 is already connected from 10.0.0.7; stop the other agent first")
BAD_HELLO = Refusal("bad_hello", "no hello within 30 s")
BAD_RUN = Refusal("bad_run_id", "--run-id r1: this agent cannot take that run")
PIN = PinMismatch("the proxy at https://cp:8443 presented sha256:AA, not the pinned sha256:BB")
UNTRUSTED = Untrusted("https://cp:8443 presented a certificate this machine does not trust")
DOWN = Unreachable("http://cp:8000", "Cannot connect to host cp:8000")


def refused(r: Refusal, code: int = REFUSED) -> Stop:
    return Stop(code, f"cdui: error: refused by the control plane: {r.message}", r.message)


def retried(r: Refusal) -> Retry:
    return Retry(f"refused by the control plane: {r.message}; {advice(r.code)}", r.message)


# (case, failure, one_shot_took_run, tunnel, decision)
CASES: list[tuple[str, object, bool | None, bool, object]] = [
    # Long-running agents: what retrying cannot fix ends the agent with 2 (systemd keeps it down).
    ("version mismatch ends the agent", VERSION, None, False, refused(VERSION)),
    ("a revoked credential ends the agent", REVOKED, None, False, refused(REVOKED)),
    ("another worker's credential ends the agent", MISMATCH, None, False, refused(MISMATCH)),
    ("an unknown credential is retried (a restored or second server)", UNKNOWN, None, False, retried(UNKNOWN)),
    ("a taken name is retried (an old connection not dropped yet)", NAME, None, False, retried(NAME)),
    ("a bad hello is retried", BAD_HELLO, None, False, retried(BAD_HELLO)),
    # Behind an SSH tunnel the control plane re-enrolls an unknown credential itself.
    ("an unknown credential behind a tunnel ends the agent", UNKNOWN, None, True, refused(UNKNOWN)),
    ("a taken name behind a tunnel is retried", NAME, None, True, retried(NAME)),
    ("version mismatch behind a tunnel ends the agent", VERSION, None, True, refused(VERSION)),
    # A one-shot agent is a batch job: any refusal ends it; 2 before its run, 1 after.
    ("one-shot, refused before its run", NAME, False, False, refused(NAME)),
    ("one-shot, bad --run-id", BAD_RUN, False, False, refused(BAD_RUN)),
    ("one-shot, unknown credential before its run", UNKNOWN, False, False, refused(UNKNOWN)),
    ("one-shot, revoked after it took its run", REVOKED, True, False, refused(REVOKED, FAILED)),
    ("one-shot, version mismatch after its run", VERSION, True, False, refused(VERSION, FAILED)),
    # TLS: another key than the pinned one is the operator's call; an untrusted certificate may be fixed.
    ("pinned key mismatch ends the agent", PIN, None, False, Stop(REFUSED, f"cdui: error: {PIN.error}", PIN.error)),
    ("pinned key mismatch ends a one-shot agent with 2", PIN, True, False,
     Stop(REFUSED, f"cdui: error: {PIN.error}", PIN.error)),
    ("an untrusted certificate is retried", UNTRUSTED, None, False,
     Retry(f"{UNTRUSTED.message}; retrying", UNTRUSTED.message, logging.ERROR)),
    ("an untrusted certificate is retried by a one-shot agent", UNTRUSTED, False, False,
     Retry(f"{UNTRUSTED.message}; retrying", UNTRUSTED.message, logging.ERROR)),
    ("an unreachable control plane is retried", DOWN, None, False,
     Retry("control plane http://cp:8000 unreachable: Cannot connect to host cp:8000",
           "unreachable: Cannot connect to host cp:8000")),
    ("an unreachable control plane is retried by a one-shot agent with its run", DOWN, True, False,
     Retry("control plane http://cp:8000 unreachable: Cannot connect to host cp:8000",
           "unreachable: Cannot connect to host cp:8000")),
]


@pytest.mark.parametrize("case,failure,took,tunnel,expected", CASES, ids=[c[0] for c in CASES])
def test_policy_table(case: str, failure: object, took: bool | None, tunnel: bool, expected: object) -> None:
    assert decide(failure, one_shot_took_run=took, tunnel=tunnel) == expected  # type: ignore[arg-type]


def test_retried_refusals_carry_advice() -> None:
    assert "cdui agent forget URL" in advice("unknown_credential")
    assert "another agent is connected" in advice("name_in_use")
    assert advice("bad_hello") == "retrying"


@pytest.mark.parametrize("up_s,reset", [(0.0, False), (59.9, False), (60.0, False), (60.1, True), (3600, True)])
def test_backoff_resets_after_a_connection_that_stayed_up_a_minute(up_s: float, reset: bool) -> None:
    assert reset_backoff(up_s) is reset


@pytest.mark.parametrize("tunnel,down_s,grace_s,gone", [
    (False, 10_000.0, 300.0, False),  # a direct agent never gives up
    (True, 299.0, 300.0, False),
    (True, 300.0, 300.0, False),
    (True, 300.5, 300.0, True),       # no tunnel within the resume grace: its runs there ended
])
def test_an_ssh_agent_stops_once_its_tunnel_stayed_away_past_the_grace(tunnel: bool, down_s: float, grace_s: float,
                                                                        gone: bool) -> None:
    assert tunnel_gone(tunnel, down_s, grace_s) is gone


@pytest.mark.parametrize("setting,owner_allows,follows", [
    ("1", False, True),       # the agent's own opt-in: always
    ("1", True, True),
    ("panel", True, True),    # the default: as the owner chose in the Workers panel
    ("panel", False, False),
    ("0", True, False),       # the agent's own veto wins over the panel
    ("0", False, False),
])
def test_an_agent_follows_an_update_by_its_setting_or_else_the_owners_panel(setting: str, owner_allows: bool,
                                                                            follows: bool) -> None:
    assert follows_update(setting, owner_allows) is follows

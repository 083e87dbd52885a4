"""What the agent does when a connection to the control plane fails: one pure decision.

The agent's loop (:meth:`cdui.agent.agent.Agent.run`) only classifies what went
wrong into a :data:`Failure`; :func:`decide` says whether that ends the agent
(:class:`Stop`, with its exit code from :mod:`cdui.core.exit_codes` and the one
``cdui: error:`` line it leaves on stderr) or is retried with backoff
(:class:`Retry`, with the advice it logs). ``tests/test_agent_policy.py`` checks
every row, as ``tests/test_worker_refusal.py`` does for the control plane's side
(:mod:`cdui.plane.sched.worker_admission`).

Why each is fatal or transient (buildkite's ``isUnrecoverable``):

- a version mismatch, a revoked or superseded credential, and a credential that
  belongs to another worker cannot heal by retrying: only the operator can
  (update, re-enroll), so the agent exits 2 and its service manager's
  ``RestartPreventExitStatus`` keeps it down; a version mismatch under systemd
  restarts every 5 s until both sides match, one journal line each;
- an unknown credential may be a control plane that is being restored or a
  second server behind the same address, and a taken name may be an old
  connection the control plane has not dropped yet: both are retried, with
  advice. Behind an SSH tunnel the control plane re-enrolls a refused
  credential itself, so there an unknown credential ends the agent at once;
- a one-shot agent is a batch job that cannot wait for a refusal to change: any
  refusal ends it, with 2 before it took its run and 1 after (its result was
  not recorded);
- a TLS key that is not the pinned one: only the operator can say whether the
  proxy's key changed on purpose (exit 2); a certificate this machine does not
  trust, and an unreachable address, are retried (a fixed proxy, an updated CA
  list or a control plane that comes back must need no agent restart).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from cdui.core import exit_codes

FATAL_REFUSALS = frozenset({"version_mismatch", "revoked", "credential_mismatch"})
# A connection that stayed up this long starts the next backoff from its first delay again (NOTES.md).
BACKOFF_RESET_AFTER_S = 60.0


@dataclass(frozen=True)
class Refusal:
    """The control plane's ``refused`` message (or a ``revoked`` one on a live connection)."""

    code: str
    message: str
    update: bool = False  # version_mismatch: the owner lets this worker follow the update (the Workers panel)


@dataclass(frozen=True)
class PinMismatch:
    """The TLS proxy presented a key that is neither the pin nor the next pin."""

    error: str


@dataclass(frozen=True)
class Untrusted:
    """The certificate is not trusted by this machine (its message names the presented key)."""

    message: str


@dataclass(frozen=True)
class Unreachable:
    """No connection (refused, reset, timed out, closed before the welcome)."""

    control: str
    reason: str


Failure = Refusal | PinMismatch | Untrusted | Unreachable


@dataclass(frozen=True)
class Retry:
    log: str                      # what the agent logs before backing off
    status: str                   # the ``connecting`` message of agent-status.json
    level: int = logging.WARNING


@dataclass(frozen=True)
class Stop:
    exit_code: int
    line: str                     # the one line on stderr, in the CLI's error shape
    status: str                   # the ``refused`` message of agent-status.json


Decision = Retry | Stop


def advice(code: str) -> str:
    """What a refusal that is retried tells the operator."""
    if code == "unknown_credential":
        return ("the credential is not known there: is --control the same server (and database) that enrolled "
                "this worker? If the worker was enrolled elsewhere, run `cdui agent forget URL` and enroll with "
                "a new token; retrying")
    if code == "name_in_use":
        return "another agent is connected with this worker's name; retrying"
    return "retrying"


def decide(failure: Failure, *, one_shot_took_run: bool | None = None, tunnel: bool = False) -> Decision:
    """``one_shot_took_run``: None for a long-running agent; for a one-shot agent, whether it
    took its run already. ``tunnel``: the agent reaches the control plane through an SSH tunnel."""
    if isinstance(failure, Refusal):
        said = f"refused by the control plane: {failure.message}"
        if one_shot_took_run is not None:
            return Stop(exit_codes.FAILED if one_shot_took_run else exit_codes.REFUSED,
                        f"cdui: error: {said}", failure.message)
        if failure.code in FATAL_REFUSALS or (tunnel and failure.code == "unknown_credential"):
            return Stop(exit_codes.REFUSED, f"cdui: error: {said}", failure.message)
        return Retry(f"{said}; {advice(failure.code)}", failure.message)
    if isinstance(failure, PinMismatch):
        return Stop(exit_codes.REFUSED, f"cdui: error: {failure.error}", failure.error)
    if isinstance(failure, Untrusted):
        return Retry(f"{failure.message}; retrying", failure.message, logging.ERROR)
    return Retry(f"control plane {failure.control} unreachable: {failure.reason}", f"unreachable: {failure.reason}")


def follows_update(setting: str, owner_allows: bool) -> bool:
    """Whether an agent refused for its version installs the control plane's update: its own
    CODEFYUI_AGENT_AUTO_UPDATE (``1`` always, ``0`` never) or, left at ``panel``, the owner's choice for its
    worker in the Workers panel (``owner_allows``, sent with the refusal)."""
    return setting == "1" or (setting == "panel" and owner_allows)


def reset_backoff(up_s: float) -> bool:
    """Whether the next reconnect starts from the first delay: the last connection stayed up."""
    return up_s > BACKOFF_RESET_AFTER_S


def tunnel_gone(tunnel: bool, down_s: float, grace_s: float) -> bool:
    """An SSH worker's agent whose tunnel did not come back within the control plane's resume
    grace stops: its runs there have ended, and the supervisor starts a fresh agent."""
    return tunnel and down_s > grace_s

"""The one-shot agent's lifecycle: which run it takes, when it exits, and with what code.

A one-shot agent takes exactly one run, reports it, and exits once the control
plane acknowledged the run's end. Its exit code is a contract with batch
scripts (the spec's table):

- 0: the run succeeded and the control plane recorded it;
- 1: the run failed, was cancelled or interrupted, or its result was not
  delivered (no acknowledgement within the resume grace after the run ended:
  the result stays in the spool for a later agent on the same folder), or the
  control plane refused the agent after it had taken its run;
- 2: refused by the control plane before any run (version, name in use, bad
  ``--run-id``, bad flags);
- 3: stopped (SIGTERM, Ctrl-C, the job's time limit) before a run arrived;
- 4: could not start (enrollment failed, mount refused), decided by the CLI.

A SIGTERM after the run arrived is an interruption, not a cancel: a batch
system that stops the job at its time limit gets the run ``interrupted`` (its
training loop writes the interrupt checkpoint), and the agent exits 1.

This is pure state; :class:`cdui.agent.agent.Agent` calls it from a few hooks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdui.core.exit_codes import FAILED, NO_RUN, OK, REFUSED


@dataclass
class OneShot:
    instance: str | None = None   # the ID when this agent is an instance
    run_id: str | None = None     # --run-id: the only run it takes
    taken: str | None = None      # the run it took
    final: str | None = None      # that run's final status, once it ended
    signalled: bool = False       # SIGTERM or Ctrl-C arrived
    exit_code: int | None = None  # decided: the agent stops with it

    def accept(self, run_id: str) -> bool:
        """Whether an assigned run is this agent's one run (the first, or the --run-id one)."""
        if self.taken is not None:
            return run_id == self.taken
        if self.run_id is not None and run_id != self.run_id:
            return False
        self.taken = run_id
        return True

    def on_refused(self) -> int:
        """The control plane refused the agent: before its run that is a refusal, after it the
        run's result was not recorded."""
        return REFUSED if self.taken is None else FAILED

    def on_signal(self) -> int:
        self.signalled = True
        return NO_RUN if self.taken is None else FAILED

    def on_delivered(self) -> int:
        """Every event of the run, its end included, is acknowledged."""
        return OK if self.final == "succeeded" else FAILED

    def final_event(self, events: list[dict[str, Any]]) -> None:
        """A run stopped because the batch job was stopped ends ``interrupted``, not ``cancelled``:
        rewrite its final status event (in place) before it is spooled and sent."""
        if not self.signalled:
            return
        for ev in events:
            data = ev.get("data")
            if ev.get("kind") == "status" and isinstance(data, dict) and data.get("status") == "cancelled":
                data["status"] = "interrupted"
                data["error"] = ("the one-shot agent was stopped (SIGTERM or Ctrl-C, e.g. the batch job's time "
                                 "limit) while the run was running"
                                 + (f": {data['error']}" if data.get("error") else ""))

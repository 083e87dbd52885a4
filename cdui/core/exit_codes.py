"""The exit codes of ``cdui agent start``, in one place.

They are a contract with whatever starts an agent (CONTRACT.md): systemd's
``RestartPreventExitStatus`` in ``deploy/codefyui-agent.service``, batch
scripts (``deploy/slurm/codefyui.sbatch``) and the SSH supervisor, which reads
the code the remote script passes on. The docs list them as tables
(docs/remote-workers.md#agent-exit-codes, the ``cdui agent start`` section of
docs/cli.md, docs/one-shot-and-slurm.md#exit-codes), and
``tests/test_agent_exit_codes.py`` reads those tables back against this module.
"""
from __future__ import annotations

OK = 0        # connected (background start), stopped by SIGTERM/SIGINT; one-shot: its run succeeded
FAILED = 1    # one-shot only: its run did not succeed, or its end was not acknowledged
REFUSED = 2   # refused by the control plane (version, name taken, revoked, pin mismatch) or bad flags
NO_RUN = 3    # one-shot only: stopped before a run arrived
START = 4     # could not start: no credential and no token, enrollment refused for good, --mount refused

# The codes each kind of agent can end with.
LONG_RUNNING = (OK, REFUSED, START)
ONE_SHOT = (OK, FAILED, REFUSED, NO_RUN, START)

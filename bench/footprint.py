"""Benchmark 5: footprint. Idle RSS of the control plane and of an agent, whether either maps torch, and
the memory of their zygotes (the process that has imported torch and forks each run's process).

Devices are probed once in a short helper subprocess (``python -m
cdui.run.devices``), so neither long-running process should import torch. A
zygote is started at an owner's first run (cdui/run/spare.py); it is measured
after one local and one worker run, as PSS (``/proc/PID/smaps_rollup``: each
shared page divided among the processes that map it, so torch's libraries are
counted once however many processes map them) beside its RSS.

    .venv/bin/python bench/footprint.py
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from common import AgentProc, Figure, imports_torch, parser, report, rss_mb, say, server, trivial_graph, wait_run


def pss_mb(pid: int) -> float | None:
    """Proportional set size of one process, in MB (10^6 bytes)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        return None
    return None


def zygote_of(parent: int) -> int | None:
    """The child of ``parent`` started as a zygote, if there is one."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"--zygote" in cmd:
            return int(entry)
    return None


def main() -> int:
    a = parser(__doc__).parse_args()
    with server() as srv:
        agent = AgentProc(srv).start()
        try:
            time.sleep(0.5 if a.smoke else 3)  # idle: after start-up's allocations settle
            cp_rss, ag_rss = rss_mb(srv.pid), rss_mb(agent.pid)
            cp_torch, ag_torch = imports_torch(srv.pid), imports_torch(agent.pid)
            say("one run on each, to start their zygotes")
            for target in ("local", "w1"):
                r = srv.call("POST", "/api/runs", {"graph": trivial_graph(), "options": {"target": target}})
                wait_run(srv, r["id"])
            zygotes = {"control plane": zygote_of(srv.pid), "agent": zygote_of(agent.pid)}
            zyg = {k: (pss_mb(z), rss_mb(z)) if z else (None, None) for k, z in zygotes.items()}
            after_torch = imports_torch(srv.pid) or imports_torch(agent.pid)
        finally:
            agent.stop()
    B = "footprint"
    figs = [Figure(B, "control plane idle RSS", cp_rss, "MB", 80),
            Figure(B, "agent idle RSS", ag_rss, "MB", 60),
            Figure(B, "control plane has torch loaded (1 = yes)", float(cp_torch), "", 0),
            Figure(B, "agent has torch loaded (1 = yes)", float(ag_torch), "", 0),
            Figure(B, "either has torch loaded after runs (1 = yes)", float(after_torch), "", 0)]
    for owner, (pss, rss) in zyg.items():
        figs += [Figure(B, f"{owner}'s zygote PSS (shared pages counted once)", pss, "MB"),
                 Figure(B, f"{owner}'s zygote RSS", rss, "MB")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

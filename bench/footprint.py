"""Benchmark 5: footprint. Idle RSS of the control plane and of an agent, and whether either maps torch.

Devices are probed once in a short helper subprocess (``python -m
cdui.run.devices``), so neither long-running process should import torch.

    .venv/bin/python bench/footprint.py
"""
from __future__ import annotations

import time

from common import AgentProc, Figure, imports_torch, parser, report, rss_mb, server


def main() -> int:
    a = parser(__doc__).parse_args()
    with server() as srv:
        agent = AgentProc(srv).start()
        try:
            time.sleep(0.5 if a.smoke else 3)  # idle: after start-up's allocations settle
            cp_rss, ag_rss = rss_mb(srv.pid), rss_mb(agent.pid)
            cp_torch, ag_torch = imports_torch(srv.pid), imports_torch(agent.pid)
        finally:
            agent.stop()
    B = "footprint"
    report([Figure(B, "control plane idle RSS", cp_rss, "MB", 80),
            Figure(B, "agent idle RSS", ag_rss, "MB", 60),
            Figure(B, "control plane has torch loaded (1 = yes)", float(cp_torch), "", 0),
            Figure(B, "agent has torch loaded (1 = yes)", float(ag_torch), "", 0)], a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

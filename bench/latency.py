"""Benchmark 1: a trivial graph's run start and end, back to back, on this server and on a connected agent.

A trivial graph (CSVReader -> Print on the bundled iris sample) is submitted
``--runs`` times, each as soon as the one before it has ended (no gap, as a
sweep or a user pressing Run twice would), with ``target: local`` and then
with ``target: w1`` (an agent process connected over loopback). Measured:
submit -> run process started (the ``running`` event), submit -> run ready
(the run process's ``running N nodes`` log line: registry built, graph
validated, about to execute its first node) and submit -> ``succeeded``.

The yardstick is measured in the same invocation: a fresh ``python -c "import
torch"``, what a cold run process pays before anything else. The issue's goals
are ratios to it: submit -> ``succeeded`` p50 <= 0.10 x, p95 <= 0.2 x, and a
worker's p50 <= 1.2 x the local one.

    .venv/bin/python bench/latency.py [--runs 50] [--gap 0]
"""
from __future__ import annotations

import subprocess
import time

from common import (
    AgentProc,
    Figure,
    at_s,
    parser,
    pct,
    python,
    report,
    say,
    server,
    started_at,
    trivial_graph,
    wait_run,
)


def ready_at(srv, run_id: str) -> float | None:
    """When the run process was about to execute its first node (its own clock, this machine)."""
    for ev in srv.call("GET", f"/api/runs/{run_id}/events?after=0"):
        if ev["kind"] == "log" and str(ev["data"].get("message", "")).startswith("running "):
            return at_s(ev["at"])
    return None


def import_torch_ms(n: int) -> list[float]:
    """Wall time of a fresh ``python -c "import torch"``, ``n`` times."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([python(), "-c", "import torch"], check=True, stdin=subprocess.DEVNULL)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(srv, target: str, n: int, gap: float = 0.0) -> tuple[list[float], list[float], list[float]]:
    start, ready, total = [], [], []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        t0 = time.time()
        r = srv.call("POST", "/api/runs", {"graph": trivial_graph(), "options": {"target": target, "device": "cpu"}})
        end = wait_run(srv, r["id"])
        t1 = time.time()
        if end["status"] != "succeeded":
            raise RuntimeError(f"run {r['id']} ended {end['status']}: {end['error']}")
        s = started_at(srv, r["id"])
        if s is not None:
            start.append((s - t0) * 1000)
        r_at = ready_at(srv, r["id"])
        if r_at is not None:
            ready.append((r_at - t0) * 1000)
        total.append((t1 - t0) * 1000)
    return start, ready, total


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--gap", type=float, default=0.0, help="seconds between one run's end and the next submit")
    a = p.parse_args()
    n = 3 if a.smoke else a.runs
    a.gap = 0.0 if a.smoke else a.gap
    with server() as srv:
        agent = AgentProc(srv).start()
        try:
            # The first run of each owner starts its zygote (torch imported once) and pays for the node
            # catalog on disk: a start-up cost, not a run's.
            measure(srv, "local", 1)
            measure(srv, "w1", 1)
            say("local runs")
            ls, lr, lt = measure(srv, "local", n, a.gap)
            say("worker runs")
            rs, rr, rt = measure(srv, "w1", n, a.gap)
        finally:
            agent.stop()
    say("a fresh python importing torch")
    imp = pct(import_torch_ms(1 if a.smoke else 5), 50)
    B = "latency"
    spacing = "back to back" if not a.gap else f"runs {a.gap:g} s apart"
    figs = [Figure(B, "fresh `python -c 'import torch'` p50 (the yardstick)", imp, "ms"),
            Figure(B, "local: submit -> succeeded p50", pct(lt, 50), "ms", note=spacing),
            Figure(B, "local: submit -> succeeded p95", pct(lt, 95), "ms", note=spacing),
            Figure(B, "worker: submit -> succeeded p50", pct(rt, 50), "ms", note=spacing),
            Figure(B, "worker: submit -> succeeded p95", pct(rt, 95), "ms", note=spacing),
            Figure(B, "local: submit -> succeeded p50 / import torch", ratio(pct(lt, 50), imp), "x", 0.10),
            Figure(B, "local: submit -> succeeded p95 / import torch", ratio(pct(lt, 95), imp), "x", 0.2),
            Figure(B, "worker: submit -> succeeded p50 / import torch", ratio(pct(rt, 50), imp), "x", 0.10),
            Figure(B, "worker: submit -> succeeded p95 / import torch", ratio(pct(rt, 95), imp), "x", 0.2),
            Figure(B, "worker/local ratio of p50 submit -> succeeded", ratio(pct(rt, 50), pct(lt, 50)), "x", 1.2),
            Figure(B, "local: submit -> run process started p50", pct(ls, 50), "ms", 100),
            Figure(B, "worker: submit -> run process started p50", pct(rs, 50), "ms", 100),
            Figure(B, "local: submit -> run ready p50", pct(lr, 50), "ms", 100),
            Figure(B, "worker: submit -> run ready p50", pct(rr, 50), "ms", 100),
            Figure(B, "worker/local ratio of p50 submit -> run ready", ratio(pct(rr, 50), pct(lr, 50)), "x", 1.2,
                   note=spacing)]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

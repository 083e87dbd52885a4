"""Benchmark 1: dispatch latency of a trivial graph, on this server vs on a connected agent.

A trivial graph (CSVReader -> Print on the bundled iris sample) is submitted
``--runs`` times, one after the other, with ``target: local`` and then with
``target: w1`` (an agent process connected over loopback). Measured: submit ->
run subprocess started (the ``running`` event), submit -> run ready (the run
process's ``running N nodes`` log line: torch imported, registry built, graph
validated, about to execute its first node) and submit -> ``succeeded``.

Runs are ``--gap`` seconds apart (a person submitting, not a script): the warm
spare run process (cdui/run/spare.py) started after one run needs about as long as
a cold start to import torch before the next can take it ready.

    .venv/bin/python bench/latency.py [--runs 100] [--gap 2]
"""
from __future__ import annotations

import time

from common import AgentProc, Figure, at_s, parser, pct, report, say, server, started_at, trivial_graph, wait_run


def ready_at(srv, run_id: str) -> float | None:
    """When the run process was about to execute its first node (its own clock, this machine)."""
    for ev in srv.call("GET", f"/api/runs/{run_id}/events?after=0"):
        if ev["kind"] == "log" and str(ev["data"].get("message", "")).startswith("running "):
            return at_s(ev["at"])
    return None


def measure(srv, target: str, n: int, gap: float = 0.0) -> tuple[list[float], list[float], list[float]]:
    start, ready, total = [], [], []
    for _ in range(n):
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


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--gap", type=float, default=2.0, help="seconds between one run's end and the next submit")
    a = p.parse_args()
    n = 2 if a.smoke else a.runs
    a.gap = 0.0 if a.smoke else a.gap
    figs = []
    with server() as srv:
        agent = AgentProc(srv).start()
        try:
            measure(srv, "local", 1)  # the first run of each pays for the node catalog on disk
            measure(srv, "w1", 1)
            say("local runs")
            ls, lr, lt = measure(srv, "local", n, a.gap)
            say("worker runs")
            rs, rr, rt = measure(srv, "w1", n, a.gap)
        finally:
            agent.stop()
    B = "latency"
    figs += [Figure(B, "local: submit -> succeeded p50", pct(lt, 50), "ms"),
             Figure(B, "local: submit -> succeeded p95", pct(lt, 95), "ms"),
             Figure(B, "worker: submit -> succeeded p50", pct(rt, 50), "ms"),
             Figure(B, "worker: submit -> succeeded p95", pct(rt, 95), "ms"),
             Figure(B, "worker/local ratio of p50 submit -> succeeded", (pct(rt, 50) or 0) / (pct(lt, 50) or 1), "x",
                    1.2),
             Figure(B, "local: submit -> run process started p50", pct(ls, 50), "ms", 100),
             Figure(B, "worker: submit -> run process started p50", pct(rs, 50), "ms", 100),
             Figure(B, "local: submit -> run ready (torch imported) p50", pct(lr, 50), "ms", 100),
             Figure(B, "worker: submit -> run ready (torch imported) p50", pct(rr, 50), "ms", 100),
             Figure(B, "worker/local ratio of p50 submit -> run ready", (pct(rr, 50) or 0) / (pct(lr, 50) or 1), "x",
                    1.2, note=f"runs {a.gap:g} s apart")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark 1: dispatch latency of a trivial graph, on this server vs on a connected agent.

A trivial graph (CSVReader -> Print on the bundled iris sample) is submitted
``--runs`` times, one after the other, with ``target: local`` and then with
``target: w1`` (an agent process connected over loopback). Measured: submit ->
run subprocess started (the ``running`` event) and submit -> ``succeeded``.

    .venv/bin/python bench/latency.py [--runs 100]
"""
from __future__ import annotations

import time

from common import AgentProc, Figure, parser, pct, report, say, server, started_at, trivial_graph, wait_run


def measure(srv, target: str, n: int) -> tuple[list[float], list[float]]:
    start, total = [], []
    for _ in range(n):
        t0 = time.time()
        r = srv.call("POST", "/api/runs", {"graph": trivial_graph(), "options": {"target": target, "device": "cpu"}})
        end = wait_run(srv, r["id"])
        t1 = time.time()
        if end["status"] != "succeeded":
            raise RuntimeError(f"run {r['id']} ended {end['status']}: {end['error']}")
        s = started_at(srv, r["id"])
        if s is not None:
            start.append((s - t0) * 1000)
        total.append((t1 - t0) * 1000)
    return start, total


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=100)
    a = p.parse_args()
    n = 2 if a.smoke else a.runs
    figs = []
    with server() as srv:
        agent = AgentProc(srv).start()
        try:
            measure(srv, "local", 1)  # the first run of each pays for the node catalog on disk
            measure(srv, "w1", 1)
            say("local runs")
            ls, lt = measure(srv, "local", n)
            say("worker runs")
            rs, rt = measure(srv, "w1", n)
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
             Figure(B, "worker: submit -> run process started p50", pct(rs, 50), "ms", 100,
                    note="a run is done only when its process has imported torch")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

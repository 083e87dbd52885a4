"""Benchmark 3: event throughput of a run that logs flat out, on this server vs on an agent.

A custom node (``Flood``) logs ``--events`` events as fast as it can. Measured:
events persisted per second, from the run's ``running`` event to its final
status (each event stored before it is acknowledged), locally and on an agent
process connected over loopback.

    .venv/bin/python bench/events.py [--events 200000]
"""
from __future__ import annotations

from common import AgentProc, Figure, at_s, flood_graph, install_flood, parser, report, say, server, wait_run


def rate(srv, target: str, n: int) -> float:
    r = srv.call("POST", "/api/runs", {"graph": flood_graph(n), "options": {"target": target, "device": "cpu"}})
    end = wait_run(srv, r["id"], interval=0.05)
    if end["status"] != "succeeded":
        raise RuntimeError(f"run {r['id']} ended {end['status']}: {end['error']}")
    first = srv.call("GET", f"/api/runs/{r['id']}/events?after=0")
    running = next(e["at"] for e in first if e["kind"] == "status" and e["data"].get("status") == "running")
    last = srv.call("GET", f"/api/runs/{r['id']}/events?after={end['last_seq'] - 1}")[-1]
    stored = end["last_seq"]
    if stored < n:
        raise RuntimeError(f"run {r['id']} stored {stored} events, fewer than the {n} it logged")
    return stored / (at_s(last["at"]) - at_s(running))


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--events", type=int, default=200000)
    a = p.parse_args()
    n = 2000 if a.smoke else a.events
    with server() as srv:
        install_flood(srv.data_dir)
        srv.stop()
        srv.start()  # the custom node is read at start
        agent = AgentProc(srv).start()
        try:
            say("local run")
            local = rate(srv, "local", n)
            say("worker run")
            remote = rate(srv, "w1", n)
        finally:
            agent.stop()
    B = "events"
    report([Figure(B, f"local: {n:,} events persisted", local, "events/s", 150000, better="higher"),
            Figure(B, f"worker: {n:,} events persisted and acknowledged", remote, "events/s", 150000, better="higher"),
            Figure(B, "worker/local event rate", remote / local, "x", 0.9, better="higher")], a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

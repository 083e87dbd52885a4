"""Benchmark 7: the control plane stays responsive while saved graphs are listed.

``--graphs`` graphs of about ``--mb`` megabytes each are saved, then
``GET /api/graphs`` is called while a second thread calls ``/api/health`` back
to back; the health latencies measured while the listing was in flight make the
p95. Two cases: graphs saved through ``PUT /api/graphs/{name}`` (indexed when
saved), and the same files dropped into ``data/graphs/`` by hand, as graphs
saved before the index existed are (the first listing has them indexed by its
helper process).

    .venv/bin/python bench/graph_list.py [--graphs 20] [--mb 7.6]
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request

from common import Figure, parser, pct, report, say, server


def big_graph(mb: float) -> dict:
    """A callable graph (GraphInput -> GraphOutput) padded with Print nodes to about ``mb`` MB of JSON."""
    def node(nid: str, ntype: str, **params: object) -> dict:
        return {"id": nid, "type": ntype, "position": {"x": 0, "y": 0}, "data": {"params": params}}
    nodes = [node("start", "Start"), node("in", "GraphInput", name="x", type="json"), node("out", "GraphOutput",
                                                                                           name="y")]
    nodes += [node(f"pad{i}", "Print", label="x" * 200) for i in range(int(mb * 1e6 / 300))]
    return {"format_version": 1, "name": "big", "nodes": nodes, "edges": [
        {"id": "t", "source": "start", "sourceHandle": "trigger", "target": "in", "type": "trigger"},
        {"id": "d", "source": "in", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}


def health_during(srv, call) -> tuple[list[float], float, object]:
    """Health latencies (ms) measured while ``call()`` runs; its duration (s) and answer."""
    done = threading.Event()
    lat: list[float] = []

    def probe() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(srv.url + "/api/health", timeout=120) as r:
                r.read()
            lat.append((time.perf_counter() - t0) * 1000)
    t = threading.Thread(target=probe)
    t.start()
    time.sleep(0.2)  # the prober is running before the listing starts
    t0 = time.monotonic()
    try:
        answer = call()
    finally:
        took = time.monotonic() - t0
        done.set()
        t.join()
    return lat, took, answer


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--graphs", type=int, default=20)
    p.add_argument("--mb", type=float, default=7.6)
    a = p.parse_args()
    count, mb = (3, 0.2) if a.smoke else (a.graphs, a.mb)
    raw = json.dumps(big_graph(mb))
    B = "graphs"
    figs = []
    with server() as srv:
        say(f"saving {count} graphs of {len(raw) / 1e6:.1f} MB through PUT")
        for i in range(count):
            srv.call("PUT", f"/api/graphs/saved{i:02}", json.loads(raw))
        # Ten listings back to back: one alone is over before many health probes are taken.
        lat, took, answer = health_during(srv, lambda: [srv.call("GET", "/api/graphs") for _ in range(10)][-1])
        assert all(g["callable"] for g in answer["graphs"]), answer
        figs += [Figure(B, f"/api/health p95 during GET /api/graphs ({count} saved graphs)", pct(lat, 95), "ms", 100,
                        note=f"{len(lat)} probes, {len(raw) / 1e6:.1f} MB each"),
                 Figure(B, f"GET /api/graphs of {count} saved graphs", took * 100, "ms", note="mean of 10")]
        say(f"dropping {count} more graphs into data/graphs by hand (no index entries)")
        for i in range(count):
            (srv.data_dir / "graphs" / f"legacy{i:02}.json").write_text(raw)
        lat, took, answer = health_during(srv, lambda: srv.call("GET", "/api/graphs"))
        pending = sum(1 for g in answer["graphs"] if g.get("indexing"))
        figs += [Figure(B, f"/api/health p95 during the first GET /api/graphs of {count} unindexed graphs",
                        pct(lat, 95), "ms", 100, note=f"{len(lat)} probes; {pending} listed as still indexing"),
                 Figure(B, f"first GET /api/graphs with {count} unindexed graphs", took * 1000, "ms")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

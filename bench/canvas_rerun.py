"""The canvas's re-run: after a trained iris Run, change a downstream param and Run again.

On one control plane, the iris example (examples/iris_train.json) is Run on a canvas tab
(``POST /api/canvas/run``) once, training it; then ``--runs`` times, each with the validation
loader's ``batch_size`` changed (a param below the whole data pipeline), measuring submit ->
``succeeded``:

- **iris, training included**: every node above the changed one answers from the tab's execution
  cache; the training loop (never cached) and what follows it run again;
- **iris data pipeline**: the same graph without the model and its training (CSV, Normalize, split,
  datasets, loaders): only the changed loader runs. The goal (< 300 ms) is this figure's;
- the same changed iris graph as an ordinary local run (``POST /api/runs``: a new run process
  each time, nothing cached), for scale.

    .venv/bin/python bench/canvas_rerun.py [--runs 10]
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

from common import Figure, parser, pct, report, say, server, wait_run

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "iris_train.json"
PIPELINE = {"start", "csv", "norm", "split", "train-set", "val-set", "train-loader", "val-loader"}


def iris() -> dict[str, Any]:
    return dict(json.loads(EXAMPLE.read_text()))


def pipeline_only(g: dict[str, Any]) -> dict[str, Any]:
    g = copy.deepcopy(g)
    g["nodes"] = [n for n in g["nodes"] if n["id"] in PIPELINE]
    g["edges"] = [e for e in g["edges"] if e["source"] in PIPELINE and e["target"] in PIPELINE]
    return g


def with_batch(g: dict[str, Any], size: int) -> dict[str, Any]:
    g = copy.deepcopy(g)
    for n in g["nodes"]:
        if n["id"] == "val-loader":
            n["data"]["params"]["batch_size"] = size
    return g


def canvas(srv: Any, tab: str, g: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    r = srv.call("POST", "/api/canvas/run", {"tab": tab, "graph": g, "persist_weights": False,
                                             "record_outputs": False})
    end = wait_run(srv, r["run_id"])
    ms = (time.perf_counter() - t0) * 1000
    if end["status"] != "succeeded":
        raise RuntimeError(f"canvas run {r['run_id']} ended {end['status']}: {end['error']}")
    return ms, end


def cached_nodes(srv: Any, run_id: str) -> int:
    return sum(1 for e in srv.call("GET", f"/api/runs/{run_id}/events?after=0")
               if e["kind"] == "node_status" and e["data"].get("status") == "cached")


def local(srv: Any, g: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    r = srv.call("POST", "/api/runs", {"graph": g, "options": {"target": "local", "device": "cpu"}})
    end = wait_run(srv, r["id"])
    if end["status"] != "succeeded":
        raise RuntimeError(f"run {r['id']} ended {end['status']}: {end['error']}")
    return (time.perf_counter() - t0) * 1000


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=10)
    a = p.parse_args()
    n = 2 if a.smoke else a.runs
    g = iris()
    with server() as srv:
        say("the first, trained, iris Run (starts the zygote and the tab's process)")
        canvas(srv, "iris", g)
        canvas(srv, "pipe", pipeline_only(g))
        full, pipe, fresh = [], [], []
        cached_full = cached_pipe = 0
        for i in range(n):
            size = 32 + i  # a value not run before: the loader (and what follows it) must run
            say(f"re-run {i + 1}/{n}")
            ms, end = canvas(srv, "iris", with_batch(g, size))
            full.append(ms)
            cached_full = cached_nodes(srv, end["id"])
            ms, end = canvas(srv, "pipe", with_batch(pipeline_only(g), size))
            pipe.append(ms)
            cached_pipe = cached_nodes(srv, end["id"])
            fresh.append(local(srv, with_batch(g, size)))
    B = "canvas"
    figs = [Figure(B, "iris data pipeline, downstream param changed: submit -> succeeded p50", pct(pipe, 50), "ms",
                   300, note=f"{cached_pipe} of {len(PIPELINE)} nodes cached"),
            Figure(B, "iris data pipeline, downstream param changed: submit -> succeeded p95", pct(pipe, 95), "ms"),
            Figure(B, "iris with training, downstream param changed: submit -> succeeded p50", pct(full, 50), "ms",
                   note=f"{cached_full} of {len(g['nodes'])} nodes cached; the training loop always runs"),
            Figure(B, "the same iris graph as a local run (nothing cached): submit -> succeeded p50",
                   pct(fresh, 50), "ms")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

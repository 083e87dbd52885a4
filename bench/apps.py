"""Published apps (docs/apps.md): a trained iris MLP invoked through its app, warm on the control plane.

On one control plane the iris example (examples/iris_train.json) is run once as an ordinary run, which
trains the MLP and saves its weights (models/iris/model.pt). An inference graph (GraphInput
``features`` -> the same SequentialModel -> ModelLoader of those weights -> Inference -> Argmax ->
GraphOutput ``class``) is saved, published as app ``iris`` and invoked with an API key
(``POST /api/apps/iris/invoke``). Measured, from a client on this machine over keep-alive HTTP:

- **cold first invoke**: the first invoke of the version, which starts its serving process (forked
  from the zygote), against a fresh ``python -c "import torch"`` measured in the same invocation
  (goal: ≤ 1.2 ×);
- **warm invoke p50 / p95**: ``--invokes`` back-to-back invokes of one client (goal p50 ≤ 15 ms);
- **invokes/s with 32 clients**: 32 clients invoking back to back for ``--seconds`` (goal ≥ 500), the
  version allowed ``PROCESSES`` serving processes;
- **warm invoke on a worker p50**: the same graph published as a second app served on a worker
  (``serve_on``; an agent on this machine that counts as another one, so it fetches the version's weights
  over the transfer route), routed over the worker's connection: ``--invokes`` invokes of one client,
  taking turns with as many of the first app on the control plane, so that both p50s of the ratio are
  taken under the same load (goal p50 ≤ 25 ms, and ≤ 1.5 × the control plane's p50 of those turns);
- the same graph behind ``POST /api/graph/run/iris`` (an ordinary run each, a process forked for
  each), p50 of ``--runs`` calls, for comparison.

    .venv/bin/python bench/apps.py [--invokes 300] [--seconds 5] [--runs 10]
"""
from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from common import AgentProc, Figure, parser, pct, python, report, say, server, wait_run

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "iris_train.json"
FEATURES = [5.1, 3.5, 1.4, 0.2]
CLIENTS = 32
PROCESSES = 2  # serving processes the version may have (CODEFYUI_APP_PROCESSES): one per core here


def node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "position": {"x": 0, "y": 0}, "data": {"params": params}}


def edge(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
    return {"id": f"{src}-{dst}-{th}", "source": src, "sourceHandle": sh, "target": dst, "targetHandle": th,
            "type": "data"}


def trigger(dst: str) -> dict[str, Any]:
    return {"id": f"t-{dst}", "source": "start", "sourceHandle": "trigger", "target": dst, "targetHandle": None,
            "type": "trigger"}


def inference_graph(train: dict[str, Any]) -> dict[str, Any]:
    layers = next(n for n in train["nodes"] if n["id"] == "model")["data"]["params"]["layers"]
    weights = next(n for n in train["nodes"] if n["id"] == "save")["data"]["params"]["path"]
    return {"format_version": 1, "name": "iris", "nodes": [
        node("start", "Start"), node("in", "GraphInput", name="features", type="json",
                                     description="sepal length, sepal width, petal length, petal width"),
        node("model", "SequentialModel", layers=layers), node("load", "ModelLoader", path=weights),
        node("infer", "Inference"), node("argmax", "Argmax", dim=-1), node("out", "GraphOutput", name="class")],
        "edges": [trigger("in"), trigger("model"), edge("model", "model", "load", "model"),
                  edge("load", "model", "infer", "model"), edge("in", "value", "infer", "input"),
                  edge("infer", "output", "argmax", "tensor"), edge("argmax", "tensor", "out", "value")]}


class Caller:
    """One keep-alive HTTP connection that invokes the app."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {**headers, "Content-Type": "application/json"}

    def post(self, path: str, body: Any) -> tuple[float, int, Any]:
        t0 = time.perf_counter()
        self.conn.request("POST", path, json.dumps(body), self.headers)
        r = self.conn.getresponse()
        data = json.loads(r.read())
        return (time.perf_counter() - t0) * 1000, r.status, data


def check(status: int, out: Any) -> None:
    if status != 200 or out.get("status") != "succeeded":
        raise RuntimeError(f"the invoke answered {status}: {json.dumps(out)[:500]}")


async def clients(port: int, key: str, seconds: float) -> tuple[int, float]:
    """CLIENTS asyncio clients invoking back to back for ``seconds``: invokes done, seconds taken."""
    import aiohttp

    body = {"inputs": {"features": FEATURES}}
    done = 0
    stop_at = time.perf_counter() + seconds

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            async with session.post(f"http://127.0.0.1:{port}/api/apps/iris/invoke", json=body) as r:
                out = await r.json()
                check(r.status, out)
                done += 1

    t0 = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {key}"}) as s:
        await asyncio.gather(*(one(s) for _ in range(CLIENTS)))
    return done, time.perf_counter() - t0


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--invokes", type=int, default=300)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=10)
    a = p.parse_args()
    invokes, seconds, runs = (5, 0.5, 2) if a.smoke else (a.invokes, a.seconds, a.runs)
    train = json.loads(EXAMPLE.read_text())
    if a.smoke:  # a model of one epoch is as fast to invoke; smoke sizes measure nothing anyway
        for n in train["nodes"]:
            if n["id"] == "train":
                n["data"]["params"]["epochs"] = 1
    # Each serving process holds a slot of its device: one slot per process.
    with server({"CODEFYUI_APP_PROCESSES": str(PROCESSES),
                 "CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": f"cpu={PROCESSES}"}) as srv:
        say("training the iris MLP (examples/iris_train.json as a local run)")
        r = srv.call("POST", "/api/runs", {"graph": train, "options": {"target": "local", "device": "cpu"}})
        end = wait_run(srv, r["id"])
        if end["status"] != "succeeded":
            raise RuntimeError(f"the training run ended {end['status']}: {end['error']}")
        srv.call("PUT", "/api/graphs/iris", inference_graph(train))
        srv.call("POST", "/api/apps/iris/publish", {"graph": "iris", "create": True, "note": "bench"})
        key = srv.call("POST", "/api/keys", {"name": "bench"})["key"]
        caller = Caller(srv.port, {"Authorization": f"Bearer {key}"})
        body = {"inputs": {"features": FEATURES}}

        say("the cold first invoke (starts the version's serving process)")
        cold, status, out = caller.post("/api/apps/iris/invoke", body)
        check(status, out)
        got = out["outputs"]["class"]
        predicted = got.get("values") if isinstance(got, dict) else got
        say(f"warm: {invokes} back-to-back invokes")
        warm = []
        for _ in range(invokes):
            ms, status, out = caller.post("/api/apps/iris/invoke", body)
            check(status, out)
            warm.append(ms)
        say(f"{CLIENTS} clients for {seconds:g} s")
        done, took = asyncio.run(clients(srv.port, key, seconds))
        say("the same graph as app iris-w served on worker w2 (another machine id): its cold first invoke, then "
            "warm invokes taking turns with app iris on the control plane")
        agent = AgentProc(srv, "w2", {"CODEFYUI_MACHINE_ID": "bench-worker"}).start()
        try:
            srv.call("POST", "/api/apps/iris-w/publish", {"graph": "iris", "create": True, "note": "bench"})
            srv.call("PATCH", "/api/apps/iris-w", {"serve_on": "w2"})
            worker_cold, status, out = caller.post("/api/apps/iris-w/invoke", body)
            check(status, out)
            if out.get("worker") != "w2" or out["outputs"]["class"] != got:
                raise RuntimeError(f"the worker answered {out['outputs']} from {out.get('worker')}, not {got} from w2")
            on_worker, beside = [], []
            for _ in range(invokes):
                ms, status, out = caller.post("/api/apps/iris-w/invoke", body)
                check(status, out)
                on_worker.append(ms)
                ms, status, out = caller.post("/api/apps/iris/invoke", body)
                check(status, out)
                beside.append(ms)
            srv.call("POST", "/api/apps/iris-w/unpublish", {})
        finally:
            agent.stop()
        say(f"the same graph behind /api/graph/run/iris, {runs} calls")
        owner = Caller(srv.port, {"X-CodefyUI-Token": srv.token})
        graph_run = []
        for _ in range(runs):
            ms, status, out = owner.post("/api/graph/run/iris", {**body, "device": "cpu"})
            check(status, out)
            graph_run.append(ms)
    say("a fresh python importing torch, 3 times")
    imports = []
    for _ in range(1 if a.smoke else 3):
        t0 = time.perf_counter()
        subprocess.run([python(), "-c", "import torch"], check=True, stdin=subprocess.DEVNULL)
        imports.append((time.perf_counter() - t0) * 1000)
    imp = pct(imports, 50)
    B = "apps"
    p50 = pct(warm, 50)
    gr50 = pct(graph_run, 50)
    w50 = pct(on_worker, 50)
    b50 = pct(beside, 50)
    figs = [Figure(B, "warm invoke of the iris MLP app, p50 (one client, keep-alive)", p50, "ms", 15,
                   note=f"predicted class {predicted}"),
            Figure(B, "warm invoke of the iris MLP app, p95", pct(warm, 95), "ms"),
            Figure(B, f"invokes/s with {CLIENTS} clients", done / took if took else None, "invokes/s", 500,
                   better="higher", note=f"{done} invokes in {took:.1f} s, CODEFYUI_APP_PROCESSES={PROCESSES}"),
            Figure(B, "warm invoke of the iris MLP app on a worker, p50 (one client, keep-alive)", w50, "ms", 25),
            Figure(B, "warm invoke on the control plane p50, taking turns with the worker's", b50, "ms"),
            Figure(B, "warm invoke on a worker p50 / on the control plane p50", w50 / b50 if w50 and b50 else None,
                   "x", 1.5, note="the invokes taking turns"),
            Figure(B, "cold first invoke on a worker (fetches the weights, starts the process)", worker_cold, "ms"),
            Figure(B, "cold first invoke (starts the serving process)", cold, "ms"),
            Figure(B, "cold first invoke / fresh `import torch`", cold / imp if imp else None, "x", 1.2,
                   note=f"import torch p50 {imp:.0f} ms" if imp else ""),
            Figure(B, "the same graph behind /api/graph/run/{name} (a run each), p50", gr50, "ms"),
            Figure(B, "/api/graph/run/{name} p50 / warm invoke p50", gr50 / p50 if gr50 and p50 else None, "x")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

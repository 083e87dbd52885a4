"""Benchmark: a 100-trial study on simulated agents (issue #27: the sampler's own overhead < 5 % of the
wall time).

One control plane (no local slot: `any` goes to the simulated agents only) and ``--agents`` simulated
agents in this process, each a real ``/ws/worker`` connection (bench/agents.py's ``Fleet``) that answers
every run it is given at once: its objective metric, a known function of the trial's param read from
the assigned graph (``(value - 1.3)^2``, minimum 0), then running and succeeded. A TPE study of
``--trials`` trials, ``--parallelism`` at a time, is created and followed to its end. Measured:

- the study's wall time, creation to its last trial recorded;
- the same study's wall time with Optuna's random sampler, which costs next to nothing: the sampler's
  overhead is what TPE adds to the wall time, as a share of it (the goal). Each sampler runs ``--rounds``
  times in turns and its least wall time is kept;
- the time spent inside Optuna (asking, telling; ``sampler_s`` of ``GET /api/studies/{id}``), and the
  CPU time of it (``sampler_cpu_s``: without the waits for a core another process had), for
  information: it runs in the sampler's own process, beside the event loop, so it is not all added to the
  wall time. With instant runs this raw share says little: the faster the control plane's own work per trial,
  the larger it gets;
- the best value found (the function's minimum is 0).

Once with runs answered at once (the study's wall time is then the control plane's own work per trial,
dispatch and recording), and once with runs of 0.1 s, still far shorter than any training run a study is for.

    .venv/bin/python bench/studies.py [--trials 100] [--parallelism 4] [--agents 4] [--rounds 3]
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from agents import CATALOG, Agent, Fleet, close_all
from common import Figure, parser, report, say, server, tiny_graph

from cdui import __version__
from cdui.wire import protocol

B = "studies"
TARGET = 1.3


class StudyFleet(Fleet):
    """Agents whose runs report the objective of the trial's param before they succeed, ``run_s`` after
    they were given."""

    run_s = 0.0
    tasks: set[asyncio.Task[None]] = set()

    async def read(self, a: Agent) -> None:
        assert a.ws is not None
        async for msg in a.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            m = protocol.parse_server_message(msg.data)
            if isinstance(m, protocol.Assign):
                a.runs += 1
                value = next(float(n["data"]["params"].get("value", 0)) for n in m.job.graph["nodes"]
                             if n["id"] == "n")
                if self.run_s:
                    t = asyncio.create_task(self.answer(a, m.run_id, (value - TARGET) ** 2, self.run_s))
                    self.tasks.add(t)
                    t.add_done_callback(self.tasks.discard)
                else:
                    await self.answer(a, m.run_id, (value - TARGET) ** 2)
            elif isinstance(m, protocol.Ack) and m.acked >= 3:
                self.done[m.run_id] = time.perf_counter()
                self.progress.set()

    async def answer(self, a: Agent, run_id: str, loss: float, after: float = 0.0) -> None:
        assert a.ws is not None
        if after:
            await asyncio.sleep(after)
        now = time.time()
        evs = [{"src_seq": 1, "kind": "status", "data": {"status": "running", "pid": 1, "device": "cpu"}, "at": now},
               {"src_seq": 2, "kind": "metric", "data": {"name": "loss", "value": loss, "step": 1}, "at": now},
               {"src_seq": 3, "kind": "status", "data": {"status": "succeeded", "error": None}, "at": now}]
        for text in protocol.encode_events(run_id, evs):
            await a.ws.send_str(text)


async def main_async(trials: int, parallelism: int, n_agents: int, run_s: float,
                     sampler: str = "tpe") -> list[Any]:
    env = {"CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "local/cpu=0"}
    with server(env) as srv:
        async with aiohttp.ClientSession() as http:
            f = StudyFleet(srv.url, srv.token, http)
            f.run_s = run_s
            agents = [Agent(f"s{i:03d}") for i in range(n_agents)]
            tok = (await f.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": n_agents}))["token"]
            ws_url = srv.url.replace("http", "ws", 1) + "/ws/worker"
            for a in agents:
                async with http.post(srv.url + "/api/workers/enroll", json={
                        "token": tok, "name": a.name, "devices": ["cpu"], "version": __version__,
                        "machine_id": "bench-" + a.name}) as r:
                    a.credential = (await r.json())["credential"]
                a.ws = await http.ws_connect(ws_url, headers={"Authorization": f"Bearer {a.credential}"},
                                             max_msg_size=protocol.MAX_MESSAGE)
                await a.ws.send_str(protocol.Hello(__version__, a.name, ["cpu"], {}, "bench-" + a.name,
                                                   catalog=CATALOG).to_json())
                await a.ws.receive(timeout=120)
                a.reader = asyncio.create_task(f.read(a))
            say(f"{n_agents} agents connected")

            async def study_of(n: int) -> tuple[dict[str, Any], dict[str, Any]]:
                study = await f.call("POST", "/api/studies", {
                    "graph": tiny_graph("study"), "axes": {"n.value": {"uniform": [-5.0, 5.0]}},
                    "objective": {"metric": "loss", "goal": "min"}, "n_trials": n, "parallelism": parallelism,
                    "seed": 1, "sampler": {"name": sampler}, "options": {"target": "any", "device": "cpu"}})
                while True:
                    s: dict[str, Any] = await f.call("GET", f"/api/studies/{study['id']}")
                    if s["status"] in ("finished", "stopped"):
                        return study, s
                    f.progress.clear()
                    try:
                        await asyncio.wait_for(f.progress.wait(), 1.0)
                    except TimeoutError:
                        pass
            # A study of one trial first: the control plane imports Optuna (a second or so) at its first study,
            # which a lab's every later study does not pay; neither sampler's figure should hold it.
            await study_of(1)
            f.done.clear()
            t0 = time.perf_counter()
            study, s = await study_of(trials)
            wall = max(f.done.values(), default=time.perf_counter()) - t0
            complete = sum(1 for t in s["trials"] if t["state"] == "complete")
            say(f"{complete} of {trials} trials complete in {wall:.1f} s; best {s['best']}")
            await close_all(agents)
            return [wall, float(s["sampler_s"] or 0), float(s["best"]["objective"]), json.dumps(s["best"]["params"]),
                    complete, float(s["sampler_cpu_s"] or 0)]


def figures(trials: int, parallelism: int, n_agents: int, run_s: float, rounds: int) -> list[Figure]:
    """TPE and a near-free sampler (random) in turns, ``rounds`` times each: the sampler's overhead is what TPE
    adds to the wall time of the same study, the least wall time of each kept (the machine's other work only
    ever adds)."""
    got: dict[str, list[list[Any]]] = {"tpe": [], "random": []}
    for _ in range(rounds):
        for sampler in ("tpe", "random"):
            got[sampler].append(asyncio.run(main_async(trials, parallelism, n_agents, run_s, sampler)))
    tpe = min(got["tpe"], key=lambda r: r[0])
    rnd = min(got["random"], key=lambda r: r[0])
    runs = f"runs of {run_s:g} s" if run_s else "instant runs"
    overhead = 100 * (tpe[0] - rnd[0]) / tpe[0]
    return [
        Figure(B, f"{trials}-trial TPE study, {n_agents} simulated agents, {parallelism} at once, {runs}", tpe[0], "s",
               note=f"{tpe[4]} complete; creation -> last trial recorded; least of {rounds}"),
        Figure(B, f"the same study with the random sampler ({runs})", rnd[0], "s",
               note=f"least of {rounds}: a sampler that costs next to nothing"),
        Figure(B, f"the sampler's overhead: TPE's extra wall time, share of its wall time ({runs})", overhead, "%", 5,
               note=f"({tpe[0]:.2f} - {rnd[0]:.2f}) / {tpe[0]:.2f} s"),
        Figure(B, f"time inside Optuna, share of the wall time ({runs})", 100 * tpe[1] / tpe[0], "%",
               note=f"{tpe[1]:.2f} s asking and telling, in the sampler's own process"),
        Figure(B, f"CPU time inside Optuna, share of the wall time ({runs})", 100 * tpe[5] / tpe[0], "%",
               note=f"{tpe[5]:.2f} s of the sampler process's CPU (the time inside less its waits for a core)"),
        Figure(B, f"the best objective found (the minimum is 0; {runs})", tpe[2], "", note=tpe[3]),
    ]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--parallelism", type=int, default=4)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--run-s", type=float, action="append", default=None,
                   help="how long each simulated run takes (repeat for more studies; default: 0 and 0.1)")
    p.add_argument("--rounds", type=int, default=3,
                   help="studies of each sampler (TPE, random) in turns; the least wall time of each is kept")
    a = p.parse_args()
    if a.smoke:
        a.trials, a.parallelism, a.agents, a.rounds = 6, 2, 2, 1
    figs: list[Figure] = []
    for run_s in a.run_s or [0.0, 0.1]:
        figs += figures(a.trials, a.parallelism, a.agents, run_s, a.rounds)
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

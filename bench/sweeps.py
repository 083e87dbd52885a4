"""Benchmark: sweeps (issue #27, "Speed and scale").

One control plane process, its state in a temporary folder; the graph is the iris example
(14 nodes), which the simulated agents never run. Measured:

- creating a 1,000-variant grid sweep (``POST /api/sweeps`` until its answer, every variant checked
  and stored, the first ``max_running`` released as runs) and a 10,000-variant one;
- the dispatch rate of a 1,000-variant sweep's variants on simulated agents (bench/agents.py's fleet:
  real ``/ws/worker`` connections, each run answered succeeded at once), its ``max_running`` twice the
  agents, against the rate of a backlog of 1,000 plain runs on the same agents (the normal rate);
- ``GET /api/runs`` and ``/api/health`` p95 while the sweep runs (bench/scale.py's probe process),
  and the event loop's lag p99 that health reports;
- 100 variants ending at once (every agent holding its run, then all answering together): the time
  until the next 100 variants are released and assigned.

    .venv/bin/python bench/sweeps.py [--variants 1000] [--big 10000] [--agents 100]
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sized
from pathlib import Path
from typing import Any

import aiohttp
from agents import CATALOG, Agent, Fleet, close_all
from common import REPO, Figure, cpu_s, parser, pct, raise_nofile, report, say, server

from cdui import __version__
from cdui.wire import protocol

B = "sweeps"
CREATE_GOAL_S = 2.0   # the issue: a 1,000-variant grid is created in < 2 s
P95_GOAL_MS = 50.0    # the issue: the runs list and health stay below 50 ms p95 while it runs


def iris() -> dict[str, Any]:
    return json.loads((REPO / "examples" / "iris_train.json").read_text())


def grid_axes(n: int) -> dict[str, list[Any]]:
    """Three axes of the iris graph whose grid has ``n`` variants (n a multiple of 100, or below 100)."""
    if n < 100:
        return {"optimizer.lr": [round(0.001 * (i + 1), 6) for i in range(n)]}
    lrs = [round(0.001 * (i + 1), 6) for i in range(10)]
    batches = [8 * (i + 1) for i in range(10)]
    return {"optimizer.lr": lrs, "train-loader.batch_size": batches, "train.epochs": list(range(1, n // 100 + 1))}


async def connect(f: Fleet, agents: list[Agent], url: str) -> None:
    tok = (await f.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": len(agents)}))["token"]
    ws_url = url.replace("http", "ws", 1) + "/ws/worker"

    async def one(a: Agent) -> None:
        async with f.http.post(url + "/api/workers/enroll", json={
                "token": tok, "name": a.name, "devices": ["cpu"], "version": __version__,
                "machine_id": "bench-" + a.name}) as r:
            if r.status != 201:
                raise RuntimeError(f"enroll {a.name}: {r.status} {await r.text()}")
            a.credential = (await r.json())["credential"]
        a.ws = await f.http.ws_connect(ws_url, headers={"Authorization": f"Bearer {a.credential}"},
                                       max_msg_size=protocol.MAX_MESSAGE, autoping=True, heartbeat=None)
        await a.ws.send_str(protocol.Hello(__version__, a.name, ["cpu"], {}, "bench-" + a.name,
                                           catalog=CATALOG).to_json())
        msg = await a.ws.receive(timeout=120)
        if not isinstance(protocol.parse_server_message(msg.data), protocol.Welcome):
            raise RuntimeError(f"{a.name}: {str(msg.data)[:300]}")
        a.reader = asyncio.create_task(f.read(a))
    await f.each(agents, one, 16)


async def beat(agents: list[Agent], stop: asyncio.Event, every: float) -> None:
    while not stop.is_set():
        for a in agents:
            await a.beat()
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass


async def wait_done(f: Fleet, ids: list[str], timeout: float) -> None:
    """Until every run of ``ids`` is in the fleet's done runs (others may end meanwhile: a variant the creation
    step released, whose sweep was deleted, can still reach an agent)."""
    deadline = time.perf_counter() + timeout
    while not all(r in f.done for r in ids):
        f.progress.clear()
        if all(r in f.done for r in ids):
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"{sum(r in f.done for r in ids)} of {len(ids)} runs in {timeout} s")
        try:
            await asyncio.wait_for(f.progress.wait(), min(left, 1))
        except TimeoutError:
            pass


async def wait_count(f: Fleet, what: Sized, n: int, timeout: float) -> None:
    """Until ``what`` (the fleet's assigned or done runs) holds ``n``."""
    deadline = time.perf_counter() + timeout
    while len(what) < n:
        f.progress.clear()
        if len(what) >= n:
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"{len(what)} of {n} runs in {timeout} s")
        try:
            await asyncio.wait_for(f.progress.wait(), min(left, 1))
        except TimeoutError:
            pass


class Probe:
    """bench/scale.py's probe process: /api/health?detail=1 and GET /api/runs every 20 ms until stopped."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.tmp = tempfile.TemporaryDirectory(prefix="cdui-probe-")
        self.out, self.stop_file = Path(self.tmp.name) / "probe.json", Path(self.tmp.name) / "stop"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("scale.py")), "--probe", self.url, str(self.out),
            str(self.stop_file), env={**os.environ, "CDUI_BENCH_PROBE_TOKEN": self.token})
        deadline = time.perf_counter() + 120
        while not Path(str(self.out) + ".ready").exists():
            if self.proc.returncode is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"the probe process did not start (exit {self.proc.returncode})")
            await asyncio.sleep(0.05)

    async def stop(self) -> dict[str, list[float]]:
        assert self.proc is not None
        self.stop_file.touch()
        if await self.proc.wait() != 0:
            raise RuntimeError(f"the probe process failed (exit {self.proc.returncode})")
        out: dict[str, list[float]] = json.loads(self.out.read_text())
        self.tmp.cleanup()
        return out


async def create(f: Fleet, n: int, max_running: int) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    sweep = await f.call("POST", "/api/sweeps", {"graph": iris(), "axes": grid_axes(n), "max_running": max_running,
                                                 "options": {"target": "any", "device": "cpu"}})
    took = time.perf_counter() - t0
    if sweep["total"] != n:
        raise RuntimeError(f"the sweep has {sweep['total']} variants, not {n}")
    return took, sweep


async def remove(f: Fleet, sweep_id: str) -> None:
    """Stop a sweep, wait for its runs to end, delete it and its runs."""
    await f.call("POST", f"/api/sweeps/{sweep_id}/stop")
    for _ in range(600):
        s = await f.call("GET", "/api/sweeps?limit=20")
        if all(x["status"] == "stopped" for x in s["sweeps"] if x["id"] == sweep_id):
            break
        await asyncio.sleep(0.1)
    await f.call("DELETE", f"/api/sweeps/{sweep_id}")


async def main_async(n: int, big: int, n_agents: int) -> list[Figure]:
    figs: list[Figure] = []
    # local/cpu=0: `any` goes to the simulated agents only, never to this server.
    env = {"CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "local/cpu=0"}
    with server(env) as srv:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            f = Fleet(srv.url, srv.token, http)
            # Creation, no agent connected yet: the released variants wait in the run queue; each sweep is
            # stopped and deleted after.
            await create(f, 1, 1)  # the first submit's one-off costs (preset library, imports) not counted
            for size in (n, big):
                took, sweep = await create(f, size, 4)
                figs.append(Figure(B, f"create a {size:,}-variant grid sweep (POST /api/sweeps)", took, "s",
                                   CREATE_GOAL_S if size <= 1000 else CREATE_GOAL_S * size / 1000,
                                   note="every variant checked and stored, 4 released" +
                                        ("" if size <= 1000 else "; goal scaled from 1,000's")))
                say(f"created {size} in {took:.2f} s")
                await remove(f, sweep["id"])
            agents = [Agent(f"a{i:04d}") for i in range(n_agents)]
            await connect(f, agents, srv.url)
            stop_beat = asyncio.Event()
            pulse = asyncio.create_task(beat(agents, stop_beat, 5.0))
            say(f"{n_agents} agents connected")
            # The normal rates: n plain runs of the same graph submitted (16 requests in flight) while every
            # agent is free, from the first submit to the last recorded succeeded, its checks included as a
            # variant's are; and a backlog of n plain runs behind drained agents, dispatch alone.
            plain: list[str] = []

            async def submit(_: int) -> None:
                r = await f.call("POST", "/api/runs", {"graph": iris(), "options": {"target": "any", "device": "cpu"}})
                plain.append(r["id"])
            done0 = len(f.done)
            t0, c0 = time.perf_counter(), cpu_s(srv.pid)
            await f.each(list(range(n)), submit, 16)
            await wait_done(f, plain, 900)
            piped = n / (max(f.done[r] for r in plain) - t0)
            piped_cpu = (cpu_s(srv.pid) - c0) * 1e3 / n
            say(f"plain runs submitted to free agents: {piped:.0f} runs/s")
            for a in agents:
                await f.call("POST", f"/api/workers/{a.name}/drain")
            plain = []
            await f.each(list(range(n)), submit, 16)
            done0 = len(f.done)
            c0 = cpu_s(srv.pid)
            await asyncio.gather(*(f.call("POST", f"/api/workers/{a.name}/undrain") for a in agents))
            await wait_done(f, plain, 900)
            ref_cpu = (cpu_s(srv.pid) - c0) * 1e3 / n
            ref = n / (max(f.done[r] for r in plain) - min(f.assigned[r] for r in plain))
            say(f"plain backlog: {ref:.0f} runs/s")
            # The sweep: max_running twice the agents; every agent holds its first run, so that all of them
            # end at once; then every run is answered at once.
            f.holding = True
            assigned0, done0 = len(f.assigned), len(f.done)
            probe = Probe(srv.url, srv.token)
            await probe.start()
            took, sweep = await create(f, n, 2 * n_agents)
            await wait_count(f, f.held, min(n_agents, n), 300)
            held = list(f.held)
            await asyncio.sleep(1.0)  # the rest of the first max_running queued behind them
            t0, c0 = time.perf_counter(), cpu_s(srv.pid)
            before = len(f.assigned)
            f.holding = False
            await f.each(held, lambda x: f.finish(*x), 64)
            await wait_count(f, f.assigned, before + len(held), 300)
            burst = time.perf_counter() - t0
            await wait_count(f, f.done, done0 + n, 900)
            sweep_cpu = (cpu_s(srv.pid) - c0) * 1e3 / n
            probed = await probe.stop()
            mine = list(f.assigned)[assigned0:]
            rate = n / (max(f.done[r] for r in mine) - t0)
            figs.append(Figure(B, f"dispatch rate of a {n:,}-variant sweep's variants", rate, "runs/s",
                               note=f"{n_agents} simulated agents, max_running {2 * n_agents}; from the agents "
                                    "answering the runs they held to the last variant recorded succeeded"))
            figs.append(Figure(B, f"{n:,} plain runs submitted to free agents, rate (the normal rate)", piped,
                               "runs/s", note="the same agents and graph, 16 submits in flight; first submit -> "
                                              "last recorded succeeded, the submits' checks included"))
            # "At the normal dispatch rate": the two rates are measured one after the other, a few seconds each,
            # and swing by more than 10 % from one run to the next on a shared machine (1.23 and 0.96 in two quiet
            # runs of the same code), so the goal is the tolerance issue #24 gives "the same rate" of a backlog.
            figs.append(Figure(B, "sweep's rate / the normal rate", rate / piped, "x", 0.9, better="higher",
                               note="goal: the same rate within the two measurements' noise (0.9, as issue #24's "
                                    "backlog rate against no backlog)"))
            figs.append(Figure(B, f"plain runs' dispatch rate, backlog of {n:,} (dispatch alone)", ref, "runs/s",
                               note="submitted before the window, so their checks are not in it"))
            figs.append(Figure(B, "control-plane CPU per variant (released, dispatched, ended)", sweep_cpu, "ms",
                               note="the least noisy figure on a loaded machine"))
            figs.append(Figure(B, "control-plane CPU per plain run (submitted, dispatched, ended)", piped_cpu, "ms"))
            figs.append(Figure(B, "control-plane CPU per plain run of a backlog (dispatched, ended)", ref_cpu, "ms",
                               note="its submit's checks not included: they were made before the window"))
            figs.append(Figure(B, f"{len(held)} variants ending at once -> the next {len(held)} assigned", burst,
                               "s", note="every agent answers the run it held together"))
            figs.append(Figure(B, "/api/health p95 while the sweep runs", pct(probed["health"], 95), "ms",
                               P95_GOAL_MS))
            figs.append(Figure(B, "GET /api/runs p95 while the sweep runs", pct(probed["listing"], 95), "ms",
                               P95_GOAL_MS))
            figs.append(Figure(B, "event-loop lag p99 while the sweep runs (health's)",
                               max(probed["lag"]) if probed["lag"] else None, "ms"))
            t0 = time.perf_counter()
            await f.call("GET", f"/api/sweeps/{sweep['id']}")
            figs.append(Figure(B, f"GET /api/sweeps/{{id}} of {n:,} finished variants", time.perf_counter() - t0,
                               "s"))
            stop_beat.set()
            await pulse
            await close_all(agents)
    return figs


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--variants", type=int, default=1000)
    p.add_argument("--big", type=int, default=10000)
    p.add_argument("--agents", type=int, default=100)
    a = p.parse_args()
    if a.smoke:
        a.variants, a.big, a.agents = 40, 200, 8
    raise_nofile()
    report(asyncio.run(main_async(a.variants, a.big, a.agents)), a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

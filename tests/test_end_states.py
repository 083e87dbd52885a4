"""Runs end in the state that actually happened, and every event of them can be read.

Real control plane processes, real runs, real WebSockets:

- a run with far more events than one page of the events route or of a
  WebSocket backlog is read back completely, gapless and exactly once, by
  both interfaces, including across the seam between backlog and live events;
- an assignment lost in transit (the link drops between dispatch and the agent
  receiving it) puts the run back in the queue at its old place; a run the
  worker did report on and then no longer holds ends ``interrupted``.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from procs import Proc, ServerProc, edge, env_for, graph, node, trig, wait_for, wait_run

sys.path.insert(0, str(Path(__file__).parent / "inproc"))
from harness import FakeAgent  # noqa: E402

# Every test here drives real cdui processes (server, agents, run subprocesses): the e2e tier.
pytestmark = pytest.mark.e2e

# A node that logs N numbered lines, as fast as the run can write them; with a
# gate it logs the first `before_gate` lines, then waits for the gate file: a
# test can then act while the run is half done, without timing anything.
CHATTER = '''
import os
import time
from cdui.nodes.base import Node, Param, Port


class Chatter(Node):
    NODE_NAME = "Chatter"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("lines", "int", 10), Param("before_gate", "int", 0), Param("gate", "string", ""),
                Param("token", "secret", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        n, before, gate = int(params["lines"]), int(params["before_gate"]), str(params["gate"])
        if params["token"]:
            ctx.log(f"secret of {len(params['token'])} characters")
        for i in range(n):
            if gate and i == before:
                while not os.path.exists(gate):
                    if ctx.should_stop():
                        return {"value": float(i)}
                    time.sleep(0.05)
            ctx.log(f"line {i}")
        return {"value": float(n)}
'''


def install_chatter(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "chatter.py").write_text(CHATTER)


def chatter_graph(lines: int, before_gate: int = 0, gate: str = "", token: str = "") -> dict[str, Any]:
    return graph([node("start", "Start"), node("chat", "Chatter", lines=lines, before_gate=before_gate, gate=gate,
                                               token=token),
                  node("print", "Print", label="lines")],
                 [trig("start", "chat"), edge("chat", "value", "print", "value")], name=f"chatter {lines}")


def chatter_lines(evs: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["message"] for e in evs
            if e["kind"] == "log" and str(e["data"].get("message", "")).startswith("line ")]


def http_pages(server: ServerProc, run_id: str) -> tuple[list[dict[str, Any]], int]:
    """Every event through the events route, following its cursor; (events, pages)."""
    out: list[dict[str, Any]] = []
    after, pages = 0, 0
    while True:
        r = server.raw("GET", f"/api/runs/{run_id}/events?after={after}")
        assert r.status == 200, r.body[:300]
        page = json.loads(r.body)
        pages += 1
        out += page
        nxt = r.headers.get("X-CodefyUI-Next-After")
        if nxt is None:
            assert "Link" not in r.headers, r.headers
            return out, pages
        assert int(nxt) == page[-1]["seq"], (nxt, page[-1])
        assert r.headers["Link"] == f'</api/runs/{run_id}/events?after={nxt}&limit=10000>; rel="next"'
        after = int(nxt)


async def ws_read_all(server: ServerProc, run_id: str, after: int = 0,
                      gate: Path | None = None) -> list[dict[str, Any]]:
    """Every message of /ws/runs/{id} until the server closes it; opens ``gate`` once connected."""
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{server.url}/ws/runs/{run_id}?token={server.token}&after={after}",
                                      max_msg_size=0) as ws:
            if gate is not None:
                gate.write_text("open")
            async for msg in ws:
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                out.append(json.loads(msg.data))
    return out


def test_events_past_10000_are_all_read_by_http_pages_and_websocket(tmp_path):
    """API: 25,000 log lines come back through the events route's pages and the live stream,
    gapless from 1 and each exactly once, with the backlog/live seam crossed while the run logs."""
    s = ServerProc(tmp_path)
    install_chatter(s.data_dir)
    s.start()
    try:
        gate = tmp_path / "gate"
        run = s.submit(chatter_graph(25000, before_gate=15000, gate=str(gate)))
        # Half way: more than one page is stored, the run waits at its gate.
        wait_for(lambda: (s.run(run["id"])["last_seq"] or 0) >= 15000, 180, 0.2, "15,000 events stored")
        live = asyncio.run(ws_read_all(s, run["id"], gate=gate))
        done = wait_run(s, run["id"], timeout=300)
        assert done["status"] == "succeeded", done
        n = done["last_seq"]
        assert n > 25000

        evs, pages = http_pages(s, run["id"])
        assert [e["seq"] for e in evs] == list(range(1, n + 1))
        assert pages == (n + 9999) // 10000
        assert chatter_lines(evs) == [f"line {i}" for i in range(25000)]

        assert [e["seq"] for e in live] == list(range(1, n + 1)), "live stream: gapless, once each, in order"
        assert live == evs

        backlog = asyncio.run(ws_read_all(s, run["id"]))
        assert backlog == evs, "a stream opened after the end sends the whole log, in pages"
        tail = asyncio.run(ws_read_all(s, run["id"], after=12345))
        assert tail == evs[12345:]

        r = s.raw("GET", f"/api/runs/{run['id']}/events?after=0&limit=10001")
        assert r.status == 400 and "limit='10001'" in json.loads(r.body)["error"]["message"]
        r = s.raw("GET", f"/api/runs/{run['id']}/events?after=24990&limit=5")
        assert [e["seq"] for e in json.loads(r.body)] == list(range(24991, 24996))
        assert r.headers["X-CodefyUI-Next-After"] == "24995"
    finally:
        s.stop()


# -- assignments lost in transit ------------------------------------------------------


def real_agent(tmp: Path, server: ServerProc, name: str = "w1") -> Proc:
    """A real agent enrolled as ``name`` with a reissue token (the fake's credential is superseded)."""
    tok = server.call("POST", f"/api/workers/{name}/reissue", {"ttl_s": 3600}, expect=201)["token"]
    a = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", server.url, "--name", name,
              "--devices", "cpu", "--foreground", "--token", tok],
             env_for(tmp / f"agent-{name}", tmp / f"agent-{name}-data"), tmp / f"agent-{name}.log",
             name=f"agent-{name}")
    a.spawn()
    return a


def lost_server(tmp_path: Path) -> ServerProc:
    # A long resume grace: the run must be requeued or interrupted by the reconnect, never by the grace.
    s = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_RESUME_GRACE_S": "600"})
    install_chatter(s.data_dir)
    return s.start()


def test_assignment_lost_in_transit_is_requeued_at_its_place_then_succeeds(tmp_path):
    """DISC: the link drops between dispatch and the agent receiving `assign`; the worker
    comes back without the run and never sent an event of it -> the run is queued again,
    ahead of a later run, and then succeeds on a real agent."""
    s = lost_server(tmp_path)
    agent = None
    try:
        async def lose_it() -> tuple[str, str]:
            fake = await FakeAgent(s).enroll()
            try:
                await fake.connect()
                # A secret lives in memory only; a requeued run must still have it when it finally runs.
                run = await asyncio.to_thread(s.submit, chatter_graph(3, token="s3cret-value-42"),
                                              {"target": {"worker": "w1"}})
                assign = await fake.assignment(120)
                assert assign["run_id"] == run["id"]
                await fake.drop()  # the assignment never "arrived": no answer, no event
                await asyncio.to_thread(wait_run, s, run["id"], {"disconnected"}, 60)
                later = await asyncio.to_thread(s.submit, chatter_graph(3), {"target": {"worker": "w1"}})
                # Draining keeps the requeued run off this fake worker once it is back.
                await asyncio.to_thread(s.call, "POST", "/api/workers/w1/drain", None)
                welcome = await fake.connect(held=[])
                assert welcome["runs"] == {}
                await asyncio.to_thread(wait_run, s, run["id"], {"queued"}, 60)
                return run["id"], later["id"]
            finally:
                await fake.close()
        run_id, later_id = asyncio.run(lose_it())

        r = s.run(run_id)
        assert (r["status"], r["worker_id"], r["device"], r["started_at"]) == ("queued", None, None, None), r
        evs = s.events(run_id)
        requeued = [e for e in evs if e["kind"] == "run_warning" and e["data"].get("kind") == "requeued"]
        assert len(requeued) == 1
        assert "assignment never reached worker w1" in requeued[0]["data"]["message"]
        assert not [e for e in evs if e["kind"] == "status" and e["data"].get("status") == "interrupted"]

        s.call("POST", "/api/workers/w1/undrain")
        agent = real_agent(tmp_path, s)
        first = wait_run(s, run_id, timeout=180)
        assert (first["status"], first["worker_id"]) == ("succeeded", "w1"), first
        second = wait_run(s, later_id, timeout=180)
        assert second["status"] == "succeeded", second
        # First come, first served: the requeued run kept its place ahead of the later one.
        assert first["started_at"] < second["started_at"], (first, second)
        evs = s.events(run_id)
        assert chatter_lines(evs) == ["line 0", "line 1", "line 2"]
        assert [e["data"]["message"] for e in evs if e["kind"] == "log"
                and "secret of" in str(e["data"].get("message"))] == ["secret of 15 characters"]
    finally:
        if agent is not None:
            agent.stop()
        s.stop()


def test_worker_that_reported_on_a_run_and_returns_without_it_interrupts_it(tmp_path):
    """An adopted run (docs/remote-workers.md#when-the-control-plane-restarts): the worker did send
    events of the run, then reconnects without it ->
    the run ends `interrupted` at once (it ran; running it again could repeat its effects)."""
    s = lost_server(tmp_path)
    try:
        async def report_then_lose() -> str:
            fake = await FakeAgent(s).enroll()
            try:
                await fake.connect()
                run = await asyncio.to_thread(s.submit, chatter_graph(3), {"target": {"worker": "w1"}})
                assign = await fake.assignment(120)
                assert await fake.status(assign["run_id"], "running", pid=1) == 1
                assert fake.acked[run["id"]] == 1
                await fake.drop()
                await asyncio.to_thread(wait_run, s, run["id"], {"disconnected"}, 60)
                await fake.connect(held=[])
                await asyncio.to_thread(wait_run, s, run["id"], {"interrupted"}, 60)
                return run["id"]
            finally:
                await fake.close()
        run_id = asyncio.run(report_then_lose())
        r = s.run(run_id)
        assert r["status"] == "interrupted", r
        assert r["error"] == "worker w1 reconnected without the run (its agent restarted)", r
        assert not [e for e in s.events(run_id) if e["data"].get("kind") == "requeued"]
    finally:
        s.stop()

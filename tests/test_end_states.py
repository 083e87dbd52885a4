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
from pathlib import Path
from typing import Any

import aiohttp

from procs import ServerProc, edge, graph, node, trig, wait_for, wait_run

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
        return [Param("lines", "int", 10), Param("before_gate", "int", 0), Param("gate", "string", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        n, before, gate = int(params["lines"]), int(params["before_gate"]), str(params["gate"])
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


def chatter_graph(lines: int, before_gate: int = 0, gate: str = "") -> dict[str, Any]:
    return graph([node("start", "Start"), node("chat", "Chatter", lines=lines, before_gate=before_gate, gate=gate),
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


async def ws_read_all(server: ServerProc, run_id: str, after: int = 0, gate: Path | None = None) -> list[dict[str, Any]]:
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

"""The floor under the heartbeat figure: a bare aiohttp WebSocket server's CPU for the same traffic.

``bench/agents.py`` measures the control plane's CPU while N agents heartbeat every
interval, spread over it, so that each message arrives alone. This script serves
the same traffic with a server that does nothing with a message but decode its
JSON and note the time (``bare``), or that does so inside aiohttp's message queue,
without waking a task or resolving a future per message (``queue``: an experiment
on aiohttp's internals, for the notes; cdui does not do this). Run both in the same
minutes as ``bench/agents.py``: the difference between cdui's figure and ``bare``
is what cdui adds; the difference between ``bare`` and ``queue`` is what a task and a
future per message cost.

    .venv/bin/python bench/ws_floor.py [--agents 5000] [--seconds 10] [--interval 10] [--modes bare,queue,bare,queue]
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from typing import Any

import aiohttp
from common import Figure, cpu_s, free_port, parser, raise_nofile, report, say

B = "agents"


def serve(mode: str, port: int) -> None:
    """The server (a process of its own): one handler per connection, as the control plane has."""
    import gc

    from aiohttp import web
    seen: dict[int, float] = {}
    response: Any = web.WebSocketResponse
    if mode == "queue":
        from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader

        class Noted(WebSocketDataQueue):  # type: ignore[misc]
            def feed_data(self, data: Any, size: int) -> None:
                if data.type is aiohttp.WSMsgType.TEXT:
                    json.loads(data.data)
                    seen[id(self)] = time.monotonic()
                    return
                WebSocketDataQueue.feed_data(self, data, size)

        class Tapped(web.WebSocketResponse):
            def _post_start(self, request: Any, protocol: Any, writer: Any) -> None:
                super()._post_start(request, protocol, writer)
                queue = Noted(request._protocol, 2 ** 16, loop=self._loop)
                self._reader = queue
                self._parser = WebSocketReader(queue, self._max_msg_size, False, True)  # type: ignore[call-arg]
                request.protocol._payload_parser = None
                request.protocol.set_parser(self._parser, data_received_cb=None)
        response = Tapped

    async def handler(request: web.Request) -> Any:
        ws = response(heartbeat=None)
        await ws.prepare(request)
        async for msg in ws:
            json.loads(msg.data)
            seen[id(ws)] = time.monotonic()
        return ws
    app = web.Application()
    app.router.add_get("/ws", handler)
    gc.freeze()
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def measure(mode: str, n: int, seconds: float, interval: float) -> Figure:
    """The server of ``mode`` in a process of its own, its CPU while ``n`` clients each send every ``interval``."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(port)], stdin=subprocess.DEVNULL)
    try:
        share, took = asyncio.run(_clients(proc.pid, port, n, seconds, interval))
    finally:
        proc.terminate()
        proc.wait(10)
    what = "a bare aiohttp server" if mode == "bare" else "aiohttp, each message noted in its queue (no task step)"
    say(f"{mode}: {share:.2f} % of a core")
    return Figure(B, f"{what}: CPU for {n} clients each sending every {interval:g} s", share, "% of a core",
                  note=f"over {took:.0f} s, {n / interval:.0f} messages/s")


async def _clients(pid: int, port: int, n: int, seconds: float, interval: float) -> tuple[float, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        deadline = time.monotonic() + 30
        while True:
            try:
                first = await http.ws_connect(f"http://127.0.0.1:{port}/ws", heartbeat=None)
                break
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        conns = [first]
        lanes = asyncio.Semaphore(200)

        async def connect() -> None:
            async with lanes:
                conns.append(await http.ws_connect(f"http://127.0.0.1:{port}/ws", heartbeat=None))
        await asyncio.gather(*(connect() for _ in range(n - 1)))
        text = json.dumps({"type": "heartbeat", "runs": [], "labels": {}})
        offsets = sorted((random.uniform(0, interval), i) for i in range(n))
        await asyncio.sleep(1)
        c0, t0 = cpu_s(pid), time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < seconds:
            for off, i in offsets:
                if (wait := t0 + k * interval + off - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                await conns[i].send_str(text)
            k += 1
        took = time.perf_counter() - t0
        share = (cpu_s(pid) - c0) / took * 100
        for ws in conns:
            await ws.close()
    return share, took


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return 0
    p = parser(__doc__)
    p.add_argument("--agents", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=10.0)
    p.add_argument("--modes", default="bare,queue,bare,queue")
    a = p.parse_args()
    if a.smoke:
        a.agents, a.seconds, a.interval, a.modes = 20, 0.5, 0.5, "bare,queue"
    raise_nofile()
    figs = [measure(m, a.agents, a.seconds, a.interval) for m in a.modes.split(",")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

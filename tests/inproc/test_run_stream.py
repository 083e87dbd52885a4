"""The live event stream (/ws/runs/{id}) of a watcher that falls behind.

Events are broadcast to each watcher through a bounded queue; a watcher more
than its bound behind gets the rest from the store. These tests prove the
bound holds and that such a watcher still gets every event once, in order."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import FakeAgent, Plane

from cdui.plane import subscription
from cdui.plane.subscription import Subscription


def test_a_full_subscription_drops_and_says_so() -> None:
    async def go() -> None:
        q = Subscription(maxsize=4)
        for i in range(10):
            q.put_nowait({"seq": i + 1})
        assert (q.qsize(), q.overflowed, q.dropped) == (4, True, 6)
        assert [q.get_nowait()["seq"] for _ in range(4)] == [1, 2, 3, 4]
    asyncio.run(go())


async def test_a_watcher_behind_its_bound_still_gets_every_event_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscription, "MAX_QUEUED", 4)
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run = await cp.submit({"target": {"worker": agent.name}})
            rid = run["id"]
            await agent.assignment()
            await agent.status(rid, "running", pid=4242)

            got: list[dict[str, Any]] = []
            token = cp.session.headers["X-CodefyUI-Token"] if cp.session else ""
            async with aiohttp.ClientSession() as browser:
                async with browser.ws_connect(f"{cp.url}/ws/runs/{rid}?after=0&token={token}") as ws:
                    async def first_events() -> None:
                        while len(got) < 2:  # caught up with what was stored before the flood
                            got.append(json.loads((await ws.receive()).data))
                    await asyncio.wait_for(first_events(), 30)
                    # One message of 300 events: they are stored and broadcast in one go,
                    # far more than this watcher's bound of 4.
                    for i in range(300):
                        agent.spool_event(rid, "log", message=f"line {i}", stream="stdout")
                    await agent.flush(rid)
                    (sub,) = cp.runs.subscribers[rid]
                    assert sub.maxsize == 4 and sub.qsize() <= 4
                    assert sub.dropped > 0, "the flood did not overflow the watcher's queue; the test proves nothing"
                    await agent.status(rid, "succeeded")

                    async def the_rest() -> None:
                        async for msg in ws:
                            if msg.type != aiohttp.WSMsgType.TEXT:
                                break
                            got.append(json.loads(msg.data))
                    await asyncio.wait_for(the_rest(), 60)
            stored = await cp.events(rid)
            assert [e["seq"] for e in got] == list(range(1, len(stored) + 1))
            assert [e["seq"] for e in got] == [e["seq"] for e in stored]
            assert [e["data"].get("message") for e in got if e["kind"] == "log"] == [f"line {i}" for i in range(300)]
            assert got[-1]["kind"] == "status" and got[-1]["data"]["status"] == "succeeded"
        finally:
            await agent.close()

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


async def test_a_batched_watcher_gets_the_same_events_as_arrays(tmp_path: Path) -> None:
    """?batch=1 (what the canvas uses): the events that are ready go out as one JSON array per message.
    Watched beside an unbatched watcher through a catch-up of 600 stored events and a live flood of 300,
    the arrays joined are exactly the one-per-message stream and the stored log; no array holds more than
    BATCH_EVENTS, and some hold many (else nothing was batched and the test proves nothing)."""
    from cdui.plane.http.api_runs import BATCH_EVENTS
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run = await cp.submit({"target": {"worker": agent.name}})
            rid = run["id"]
            await agent.assignment()
            await agent.status(rid, "running", pid=4242)
            for i in range(600):  # stored before anyone watches: the catch-up
                agent.spool_event(rid, "log", message=f"early {i}", stream="stdout")
            await agent.flush(rid)
            token = cp.session.headers["X-CodefyUI-Token"] if cp.session else ""
            plain: list[dict[str, Any]] = []
            arrays: list[list[dict[str, Any]]] = []
            caught = asyncio.Event()

            def seen() -> None:
                if sum(map(len, arrays)) >= 602 and len(plain) >= 602:
                    caught.set()
            async with aiohttp.ClientSession() as browser:
                bad = await browser.get(f"{cp.url}/ws/runs/{rid}?batch=yes&token={token}")
                assert bad.status == 400
                assert (await bad.json())["error"]["message"] == "batch='yes' is not 0 or 1"
                async with browser.ws_connect(f"{cp.url}/ws/runs/{rid}?after=0&token={token}") as ws1, \
                        browser.ws_connect(f"{cp.url}/ws/runs/{rid}?after=0&batch=1&token={token}") as ws2:
                    async def read_plain() -> None:
                        async for msg in ws1:
                            if msg.type != aiohttp.WSMsgType.TEXT:
                                break
                            plain.append(json.loads(msg.data))
                            seen()

                    async def read_arrays() -> None:
                        async for msg in ws2:
                            if msg.type != aiohttp.WSMsgType.TEXT:
                                break
                            got = json.loads(msg.data)
                            assert isinstance(got, list) and got, msg.data[:200]
                            arrays.append(got)
                            seen()
                    readers = [asyncio.create_task(read_plain()), asyncio.create_task(read_arrays())]
                    await asyncio.wait_for(caught.wait(), 60)  # both caught up with the stored ones
                    for i in range(300):
                        agent.spool_event(rid, "log", message=f"live {i}", stream="stdout")
                    await agent.flush(rid)
                    await agent.status(rid, "succeeded")
                    await asyncio.wait_for(asyncio.gather(*readers), 60)
            stored = await cp.events(rid)
            joined = [e for a in arrays for e in a]
            assert joined == plain
            assert [e["seq"] for e in joined] == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
            assert joined[-1]["kind"] == "status" and joined[-1]["data"]["status"] == "succeeded"
            assert max(map(len, arrays)) <= BATCH_EVENTS
            assert max(map(len, arrays)) > 1 and len(arrays) < len(joined) // 4, [len(a) for a in arrays]
        finally:
            await agent.close()

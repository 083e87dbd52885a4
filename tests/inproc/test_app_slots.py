"""A published app's warm process holds a slot of its device as a run does (docs/apps.md, "Serving
processes and runs share the slots"): the real dispatcher of an in-process control plane, a worker
connected as a fake agent. The slot is held through the run service's one port for it (what the
worker's heartbeat or this server's serving pool calls); the serving processes themselves are tested
with a real agent in tests/test_apps_on_worker.py."""
from __future__ import annotations

import asyncio
from pathlib import Path

from cdui.run.catalog import node_catalog
from tests.inproc.harness import FakeAgent, Plane, e, eventually, n, t


async def test_a_run_waits_for_a_slot_a_serving_process_holds_and_starts_once_it_is_given_back(
        tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            cp.runs.hold_app_slots(agent.name, ["cpu"])  # one serving process on its one cpu slot
            run = await cp.submit({"target": {"worker": agent.name}, "device": "cpu"})

            async def waiting() -> str | None:
                reason = (await cp.run(run["id"]))["queue_reason"]
                return reason if reason != "waiting for the scheduler" else None
            reason = await eventually(waiting, "the run to say why it waits")
            assert (await cp.run(run["id"]))["status"] == "queued", reason
            listed = (await cp.call("GET", "/api/workers"))["workers"][0]["devices"]
            assert [(d["device"], d["slots"], d["in_use"]) for d in listed] == [("cpu", 1, 1)]
            # Only a run that may use that machine's device wants the slot back.
            assert (cp.runs.wants_slot(agent.name, "cpu"), cp.runs.wants_slot("local", "cpu"),
                    cp.runs.wants_slot(agent.name, "cuda:0")) == (True, False, False)

            cp.runs.hold_app_slots(agent.name, [])  # the process ended: its slot is free
            assert (await agent.assignment())["run_id"] == run["id"]
        finally:
            await agent.close()


async def test_a_cold_invoke_takes_its_turn_for_a_slot_with_the_queued_runs(tmp_path: Path) -> None:
    """The first serving process of a version takes a slot of its device (RunService.take_app_slot): at once when
    one is free; else it waits, and gets the slot before runs queued after it, after runs queued before it."""
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            runs = cp.runs
            # A free slot is taken at once, and given back.
            await runs.take_app_slot(agent.name, "cpu", 60)
            assert runs.slots_used()[(agent.name, "cpu")] == 1
            runs.release_app_slot(agent.name, "cpu")
            assert runs.slots_used().get((agent.name, "cpu"), 0) == 0

            first = await cp.submit({"target": {"worker": agent.name}, "device": "cpu"})
            assert (await agent.assignment())["run_id"] == first["id"]
            # The run holds the one slot: a further process of a busy version does not start ...
            assert runs.try_app_slot(agent.name, "cpu") is False
            # ... the first one of a version waits for the slot, up to its invoke's timeout ...
            try:
                await runs.take_app_slot(agent.name, "cpu", 0.2)
                raise AssertionError("a slot was taken while the run held it")
            except TimeoutError:
                pass
            assert runs.slot_waiters == []
            # ... and, waiting, comes before a run queued after it.
            cold = asyncio.ensure_future(runs.take_app_slot(agent.name, "cpu", 120))
            await eventually(lambda: len(runs.slot_waiters) == 1, "the cold invoke to wait for the slot")
            assert runs.wants_slot(agent.name, "cpu") is True  # an idle serving process there would give it back
            later = await cp.submit({"target": {"worker": agent.name}, "device": "cpu"})
            await agent.status(first["id"], "running", pid=1, device="cpu")
            await agent.status(first["id"], "succeeded", error=None)
            await asyncio.wait_for(cold, 60)
            assert (await cp.run(later["id"]))["status"] == "queued"
            assert runs.try_app_slot(agent.name, "cpu") is False  # the slot is the invoke's now
            # The process started holds the slot itself (its heartbeat), then gives it back: the run starts.
            runs.hold_app_slots(agent.name, ["cpu"])
            runs.release_app_slot(agent.name, "cpu")
            assert (await cp.run(later["id"]))["status"] == "queued"
            runs.hold_app_slots(agent.name, [])
            assert (await agent.assignment())["run_id"] == later["id"]
        finally:
            await agent.close()


async def test_an_app_is_not_sent_to_a_worker_that_lacks_one_of_its_node_types(tmp_path: Path) -> None:
    """A worker whose node catalog lacks a type the version uses: named in serve_on, the invoke is refused
    naming the type (409 missing_node_types, before any slot or message); with serve_on any, a worker that has
    every type serves it."""
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        own = node_catalog(cp.runs.registry)
        lacking = FakeAgent(cp, name="w1", catalog={"types": [x for x in own["types"] if x != "ScalarMultiply"],
                                                    "hash": "sha256:" + "0" * 64})
        whole = FakeAgent(cp, name="w2")
        try:
            for agent in (lacking, whole):
                await agent.enroll()
                await agent.connect()
            scale = {"nodes": [n("start", "Start"), n("in", "GraphInput", name="values", type="json"),
                               n("mul", "ScalarMultiply", scalar=3.0), n("out", "GraphOutput", name="scaled")],
                     "edges": [t("in"), e("in", "value", "mul", "tensor"), e("mul", "tensor", "out", "value")]}
            await cp.call("PUT", "/api/graphs/scale", scale, expect=201)
            await cp.call("POST", "/api/apps/scaler/publish", {"graph": "scale", "create": True, "serve_on": "w1"},
                          expect=201)
            status, out = await cp.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
            assert (status, out["error"]["code"], out["worker"]) == (409, "missing_node_types", "w1"), out
            assert "ScalarMultiply" in out["error"]["message"] and out["error"]["details"]["missing"] == \
                ["ScalarMultiply"]
            assert cp.runs.slot_waiters == [] and cp.runs.app_reserved == {}
            assert [m for m in lacking.inbox if m.get("type") == "app_invoke"] == []

            await cp.call("PATCH", "/api/apps/scaler", {"serve_on": "any"})
            pending = asyncio.ensure_future(cp.api("POST", "/api/apps/scaler/invoke",
                                                   {"inputs": {"values": [1]}, "timeout_s": 1}))
            sent = await whole.message("app_invoke")
            assert (sent["slug"], sent["version"]) == ("scaler", 1)
            assert [m for m in lacking.inbox if m.get("type") == "app_invoke"] == []
            pending.cancel()
        finally:
            for agent in (lacking, whole):
                await agent.close()

"""A published app's warm process holds a slot of its device as a run does (docs/apps.md, "Serving
processes and runs share the slots"): the real dispatcher of an in-process control plane, a worker
connected as a fake agent. The slot is held through the run service's one port for it (what the
worker's heartbeat or this server's serving pool calls); the serving processes themselves are tested
with a real agent in tests/test_apps_on_worker.py."""
from __future__ import annotations

from pathlib import Path

from tests.inproc.harness import FakeAgent, Plane, eventually


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

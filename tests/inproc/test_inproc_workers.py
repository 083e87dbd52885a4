"""Worker sessions in process: disconnects, resume, grace, adoption, heartbeats, stop.

A real control plane app (``TestServer`` on 127.0.0.1, a real sqlite file)
and a fake agent speaking the real protocol over a real socket. Each test
asserts the one outcome that must happen; time in the control plane moves
only when the test steps its clock."""
from __future__ import annotations

from pathlib import Path

from harness import FakeAgent, Plane

GRACE = "30"


def _plane(tmp_path: Path, name: str = "ud", **settings: str) -> Plane:
    return Plane(tmp_path / name, tmp_path / "data", **{"CODEFYUI_WORKER_RESUME_GRACE_S": GRACE, **settings})


async def _start_run(cp: Plane, agent: FakeAgent, progress: int) -> str:
    """Submit a run for the agent, take its assignment, report it running with ``progress`` ticks."""
    run = await cp.submit({"target": {"worker": agent.name}})
    assign = await agent.assignment()
    assert assign["run_id"] == run["id"]
    await agent.status(run["id"], "running", pid=4242)
    for i in range(1, progress + 1):
        await agent.send(run["id"], "progress", tick=i)
    return run["id"]


def _ticks(evs: list[dict]) -> list[int]:
    return [e["data"]["tick"] for e in evs if e["kind"] == "progress"]


def _warnings(evs: list[dict]) -> list[str]:
    return [e["data"]["kind"] for e in evs if e["kind"] == "run_warning"]


async def test_run_on_worker_succeeds_with_every_event(tmp_path):
    async with _plane(tmp_path) as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            assert (await cp.worker("w1"))["online"] is True
            run_id = await _start_run(cp, agent, 3)
            assert (await cp.run(run_id))["status"] == "running"
            await agent.status(run_id, "succeeded")
            r = await cp.run(run_id)
            assert (r["status"], r["worker_id"]) == ("succeeded", "w1")
            evs = await cp.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
            assert _ticks(evs) == [1, 2, 3]
        finally:
            await agent.close()

"""Dispatch under a backlog, in process: order, one run per slot, no run assigned twice; and the
event-loop lag that /api/health reports.

A real control plane app and fake agents speaking the real protocol. Runs are
queued while every worker is drained, then the workers are released at once,
as bench/scale.py does with 10,000 runs (a dispatch pass then asks only the
executors a run has left since the last pass: these tests pin that nothing is
lost or doubled by it)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from harness import FakeAgent, Plane, eventually


def _plane(tmp_path: Path, **settings: str) -> Plane:
    # local/cpu=0: `any` goes to the fake agents only.
    return Plane(tmp_path / "ud", tmp_path / "data", **{"CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "local/cpu=0",
                                                         **settings})


async def _agents(cp: Plane, names: list[str]) -> list[FakeAgent]:
    agents = []
    for name in names:
        a = FakeAgent(cp, name)
        agents.append(a)
        await a.enroll()
        await a.connect()
        await cp.call("POST", f"/api/workers/{name}/drain")
    return agents


async def test_a_backlog_on_one_slot_starts_in_submit_order_and_says_why_it_waits(tmp_path):
    async with _plane(tmp_path) as cp:
        agents = await _agents(cp, ["w1"])
        w1 = agents[0]
        try:
            ids = [(await cp.submit({"target": "any", "device": "cpu"}))["id"] for _ in range(6)]
            await cp.call("POST", "/api/workers/w1/undrain")
            for i, run_id in enumerate(ids):
                got = await w1.assignment()
                assert got["run_id"] == run_id, f"run {i} of the backlog came out of order"
                if i + 1 < len(ids):
                    # The one slot is taken: the next run waits, and says so (worked out when read).
                    waiting = await cp.run(ids[i + 1])
                    assert waiting["status"] == "queued"
                    assert "all slots of w1 cpu are in use" in (waiting["queue_reason"] or ""), waiting
                await w1.status(run_id, "running", pid=1)
                await w1.status(run_id, "succeeded")
            for run_id in ids:
                r = await cp.wait_status(run_id, "succeeded")
                assert r["worker_id"] == "w1"
        finally:
            await w1.close()


async def test_a_backlog_released_on_several_workers_is_assigned_once_each_within_their_slots(tmp_path):
    slots = {"w1": 1, "w2": 1, "w3": 2}
    async with _plane(tmp_path, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0,w3/cpu=2") as cp:
        agents = await _agents(cp, list(slots))
        got: dict[str, list[str]] = {a.name: [] for a in agents}
        over: list[str] = []
        try:
            ids = [(await cp.submit({"target": "any", "device": "cpu"}))["id"] for _ in range(20)]
            assert [(await cp.run(i))["status"] for i in ids] == ["queued"] * len(ids)

            async def work(agent: FakeAgent) -> None:
                while True:
                    a = await agent.assignment(timeout=60)
                    held = cp.runs.runs_on(agent.name)
                    if len(held) > slots[agent.name]:
                        over.append(f"{agent.name} held {held}")
                    got[agent.name].append(a["run_id"])
                    await agent.status(a["run_id"], "running", pid=1)
                    await agent.status(a["run_id"], "succeeded")

            workers = [asyncio.create_task(work(a)) for a in agents]
            for name in slots:
                await cp.call("POST", f"/api/workers/{name}/undrain")
            try:
                await eventually(lambda: sum(len(v) for v in got.values()) >= len(ids), "every run assigned",
                                 timeout=60, detail=lambda: got)
                for run_id in ids:
                    await cp.wait_status(run_id, "succeeded")
            finally:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
            every = [r for runs in got.values() for r in runs]
            assert sorted(every) == sorted(ids), "a run was assigned twice, or not at all"
            assert not over, over
            for name, runs in got.items():
                assert runs, f"{name} was given no run"
                for run_id in runs:
                    assert (await cp.run(run_id))["worker_id"] == name
        finally:
            for a in agents:
                await a.close()


async def test_health_reports_the_event_loop_lag_as_a_number(tmp_path):
    async with _plane(tmp_path) as cp:
        status, plain = await cp.api("GET", "/api/health")
        assert (status, plain) == (200, {"status": "ok", "version": plain["version"]}), "the documented answer"
        status, health = await cp.api("GET", "/api/health?detail=1")
        assert status == 200 and health["status"] == "ok"
        lag, longest = health["loop_lag_ms"], health["loop_lag_max_ms"]
        assert isinstance(lag, (int, float)) and not isinstance(lag, bool) and lag >= 0
        assert isinstance(longest, (int, float)) and not isinstance(longest, bool) and longest >= lag


async def test_a_drain_that_lands_while_a_worker_connects_is_not_lost(tmp_path):
    """A session reads its worker's row before the welcome and attaches the executor after it; a drain
    in between once found no executor to tell, and the worker took runs until it reconnected. Told the
    drain with no executor attached (its row still saying not drained), the worker must attach drained."""
    from cdui.plane.workers import WORKERS
    async with _plane(tmp_path) as cp:
        w1 = FakeAgent(cp, "w1")
        await w1.enroll()
        cp.app[WORKERS].set_drained("w1", True)  # as the drain route would, between the row read and the attach
        try:
            await w1.connect()
            await eventually(lambda: cp.runs.executor("w1") is not None, "w1's executor to attach")
            assert cp.runs.executor("w1").drained
            run_id = (await cp.submit({"target": "any", "device": "cpu"}))["id"]
            await cp.call("POST", "/api/workers/w1/undrain")
            got = await w1.assignment()
            assert got["run_id"] == run_id
        finally:
            await w1.close()


async def test_a_pass_places_a_run_even_when_reading_the_slots_took_its_whole_budget(tmp_path, monkeypatch):
    """With thousands of workers, asking each for a free slot can take longer than a pass may hold the
    event loop; a pass that stopped before its first placement then placed nothing, pass after pass."""
    from cdui.plane import runs as runs_module
    monkeypatch.setattr(runs_module, "PASS_BUDGET_S", 0.0)  # every pass is over budget from its start
    async with _plane(tmp_path) as cp:
        agents = await _agents(cp, ["w1"])
        w1 = agents[0]
        try:
            ids = [(await cp.submit({"target": "any", "device": "cpu"}))["id"] for _ in range(3)]
            await cp.call("POST", "/api/workers/w1/undrain")
            for run_id in ids:
                got = await w1.assignment()
                assert got["run_id"] == run_id
                await w1.status(run_id, "running", pid=1)
                await w1.status(run_id, "succeeded")
            for run_id in ids:
                await cp.wait_status(run_id, "succeeded")
        finally:
            await w1.close()


async def test_the_waiting_reason_behind_busy_workers_follows_a_drain_and_the_listing_matches_each_run(tmp_path):
    """Behind busy workers a pass keeps a waiting reason it already worked out while nothing changes (a
    submit changes nothing): a drain changes it at once, and GET /api/runs lists each run exactly as
    GET /api/runs/ID shows it (the listing is encoded apart, from kept rows)."""
    async with _plane(tmp_path) as cp:
        agents = await _agents(cp, ["w1", "w2"])
        w1, w2 = agents
        try:
            for a in agents:
                await cp.call("POST", f"/api/workers/{a.name}/undrain")
            first = [(await cp.submit({"target": "any", "device": "cpu"}))["id"] for _ in range(2)]
            held = {(await w1.assignment())["run_id"]: "w1", (await w2.assignment())["run_id"]: "w2"}
            assert sorted(held) == sorted(first)
            waiting = (await cp.submit({"target": "any", "device": "cpu"}))["id"]
            busy = "waiting for a free cpu slot: slots in use on 3 (w1, w2, local)"
            assert (await cp.run(waiting))["queue_reason"] == busy
            later = (await cp.submit({"target": "any", "device": "cpu"}))["id"]
            assert [(await cp.run(r))["queue_reason"] for r in (waiting, later)] == [busy, busy]
            await cp.call("POST", "/api/workers/w2/drain")
            drained = "waiting for a free cpu slot: slots in use on 2 (w1, local); unavailable on 1 (w2)"
            await eventually(lambda: _reason_is(cp, waiting, drained), "the reason to say w2 is draining",
                             detail=lambda: cp.runs.queue.reason(waiting))
            listed = {r["id"]: r for r in await cp.call("GET", "/api/runs")}
            for run_id in [*first, waiting, later]:
                assert listed[run_id] == await cp.run(run_id)
            w1_run = next(r for r, name in held.items() if name == "w1")
            await w1.status(w1_run, "running", pid=1)
            await w1.status(w1_run, "succeeded")
            assert (await w1.assignment())["run_id"] == waiting  # first come, first served on the freed slot
        finally:
            for a in agents:
                await a.close()


async def _reason_is(cp: Plane, run_id: str, text: str) -> bool:
    return (await cp.run(run_id))["queue_reason"] == text


async def test_a_runs_running_and_ending_in_one_message_end_it_once_in_order_and_free_its_slot(tmp_path):
    """The usual message of a worker's run (running, a log line, the ending) is stored with the run row's
    changes in one transaction: a watcher sees the statuses in order, the run ends once (a second ending
    changes nothing), it keeps the start facts its claim wrote, and its slot goes to the next run."""
    async with _plane(tmp_path) as cp:
        (w1,) = await _agents(cp, ["w1"])
        try:
            first, second = [(await cp.submit({"target": "any", "device": "cpu"}))["id"] for _ in range(2)]
            await cp.call("POST", "/api/workers/w1/undrain")
            assert (await w1.assignment())["run_id"] == first
            watcher = cp.runs.subscribe(first)
            try:
                await w1.send_batch(first, [("status", {"status": "running", "pid": 1}),
                                            ("log", {"message": "hi", "stream": "stdout"}),
                                            ("status", {"status": "succeeded", "error": None})])
                done = await cp.wait_status(first, "succeeded")
                seen = [watcher.get_nowait() for _ in range(watcher.qsize())]
            finally:
                cp.runs.unsubscribe(first, watcher)
            assert [(e["kind"], e["data"].get("status")) for e in seen] == \
                [("status", "running"), ("log", None), ("status", "succeeded")]
            assert [e["seq"] for e in seen] == [2, 3, 4]  # after the control plane's `queued`
            assert done["error"] is None and done["finished_at"] and done["worker_id"] == "w1"
            assert done["execution_facts"]["fingerprint_source"] == "worker"
            assert (await w1.assignment())["run_id"] == second  # the one slot was freed by the ending
            await w1.status(first, "failed", error="late")  # a second ending of the first run changes nothing
            again = await cp.run(first)
            assert (again["status"], again["error"], again["finished_at"]) == ("succeeded", None, done["finished_at"])
        finally:
            await w1.close()

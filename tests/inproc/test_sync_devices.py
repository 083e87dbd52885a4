"""Device sets and "Share by memory", in process.

A real control plane app and fake agents that offer several devices (and, for
share by memory, report their memory) over the real protocol. The local
executor gets no slot (``local/cpu=0``) so that runs wait for workers instead
of running here; every card has one slot unless a test says otherwise."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from harness import FakeAgent, Plane, eventually, graph

CUDA2 = ("cuda:0", "cuda:1", "cpu")


def _plane(tmp_path: Path, name: str = "ud", **settings: str) -> Plane:
    return Plane(tmp_path / name, tmp_path / "data", **{"CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "local/cpu=0",
                                                        "CODEFYUI_WORKER_RESUME_GRACE_S": "30", **settings})


async def _submit(cp: Plane, **options: Any) -> dict[str, Any]:
    return await cp.call("POST", "/api/runs", {"graph": graph(), "options": options}, expect=201)


async def _reason(cp: Plane, run_id: str, contains: str) -> str:
    """The run's queue_reason once a dispatch pass has given one that says ``contains``."""
    async def said() -> str | None:
        run = await cp.run(run_id)
        reason = run["queue_reason"] or ""
        return reason if run["status"] == "queued" and contains in reason else None
    return str(await eventually(said, f"queue_reason to say {contains!r}", detail=lambda: cp.run(run_id)))


async def _in_use(cp: Plane, name: str) -> dict[str, int]:
    w = await cp.worker(name)
    assert w is not None
    return {d["device"]: d["in_use"] for d in w["devices"]}


async def _agent(cp: Plane, name: str, devices: tuple[str, ...], memory: dict[str, Any] | None = None) -> FakeAgent:
    agent = FakeAgent(cp, name, devices)
    agent.device_memory = memory
    await agent.enroll()
    await agent.connect()
    return agent


async def test_a_set_takes_cards_of_one_worker_waits_with_its_count_and_is_released(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        w1 = await _agent(cp, "w1", CUDA2)
        w2 = await _agent(cp, "w2", ("cuda:0", "cpu"))
        try:
            first = await _submit(cp, target="any", device="cuda", devices=2)
            assign = await w1.assignment()
            assert assign["run_id"] == first["id"]
            # The assignment carries the set; the run shows it; each card holds one slot.
            assert assign["job"]["slot_device"] == "cuda:0,cuda:1"
            assert assign["job"]["options"]["devices"] == 2
            await w1.status(first["id"], "running", pid=1)
            assert (await cp.run(first["id"]))["device"] == "cuda:0,cuda:1"
            assert await _in_use(cp, "w1") == {"cuda:0": 1, "cuda:1": 1, "cpu": 0}
            # Never split over workers: w2's one free card and nothing else is not a set of 2.
            second = await _submit(cp, target="any", device="cuda", devices=2)
            reason = await _reason(cp, second["id"], "2 free cuda slots")
            assert reason == ("waiting for 2 free cuda slots on one worker: slots in use on 2 (w1, w2); "
                              "no cuda device on 1 (local)")
            # First come, first served per kind: a later single-card run does not overtake the set.
            single = await _submit(cp, target="any", device="cuda")
            assert await _reason(cp, single["id"], "earlier") == (
                "waiting for a free cuda slot: an earlier cuda run waits on 2 (w1, w2); no cuda device on 1 (local)")
            assert w2.assigned.empty() and w1.assigned.empty()
            # The set is released at the end: the waiting set takes both of w1's cards, the single run w2's.
            await w1.status(first["id"], "succeeded")
            again = await w1.assignment()
            assert (again["run_id"], again["job"]["slot_device"]) == (second["id"], "cuda:0,cuda:1")
            other = await w2.assignment()
            assert (other["run_id"], other["job"]["slot_device"]) == (single["id"], "cuda:0")
        finally:
            await w1.close()
            await w2.close()


async def test_a_cpu_set_is_slots_of_the_cpu_and_plain_submits_store_what_they_did(tmp_path: Path) -> None:
    async with _plane(tmp_path, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0,w1/cpu=2") as cp:
        w1 = await _agent(cp, "w1", ("cpu",))
        try:
            plain = await _submit(cp, target="w1")
            assert "devices" not in plain["options"] and "memory_mb" not in plain["options"]
            assert (await w1.assignment())["job"]["slot_device"] == "cpu"
            await w1.status(plain["id"], "succeeded")
            cpu_set = await _submit(cp, target="w1", device="cpu", devices=2)
            assert (await w1.assignment())["job"]["slot_device"] == "cpu,cpu"
            await w1.status(cpu_set["id"], "running", pid=1)
            assert await _in_use(cp, "w1") == {"cpu": 2}
            waiting = await _submit(cp, target="w1", device="cpu")
            assert await _reason(cp, waiting["id"], "slots") == "waiting: all slots of w1 cpu are in use"
            await w1.status(cpu_set["id"], "succeeded")
            assert (await w1.assignment())["run_id"] == waiting["id"]
        finally:
            await w1.close()


async def test_a_set_larger_than_any_worker_offers_is_refused_at_submit(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        w1 = await _agent(cp, "w1", CUDA2)
        try:
            status, body = await cp.api("POST", "/api/runs", {"graph": graph(),
                                                             "options": {"target": "any", "device": "cuda",
                                                                         "devices": 3}})
            assert (status, body["error"]["code"]) == (400, "device_set_too_large")
            assert body["error"]["message"] == (
                "a set of 3 cuda slots on one worker was asked for, but no worker the target may use offers "
                "that many (local: 0, w1: 2); nothing was stored")
            # A worker that is offline is judged by the devices it offered when it last connected.
            await w1.close()
            status, body = await cp.api("POST", "/api/runs", {"graph": graph(), "options": {
                "target": "w1", "device": "cpu", "devices": 2}})
            assert (status, body["error"]["code"]) == (400, "device_set_too_large")
            assert "(w1: 1)" in body["error"]["message"]
            status, body = await cp.api("POST", "/api/runs", {"graph": graph(), "options": {
                "target": "w1", "device": "cuda:1", "devices": 2}})
            assert (status, body["error"]["code"]) == (400, "bad_devices")
            status, body = await cp.api("POST", "/api/runs", {"graph": graph(), "options": {
                "target": "w1", "devices": True}})
            assert (status, body["error"]["code"]) == (400, "bad_devices")
            assert await cp.call("GET", "/api/runs") == []
        finally:
            await w1.close()


async def test_a_disconnected_set_keeps_its_cards_and_is_reoccupied_on_adoption(tmp_path: Path) -> None:
    w1: FakeAgent | None = None
    try:
        async with _plane(tmp_path) as cp:
            w1 = await _agent(cp, "w1", CUDA2)
            first = await _submit(cp, target="w1", device="cuda", devices=2)
            assert (await w1.assignment())["job"]["slot_device"] == "cuda:0,cuda:1"
            await w1.status(first["id"], "running", pid=1)
            await w1.drop()
            await cp.wait_status(first["id"], "disconnected")
            assert cp.runs.runs_on("w1") == [(first["id"], "w1", "cuda:0,cuda:1")]
            await w1.connect(held=[first["id"]])
            assert (await cp.run(first["id"]))["status"] == "running"
            # Both cards are still the set's: a single-card run waits.
            single = await _submit(cp, target="w1", device="cuda")
            assert await _reason(cp, single["id"], "slots") == "waiting: all slots of w1 cuda:0/cuda:1 are in use"
            cp.crash_copy(tmp_path / "ud2")
            await w1.drop()
        async with _plane(tmp_path, "ud2") as cp2:
            w1.use_plane(cp2)
            # Adopted at the restart: the set holds both cards before and after its worker returns.
            assert cp2.runs.runs_on("w1") == [(first["id"], "w1", "cuda:0,cuda:1")]
            await w1.connect(held=[first["id"]])
            assert await _in_use(cp2, "w1") == {"cuda:0": 1, "cuda:1": 1, "cpu": 0}
            assert await _reason(cp2, single["id"], "slots") == "waiting: all slots of w1 cuda:0/cuda:1 are in use"
            await w1.status(first["id"], "succeeded")
            assert (await w1.assignment())["run_id"] == single["id"]
            await w1.close()  # before the plane stops: see the note in harness.FakeAgent.close
    finally:
        if w1 is not None:
            await w1.close()


async def test_share_by_memory_admits_by_the_needs_against_the_cards_memory(tmp_path: Path) -> None:
    memory = {"cuda:0": {"total_mb": 4000, "free_mb": 3900}, "cpu": {"total_mb": 64000, "free_mb": 60000}}
    async with _plane(tmp_path) as cp:
        w1 = await _agent(cp, "w1", ("cuda:0", "cpu"), memory)
        try:
            a = await _submit(cp, target="w1", device="cuda", memory_mb=1500)
            assert (await w1.assignment())["run_id"] == a["id"]
            await w1.status(a["id"], "running", pid=1)
            b = await _submit(cp, target="w1", device="cuda", memory_mb=1500)
            assert await _reason(cp, b["id"], "slots") == "waiting: all slots of w1 cuda:0 are in use"
            answer = await cp.call("POST", "/api/workers/w1/share-by-memory", {"enabled": True, "device": "cuda:0"})
            assert answer == {"name": "w1", "share_by_memory": ["cuda:0"]}
            # Two runs of 1500 MiB fit in 4000; a third does not.
            assert (await w1.assignment())["run_id"] == b["id"]
            await w1.status(b["id"], "running", pid=2)
            c = await _submit(cp, target="w1", device="cuda", memory_mb=1500)
            assert await _reason(cp, c["id"], "memory") == "waiting: w1 has no free cuda slot or memory"
            card = await cp.worker("w1")
            assert card is not None and card["share_by_memory"] == ["cuda:0"]
            assert card["devices"][0] == {"device": "cuda:0", "slots": 1, "in_use": 2, "shared_by_memory": True,
                                          "memory": memory["cuda:0"], "memory_in_use_mb": 3000}
            assert card["devices"][1]["shared_by_memory"] is False
            # Stored: the setting outlives this control plane.
            db = sqlite3.connect(str(tmp_path / "ud" / "cdui.sqlite3"))
            try:
                row = db.execute("SELECT share_by_memory FROM workers WHERE name='w1'").fetchone()
            finally:
                db.close()
            assert json.loads(row[0]) == ["cuda:0"]
            await w1.status(a["id"], "succeeded")
            assert (await w1.assignment())["run_id"] == c["id"]
            off = await cp.call("POST", "/api/workers/w1/share-by-memory", {"enabled": False})
            assert off == {"name": "w1", "share_by_memory": []}
            status, body = await cp.api("POST", "/api/workers/nobody/share-by-memory", {"enabled": True})
            assert status == 404
            status, body = await cp.api("POST", "/api/workers/w1/share-by-memory", {"enabled": "yes"})
            assert (status, body["error"]["code"]) == (400, "bad_request")
        finally:
            await w1.close()


async def test_a_shared_card_whose_worker_reported_no_memory_admits_nothing(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        w1 = await _agent(cp, "w1", ("cuda:0", "cpu"), None)
        try:
            await cp.call("POST", "/api/workers/w1/share-by-memory", {"enabled": True})
            run = await _submit(cp, target="w1", device="cuda")
            assert await _reason(cp, run["id"], "memory") == (
                "waiting: w1 shares cuda:0 by memory but reported no memory for it")
            card = await cp.worker("w1")
            assert card is not None and card["share_by_memory"] == ["*"]
            assert card["devices"][0]["memory"] is None
        finally:
            await w1.close()


@pytest.mark.e2e  # a real run subprocess (it imports torch)
async def test_a_local_cpu_set_runs_on_this_server(tmp_path: Path) -> None:
    async with _plane(tmp_path, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=2") as cp:
        run = await _submit(cp, target="local", device="cpu", devices=2)
        done = await cp.wait_status(run["id"], "succeeded", "failed", timeout=300)
        assert (done["status"], done["worker_id"], done["device"]) == ("succeeded", "local", "cpu,cpu"), done
        assert done["execution_facts"]["devices"]["set"] == ["cpu", "cpu"]
        assert done["execution_facts"]["devices"]["process"] == ["cpu", "cpu"]
        status, body = await cp.api("POST", "/api/runs", {"graph": graph(), "options": {
            "target": "local", "device": "cpu", "devices": 3}})
        assert (status, body["error"]["code"]) == (400, "device_set_too_large")
        assert "(local: 2)" in body["error"]["message"]

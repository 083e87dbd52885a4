"""One-shot routing in process: which runs reach one-shot workers and instances, the pool's
order and timeout, --run-id, record-outputs, one agent per name, instances in the list,
credential removal, and the one-shot mark that survives a restart.

A real control plane app on a loopback port over a real sqlite file; fake agents speak the
real protocol with the one-shot fields of the hello; the clock moves only when a test steps it.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import FakeAgent, Plane, eventually

from cdui import __version__
from cdui.plane.runs import DISPATCH_EVERY_S
from cdui.wire import protocol

TIMEOUT = "100"


class OneShotAgent(FakeAgent):
    """A fake agent whose hello says one-shot (with an instance ID and a run id when given)."""

    def __init__(self, plane: Plane, name: str = "w1", instance: str | None = None, run_id: str | None = None,
                 one_shot: bool = True, devices: tuple[str, ...] = ("cpu",), agent_id: str | None = None) -> None:
        super().__init__(plane, name, devices)
        self.instance = instance
        self.run_id = run_id
        self.one_shot = one_shot
        self.agent_id = agent_id  # the real agent draws one per process

    def hello(self, held: list[str] | None = None) -> str:
        runs = [{"run_id": r, "running": True, "last_seq": len(self.spool.get(r, []))} for r in held or []]
        obj = protocol.hello(__version__, self.name, self.devices, {}, "fake-machine", runs, self.one_shot,
                             self.instance)
        obj["run_id"] = self.run_id
        obj["agent_id"] = self.agent_id
        return json.dumps(obj)

    async def first_answer(self, held: list[str] | None = None) -> dict[str, Any]:
        """Connect and return the control plane's first message (a welcome or a refusal)."""
        self.ws = await self._session.ws_connect(self.plane.url.replace("http", "ws", 1) + "/ws/worker",
                                                 headers={"Authorization": f"Bearer {self.credential}"},
                                                 autoclose=False)
        await self.ws.send_str(self.hello(held))
        msg = await self.ws.receive(timeout=30)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        first: dict[str, Any] = json.loads(msg.data)
        if first["type"] == "welcome":
            self.welcome = first
            for run_id, a in first["runs"].items():
                self.acked[run_id] = a["acked"]
            self._reader = asyncio.create_task(self._read(self.ws))
        return first

    async def connect(self, held: list[str] | None = None) -> dict[str, Any]:
        assert not held
        first = await self.first_answer()
        assert first["type"] == "welcome", first
        return first


def _plane(tmp_path: Path, name: str = "ud", **settings: str) -> Plane:
    return Plane(tmp_path / name, tmp_path / "data", **{"CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S": TIMEOUT,
                                                        "CODEFYUI_WORKER_RESUME_GRACE_S": "30", **settings})


async def _reason(cp: Plane, run_id: str, text: str) -> dict[str, Any]:
    """The run once the dispatch loop has given it a queue_reason containing ``text``."""
    async def waiting() -> dict[str, Any] | None:
        r = await cp.run(run_id)
        return r if r["status"] == "queued" and text in (r["queue_reason"] or "") else None
    return dict(await eventually(waiting, f"run {run_id} to wait with {text!r}", detail=lambda: cp.run(run_id)))


async def _instance(cp: Plane, credential: str, agent_id: str) -> OneShotAgent:
    """An instance of ``credential`` (an enrolled fake agent's credential)."""
    a = OneShotAgent(cp, "slurm", instance=agent_id)
    a.credential = credential
    return a


async def test_any_never_goes_to_a_one_shot_worker_but_the_pool_does(tmp_path):
    # This server's own cpu has no slot, so `any` could only go to the one-shot worker.
    async with _plane(tmp_path, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0") as cp:
        agent = OneShotAgent(cp, "w1")
        try:
            await agent.enroll()
            await agent.connect()
            anyrun = await cp.submit({"target": "any", "device": "cpu"})
            r = await _reason(cp, anyrun["id"], "all slots of local cpu are in use")
            assert "w1" not in r["queue_reason"]
            pool = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
            assign = await agent.assignment()
            assert assign["run_id"] == pool["id"]
            assert (await cp.run(anyrun["id"]))["status"] == "queued"
        finally:
            await agent.close()


async def test_pool_runs_wait_per_device_kind_first_come_first_served(tmp_path):
    async with _plane(tmp_path) as cp:
        first = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
        second = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
        cuda = await cp.submit({"target": {"pool": "one-shot"}, "device": "cuda"})
        await _reason(cp, second["id"], "waiting for a one-shot worker that offers cpu")
        await _reason(cp, cuda["id"], "waiting for a one-shot worker that offers cuda")
        agent = OneShotAgent(cp, "w1")
        try:
            await agent.enroll()
            await agent.connect()
            assert (await agent.assignment())["run_id"] == first["id"]
            # It took its one run: the next pool run waits for the next one-shot agent.
            await _reason(cp, second["id"], "waiting for a one-shot worker that offers cpu")
            await agent.status(first["id"], "succeeded")
            await agent.close()
            nxt = OneShotAgent(cp, "w1")
            nxt.credential = agent.credential
            try:
                await nxt.connect()
                assert (await nxt.assignment())["run_id"] == second["id"]
            finally:
                await nxt.close()
        finally:
            await agent.close()


async def test_a_pool_run_fails_after_the_one_shot_queue_timeout(tmp_path):
    async with _plane(tmp_path) as cp:
        run = await cp.submit({"target": {"pool": "one-shot"}, "device": "cuda"})
        await _reason(cp, run["id"], "waiting for a one-shot worker that offers cuda")
        # The dispatch loop passes every 5 s of the clock meanwhile: none of those passes ends the run.
        await cp.elapse(float(TIMEOUT) - 1)
        await _reason(cp, run["id"], "offers cuda")
        assert (await cp.run(run["id"]))["status"] == "queued"
        await cp.elapse(1)
        r = await cp.wait_status(run["id"], "failed")
        assert "CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S" in r["error"]


async def test_a_queue_timeout_of_0_waits_forever(tmp_path):
    async with _plane(tmp_path, CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S="0") as cp:
        run = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
        await _reason(cp, run["id"], "waiting for a one-shot worker")
        assert cp.runs.oneshot._timer is None  # nothing will end it
        await cp.clock.advance(10 * 86400)
        cp.runs.wake()
        await _reason(cp, run["id"], "waiting for a one-shot worker")


async def test_run_id_takes_that_run_out_of_order_and_a_bad_one_is_refused(tmp_path):
    async with _plane(tmp_path) as cp:
        first = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
        second = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
        local = await cp.submit({"target": "local", "device": "cuda"})
        agent = OneShotAgent(cp, "w1", run_id=second["id"])
        try:
            await agent.enroll()
            await agent.connect()
            assert (await agent.assignment())["run_id"] == second["id"]
            assert (await cp.run(first["id"]))["status"] == "queued"
            await agent.status(second["id"], "succeeded")
        finally:
            await agent.close()
        for bad, why in ((local["id"], "not for the one-shot pool"), ("nosuchrun", "no run with that id"),
                         (second["id"], "it is succeeded")):
            again = OneShotAgent(cp, "w1", run_id=bad)
            again.credential = agent.credential
            try:
                refused = await again.first_answer()
                assert (refused["type"], refused["code"]) == ("refused", "bad_run_id"), refused
                assert why in refused["message"]
            finally:
                await again.close()


async def test_record_outputs_is_refused_for_the_pool_and_a_one_shot_worker(tmp_path):
    async with _plane(tmp_path) as cp:
        agent = OneShotAgent(cp, "w1")
        try:
            await agent.enroll()
            await agent.connect()
            for target in ({"pool": "one-shot"}, {"worker": "w1"}):
                status, body = await cp.api("POST", "/api/runs", {"graph": _graph(), "options": {
                    "target": target, "device": "cpu", "record_outputs": True}})
                assert (status, body["error"]["code"]) == (400, "record_outputs_one_shot"), body
        finally:
            await agent.close()


def _graph() -> dict[str, Any]:
    from harness import graph
    return graph()


async def test_one_agent_per_name_and_the_worker_shows_its_run(tmp_path):
    async with _plane(tmp_path) as cp:
        agent = OneShotAgent(cp, "w1")
        try:
            await agent.enroll()
            await agent.connect()
            second = OneShotAgent(cp, "w1")
            second.credential = agent.credential
            try:
                refused = await second.first_answer()
                assert (refused["type"], refused["code"]) == ("refused", "name_in_use")
            finally:
                await second.close()
            run = await cp.submit({"target": {"worker": "w1"}, "device": "cpu"})
            assert (await agent.assignment())["run_id"] == run["id"]
            await agent.status(run["id"], "succeeded")
        finally:
            await agent.close()
        w = await _offline(cp, "w1")
        assert (w["one_shot"], w["one_shot_run"]) == (True, run["id"])


@pytest.mark.parametrize("instance", [None, "7-0"])
async def test_a_one_shot_agent_back_before_its_drop_was_noticed_replaces_its_connection(tmp_path, instance):
    """The agent's side of its connection died (a network drop) while the control plane's side
    still looks open: the same agent (its agent id) connecting again replaces the old connection
    and its run goes on; another agent under that name is still refused."""
    async with _plane(tmp_path) as cp:
        base = OneShotAgent(cp, "w1")
        agent = OneShotAgent(cp, "w1", instance=instance, agent_id="a1")
        name = "w1" if instance is None else f"w1.{instance}"
        try:
            agent.credential = (await base.enroll()).credential
            await agent.connect()
            run = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
            assert (await agent.assignment())["run_id"] == run["id"]
            await agent.status(run["id"], "running", pid=1)
            assert agent._reader is not None
            agent._reader.cancel()  # the old socket stays open on the control plane's side, unread
            agent.run_id = run["id"]  # as the real agent's hello names the run it took
            other = OneShotAgent(cp, "w1", instance=instance, agent_id="b2")
            other.credential = agent.credential
            try:
                refused = await other.first_answer(held=[])
                assert (refused["type"], refused["code"]) == ("refused", "name_in_use")
            finally:
                await other.close()
            back = await agent.first_answer(held=[run["id"]])
            assert (back["type"], back["runs"][run["id"]]["action"]) == ("welcome", "continue"), back
            await agent.log(run["id"], "still training")
            await agent.status(run["id"], "succeeded")
            done = await cp.wait_status(run["id"], "succeeded")
            assert done["worker_id"] == name
            warnings = [e["data"]["kind"] for e in await cp.events(run["id"]) if e["kind"] == "run_warning"]
            assert warnings == []  # never disconnected: the replaced connection left its run alone
            card = await cp.worker("w1")
            assert card is not None
            if instance is None:
                assert card["online"] is True
            else:  # one live instance: the replaced connection is gone from the list
                assert [x["name"] for x in card["instances"]["live"]] == [name]
        finally:
            await agent.close()
            await base.close()


async def test_an_ordinary_agent_cannot_end_a_one_shot_agents_run(tmp_path):
    """While a one-shot agent's run is in progress (its agent away, within the resume grace), an
    ordinary agent with the same credential is refused: admitted, it would hold none of the run
    and the control plane would end the run `interrupted`."""
    async with _plane(tmp_path) as cp:
        one = OneShotAgent(cp, "w1", agent_id="a1")
        ordinary = OneShotAgent(cp, "w1", one_shot=False, agent_id="b2")
        try:
            await one.enroll()
            ordinary.credential = one.credential
            await one.connect()
            run = await cp.submit({"target": {"worker": "w1"}, "device": "cpu"})
            assert (await one.assignment())["run_id"] == run["id"]
            await one.status(run["id"], "running", pid=1)
            await one.drop()
            await cp.wait_status(run["id"], "disconnected")
            refused = await ordinary.first_answer(held=[])
            assert (refused["type"], refused["code"]) == ("refused", "name_in_use"), refused
            assert refused["message"] == (f"worker w1's run {run['id']} is still in progress with a one-shot agent; "
                                          f"an agent that is not that one cannot use the name until the run has ended")
            assert (await cp.run(run["id"]))["status"] == "disconnected"
            one.run_id = run["id"]
            back = await one.first_answer(held=[run["id"]])
            assert back["runs"][run["id"]]["action"] == "continue", back
            await one.status(run["id"], "succeeded")
            await cp.wait_status(run["id"], "succeeded")
            await one.close()
            await _offline(cp, "w1")
            # The run is over: the credential's ordinary agent may come back.
            assert (await ordinary.first_answer(held=[]))["type"] == "welcome"
        finally:
            await one.close()
            await ordinary.close()


async def test_share_by_memory_set_through_an_instance_is_the_credentials(tmp_path):
    async with _plane(tmp_path) as cp:
        base = OneShotAgent(cp, "slurm", one_shot=False, devices=("cpu",))
        inst = None
        try:
            await base.enroll()
            inst = await _instance(cp, base.credential, "7-0")
            inst.devices = ["cpu", "cuda:0"]
            await inst.connect()
            # The welcome is sent before the connection's executor joins the run service (so no run is
            # assigned before it): the instance's devices count once it has joined.
            await eventually(lambda: "slurm.7-0" in cp.runs.executors, "the instance's executor to join")
            answer = await cp.call("POST", "/api/workers/slurm.7-0/share-by-memory",
                                   {"enabled": True, "device": "cuda:0"})
            assert answer == {"name": "slurm", "share_by_memory": ["cuda:0"]}
            assert (await cp.worker("slurm"))["share_by_memory"] == ["cuda:0"]
            status, body = await cp.api("POST", "/api/workers/slurm.7-0/share-by-memory",
                                        {"enabled": True, "device": "cuda:7"})
            assert (status, body["error"]["message"]) == (
                400, "worker slurm offers no device 'cuda:7' (it offers cpu, cuda:0)"), body
        finally:
            if inst is not None:
                await inst.close()
            await base.close()


async def _worker_when(cp: Plane, name: str, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        w = await cp.worker(name)
        assert w is not None
        return w if pred(w) else None
    return dict(await eventually(check, f"worker {name} {what}", detail=lambda: cp.worker(name)))


async def _offline(cp: Plane, name: str) -> dict[str, Any]:
    return await _worker_when(cp, name, lambda w: not w["online"], "offline")


async def test_a_restarted_control_plane_starts_the_timeout_of_runs_naming_a_one_shot_worker(tmp_path):
    async with _plane(tmp_path) as cp:
        agent = OneShotAgent(cp, "w1")
        normal = FakeAgent(cp, "w2")
        try:
            await agent.enroll()
            await agent.connect()
            await normal.enroll()
            await normal.connect()
        finally:
            await agent.close()
            await normal.close()
        w = await _offline(cp, "w1")
        assert (w["one_shot"], w["one_shot_note"]) == (True, "its last agent took no run")
        await _offline(cp, "w2")
        cp.crash_copy(tmp_path / "ud2")
    async with _plane(tmp_path, "ud2") as cp2:
        named = await cp2.submit({"target": {"worker": "w1"}, "device": "cpu"})
        other = await cp2.submit({"target": {"worker": "w2"}, "device": "cpu"})
        await _reason(cp2, named["id"], "offline")
        await _reason(cp2, other["id"], "offline")
        await cp2.elapse(float(TIMEOUT))
        r = await cp2.wait_status(named["id"], "failed")
        assert "one-shot worker w1" in r["error"]
        await cp2.elapse(DISPATCH_EVERY_S, sleepers=0)  # a later dispatch pass leaves the other run waiting
        await _reason(cp2, other["id"], "offline")


async def test_instances_share_a_credential_and_are_listed_under_it(tmp_path):
    async with _plane(tmp_path) as cp:
        normal = FakeAgent(cp, "slurm", devices=("cpu", "cuda:0"))
        a = b = None
        try:
            await normal.enroll()
            await normal.connect()  # the credential's own agent, beside its instances
            a = await _instance(cp, normal.credential, "7-0")
            b = await _instance(cp, normal.credential, "7-1")
            await a.connect()
            await b.connect()
            same = await _instance(cp, normal.credential, "7-0")
            try:
                refused = await same.first_answer()
                assert (refused["type"], refused["code"]) == ("refused", "name_in_use")
            finally:
                await same.close()
            r1 = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
            r2 = await cp.submit({"target": {"worker": "slurm.7-1"}, "device": "cpu"})
            assert (await a.assignment())["run_id"] == r1["id"]
            assert (await b.assignment())["run_id"] == r2["id"]
            assert (await cp.run(r1["id"]))["worker_id"] == "slurm.7-0"
            card = await cp.worker("slurm")
            assert card is not None and card["devices"][1]["device"] == "cuda:0"  # its own record, unchanged
            assert card["online"] is True and card["one_shot"] is False
            inst = card["instances"]
            assert (inst["connected"], inst["running"]) == (2, 2)
            assert [x["name"] for x in inst["live"]] == ["slurm.7-0", "slurm.7-1"]
            status, body = await cp.api("DELETE", "/api/workers/slurm.7-0")
            assert (status, body["error"]["code"]) == (409, "instance_connected")
            await a.status(r1["id"], "succeeded")
            await a.close()
            card = await _departed(cp, "slurm", 1)
            assert card["instances"]["departed"][0]["name"] == "slurm.7-0"
            assert card["instances"]["departed"][0]["run"] == r1["id"]
            assert await cp.call("DELETE", "/api/workers/slurm.7-0") == {"removed": "slurm.7-0", "instance": True}
            assert (await cp.worker("slurm"))["instances"]["departed"] == []
            waiting = await cp.submit({"target": {"worker": "slurm.9-9"}, "device": "cpu"})
            await cp.call("DELETE", "/api/workers/slurm")
            assert (await cp.wait_status(r2["id"], "interrupted"))["error"].startswith("worker slurm was removed")
            assert (await cp.wait_status(waiting["id"], "failed"))["error"].startswith("worker slurm was removed")
        finally:
            for x in (a, b, normal):
                if x is not None:
                    await x.close()


async def _departed(cp: Plane, name: str, n: int) -> dict[str, Any]:
    return await _worker_when(cp, name, lambda w: len(w["instances"]["departed"]) == n, f"with {n} departed")


async def test_instance_without_one_shot_is_refused_as_bad_flags(tmp_path):
    async with _plane(tmp_path) as cp:
        agent = OneShotAgent(cp, "w1", instance="1", one_shot=False)
        try:
            await agent.enroll()
            refused = await agent.first_answer()
            assert (refused["type"], refused["code"]) == ("refused", "bad_flags")
        finally:
            await agent.close()


def test_the_credentials_device_cap_applies_to_each_instance_and_one_instance_can_have_its_own():
    from cdui.plane.sched.queue import parse_caps
    caps = parse_caps("slurm/cpu=0,slurm.7-1/cpu=1")
    assert (caps.slots("slurm.7-0", "cpu"), caps.slots("slurm.7-1", "cpu"), caps.slots("slurm", "cpu")) == (0, 1, 0)
    assert caps.slots("other.7-0", "cpu") == 1


async def test_the_credentials_cap_and_drain_hold_for_every_instance_in_placement(tmp_path):
    # slurm/cpu=0 closes cpu on every instance of the credential; slurm.7-1/cpu=1 and slurm.8-0/cpu=1
    # reopen it on those two.
    caps = "slurm/cpu=0,slurm.7-1/cpu=1,slurm.8-0/cpu=1"
    async with _plane(tmp_path, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT=caps) as cp:
        normal = FakeAgent(cp, "slurm")
        a = b = c = None
        try:
            await normal.enroll()
            a = await _instance(cp, normal.credential, "7-0")
            await a.connect()
            pool = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
            named = await cp.submit({"target": {"worker": "slurm.7-0"}, "device": "cpu"})
            await _reason(cp, pool["id"], "waiting for a one-shot worker that offers cpu")
            await _reason(cp, named["id"], "slots of slurm.7-0 cpu")
            b = await _instance(cp, normal.credential, "7-1")
            await b.connect()
            assert (await b.assignment())["run_id"] == pool["id"]
            assert a.assigned.empty()

            # Drain is the credential's: it holds for an instance that connects after it was set.
            await cp.call("POST", "/api/workers/slurm/drain")
            c = await _instance(cp, normal.credential, "8-0")
            await c.connect()
            later = await cp.submit({"target": {"pool": "one-shot"}, "device": "cpu"})
            r = await _reason(cp, later["id"], "waiting for a one-shot worker that offers cpu")
            assert r["worker_id"] is None and c.assigned.empty()
            await cp.call("POST", "/api/workers/slurm/undrain")
            assert (await c.assignment())["run_id"] == later["id"]
        finally:
            for x in (a, b, c, normal):
                if x is not None:
                    await x.close()


@pytest.mark.e2e  # 51 connections one after the other: over a second, so out of the default tier
async def test_the_workers_list_keeps_the_last_50_departed_instances(tmp_path):
    async with _plane(tmp_path) as cp:
        normal = FakeAgent(cp, "slurm")
        try:
            await normal.enroll()
            for i in range(51):
                inst = await _instance(cp, normal.credential, f"1-{i}")
                try:
                    await inst.connect()
                finally:
                    await inst.close()
                await _newest_departed(cp, "slurm", f"slurm.1-{i}")
            card = await cp.worker("slurm")
            assert card is not None
            # Newest first; the oldest (1-0) made room for the 51st.
            assert [d["name"] for d in card["instances"]["departed"]] == [f"slurm.1-{i}" for i in range(50, 0, -1)]
            assert {d["note"] for d in card["instances"]["departed"]} == {"it exited without taking a run"}
        finally:
            await normal.close()


async def _newest_departed(cp: Plane, name: str, instance: str) -> dict[str, Any]:
    return await _worker_when(cp, name, lambda w: bool(w["instances"]["departed"])
                              and w["instances"]["departed"][0]["name"] == instance, f"with {instance} departed last")

"""Worker sessions in process: disconnects, resume, grace, adoption, heartbeats, stop.

A real control plane app (``TestServer`` on 127.0.0.1, a real sqlite file)
and a fake agent speaking the real protocol over a real socket. Each test
asserts the one outcome that must happen; time in the control plane moves
only when the test steps its clock."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from harness import FakeAgent, Plane, eventually

from cdui import __version__
from cdui.plane.runs import iso
from cdui.plane.workers import WORKERS
from cdui.wire import protocol

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
            await agent.log(run_id, "hello from w1")
            await agent.status(run_id, "succeeded")
            r = await cp.run(run_id)
            assert (r["status"], r["worker_id"]) == ("succeeded", "w1")
            evs = await cp.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
            assert _ticks(evs) == [1, 2, 3]
            assert [e["data"]["message"] for e in evs if e["kind"] == "log"] == ["hello from w1"]
        finally:
            await agent.close()


async def test_disconnect_within_grace_resumes_without_gap_or_duplicate(tmp_path):
    """Cut mid-run: the run waits ``disconnected``; the agent returns within the grace and
    replays from the acknowledgement; every event is stored once, in order."""
    async with _plane(tmp_path) as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 5)
            await agent.drop()
            r = await cp.wait_status(run_id, "disconnected")
            assert r["worker_status"]["state"] == "disconnected"
            for i in range(6, 16):  # the run ticks on while the link is down
                agent.spool_event(run_id, "progress", tick=i)
            welcome = await agent.connect(held=[run_id])
            assert welcome["runs"] == {run_id: {"acked": 6, "action": "continue"}}
            assert (await cp.run(run_id))["status"] == "running"
            await agent.flush(run_id)
            await agent.status(run_id, "succeeded")
            assert (await cp.run(run_id))["status"] == "succeeded"
            evs = await cp.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
            assert _ticks(evs) == list(range(1, 16))
            assert _warnings(evs) == ["worker_disconnected", "worker_reconnected"]
        finally:
            await agent.close()


async def test_past_grace_interrupted_then_late_result(tmp_path):
    """Past the grace the run ends ``interrupted`` and frees its slot; the returning worker
    is told to stop it, and its own ending is kept as ``late_result`` beside the log."""
    async with _plane(tmp_path, CODEFYUI_WORKER_RESUME_GRACE_S="0.5") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 2)
            await agent.drop()
            await cp.wait_status(run_id, "disconnected")
            await cp.elapse(0.5)
            ended = await cp.wait_status(run_id, "interrupted")
            assert ended["error"] == "worker w1 did not reconnect within 0.5 s (CODEFYUI_WORKER_RESUME_GRACE_S)"
            # The ending is stored first, then its slot freed on the loop's next turn: a read in between (on a
            # loaded machine) still counts the slot, so the test waits for it.
            async def freed() -> bool:
                return (await cp.worker("w1"))["devices"][0]["in_use"] == 0
            await eventually(freed, "the interrupted run's slot to be freed")
            n_events = len(await cp.events(run_id))
            agent.spool_event(run_id, "progress", tick=3)
            agent.spool_event(run_id, "status", status="cancelled")
            welcome = await agent.connect(held=[run_id])
            assert welcome["runs"][run_id]["action"] == "stop"
            await agent.flush(run_id)
            r = await cp.run(run_id)
            assert r["status"] == "interrupted"
            assert (r["late_result"]["status"], r["late_result"]["worker_id"]) == ("cancelled", "w1")
            assert len(await cp.events(run_id)) == n_events, "the event log stays as it was"
        finally:
            await agent.close()


async def test_restart_adopts_the_worker_run_and_it_completes(tmp_path):
    """The control plane is killed mid-run; a second one on its database adopts the run,
    the worker returns with it and replays; the log is complete and says the server restarted."""
    # The first control plane's grace does not matter (it is "killed"); a short one keeps its shutdown short.
    async with _plane(tmp_path, CODEFYUI_WORKER_RESUME_GRACE_S="1") as cp:
        agent = FakeAgent(cp)
        await agent.enroll()
        await agent.connect()
        run_id = await _start_run(cp, agent, 4)
        cp.crash_copy(tmp_path / "ud2")
        await agent.drop()
    try:
        async with _plane(tmp_path, "ud2") as cp2:
            r = await cp2.run(run_id)
            assert r["status"] == "disconnected"
            agent.use_plane(cp2)
            agent.spool_event(run_id, "progress", tick=5)
            welcome = await agent.connect(held=[run_id])
            assert welcome["runs"] == {run_id: {"acked": 5, "action": "continue"}}
            await agent.flush(run_id)
            await agent.status(run_id, "succeeded")
            done = await cp2.run(run_id)
            assert done["status"] == "succeeded"
            evs = await cp2.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
            assert _ticks(evs) == [1, 2, 3, 4, 5]
            restarts = [e for e in evs if e["kind"] == "run_warning" and e["data"].get("restart")]
            assert len(restarts) == 1 and "server restarted" in restarts[0]["data"]["message"]
            await agent.close()  # before the plane stops: see the note in harness.FakeAgent.close
    finally:
        await agent.close()


async def test_restart_without_the_worker_interrupts_after_grace(tmp_path):
    """An adopted run whose worker never comes back ends with the exact reason."""
    async with _plane(tmp_path) as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 1)
            cp.crash_copy(tmp_path / "ud2")
        finally:
            await agent.close()
    async with _plane(tmp_path, "ud2", CODEFYUI_WORKER_RESUME_GRACE_S="0.5") as cp2:
        await cp2.elapse(0.5)
        r = await cp2.wait_status(run_id, "interrupted")
        assert r["error"] == "it did not reconnect with the run within 0.5 s after this server restarted"


async def test_silent_connection_three_missed_heartbeats(tmp_path):
    """A worker silent for three heartbeats counts as disconnected; the run resumes after."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="0.2") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 2)
            # The socket stays open; the agent just says nothing.
            for _ in range(4):
                await cp.elapse(0.2)
            await cp.wait_status(run_id, "disconnected")
            await agent.drop()  # the server closed its end; the agent notices and comes back
            welcome = await agent.connect(held=[run_id])
            assert welcome["runs"] == {run_id: {"acked": 3, "action": "continue"}}
            await agent.status(run_id, "succeeded")
            r = await cp.run(run_id)
            assert r["status"] == "succeeded"
            assert _warnings(await cp.events(run_id)) == ["worker_disconnected", "worker_reconnected"]
        finally:
            await agent.close()


async def test_heartbeats_keep_a_quiet_run_connected(tmp_path):
    """A run that reports nothing for longer than three heartbeats stays ``running``
    while its worker keeps sending heartbeats."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="0.2") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 0)
            for _ in range(6):
                await agent.heartbeat([run_id])
                await cp.elapse(0.2)
            assert (await cp.run(run_id))["status"] == "running"
            await agent.status(run_id, "succeeded")
            assert (await cp.run(run_id))["status"] == "succeeded"
        finally:
            await agent.close()


async def test_stop_while_offline_survives_restart(tmp_path):
    """Stop pressed while the worker is offline is kept across a restart and delivered
    when the worker reconnects; the run ends as the worker stopped it."""
    # The first control plane's grace does not matter (it is "killed"); a short one keeps its shutdown short.
    async with _plane(tmp_path, CODEFYUI_WORKER_RESUME_GRACE_S="1") as cp:
        agent = FakeAgent(cp)
        await agent.enroll()
        await agent.connect()
        run_id = await _start_run(cp, agent, 1)
        await agent.drop()
        await cp.wait_status(run_id, "disconnected")
        await cp.call("POST", f"/api/runs/{run_id}/stop")
        cp.crash_copy(tmp_path / "ud2")
    try:
        async with _plane(tmp_path, "ud2") as cp2:
            agent.use_plane(cp2)
            agent.answer_stop = True
            await agent.connect(held=[run_id])
            done = await cp2.wait_status(run_id, "cancelled", "interrupted", "failed", "succeeded")
            assert done["status"] == "cancelled", done
            assert agent.stops == [run_id]
            await agent.close()  # before the plane stops: see the note in harness.FakeAgent.close
    finally:
        await agent.close()


async def test_graceful_stop_ends_worker_run_as_the_worker_stopped_it(tmp_path):
    """A normal shutdown asks each worker run to stop and keeps reading the worker's socket,
    so the worker's own ending (``cancelled``) is stored and nothing is left to adopt."""
    async with _plane(tmp_path, CODEFYUI_SHUTDOWN_GRACE_S="600") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 1)
            agent.answer_stop = True
            await cp.graceful_stop()
            assert agent.stops == [run_id]
            r = await cp.run(run_id)
            assert r["status"] == "cancelled", r
            evs = await cp.events(run_id)
            final = [e["data"]["status"] for e in evs if e["kind"] == "status"
                     and e["data"].get("status") in ("cancelled", "interrupted")]
            assert final == ["cancelled"]
            assert not [e for e in evs if e["data"].get("restart")]
        finally:
            await agent.close()


async def test_clean_close_by_the_worker_disconnects_its_run(tmp_path):
    """A worker that closes its socket cleanly (the close handshake completes, which
    makes aiohttp cancel the handler) still leaves its run ``disconnected``, waiting."""
    async with _plane(tmp_path) as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 1)
            assert agent.ws is not None
            await agent.ws.close()
            r = await cp.wait_status(run_id, "disconnected")
            assert r["worker_status"]["state"] == "disconnected"
        finally:
            await agent.close()


async def test_stopping_the_server_closes_a_connected_workers_socket(tmp_path):
    """A worker's WebSocket never ends by itself, and aiohttp's shutdown waits for
    every handler: the server closes worker sockets at shutdown instead of
    waiting out its whole shutdown timeout."""
    cp = _plane(tmp_path)
    await cp.__aenter__()
    agent = FakeAgent(cp)
    try:
        await agent.enroll()
        await agent.connect()
        await asyncio.wait_for(cp.__aexit__(None, None, None), 60)
        # Before the fix this shutdown waited on the worker's handler for good.
        assert cp.app is not None
        assert cp.app[WORKERS].conns == {}
    finally:
        await agent.close()


async def _connected_and_heard(cp: Plane, agent: FakeAgent) -> float:
    """Enroll and connect the agent, let 2 s pass, send a heartbeat: the control plane's time it was heard."""
    await agent.enroll()
    await agent.connect()
    await cp.elapse(2)
    beat_at = cp.clock.time()
    await agent.heartbeat([])
    return beat_at


async def _stored_last_seen(cp: Plane, name: str) -> float | None:
    row = await cp.app[WORKERS].store.workers.get(name)  # type: ignore[index]
    return row["last_seen"] if row is not None else None


async def test_last_contact_shown_at_once_stored_within_an_interval_and_kept_across_a_restart(tmp_path):
    """A heartbeat's time is the worker's last contact in the list at once; heartbeats are written
    together once a heartbeat interval, so a killed control plane shows it after a restart too."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="5") as cp:
        agent = FakeAgent(cp)
        try:
            beat_at = await _connected_and_heard(cp, agent)
            assert (await cp.worker("w1"))["last_seen"] == iso(beat_at)
            await cp.elapse(5)  # one heartbeat interval: the heartbeats heard are written
            await eventually(lambda: _is(_stored_last_seen(cp, "w1"), beat_at), "the heartbeat to be written")
            cp.crash_copy(tmp_path / "ud2")
        finally:
            await agent.close()
    async with _plane(tmp_path, "ud2") as cp2:
        w = await cp2.worker("w1")
        assert w is not None and (w["online"], w["last_seen"]) == (False, iso(beat_at))


async def test_last_contact_of_a_worker_gone_is_its_last_heartbeat(tmp_path):
    """A worker that disconnects before its last heartbeat was written shows that heartbeat as its
    last contact once offline, and it is stored."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="5") as cp:
        agent = FakeAgent(cp)
        try:
            beat_at = await _connected_and_heard(cp, agent)
            await agent.drop()

            async def offline() -> dict | None:
                w = await cp.worker("w1")
                return w if w is not None and not w["online"] else None
            w = await eventually(offline, "the worker to be offline")
            assert w["last_seen"] == iso(beat_at)
            await eventually(lambda: _is(_stored_last_seen(cp, "w1"), beat_at), "its last contact to be written")
        finally:
            await agent.close()


async def test_a_last_contact_written_while_the_workers_are_read_is_not_lost(tmp_path):
    """The worker list overlays the last contacts not written yet on the stored rows. One written while the
    rows were being read (a worker that just went has its last contact written at once) is neither in the
    rows read nor pending any more after the read: the list must still show it, not the older stored one."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="5") as cp:
        agent = FakeAgent(cp)
        try:
            beat_at = await _connected_and_heard(cp, agent)
            manager = cp.app[WORKERS]
            assert manager.unwritten_seen == {"w1": beat_at}
            store_rows = manager.store.workers.all

            async def read_then_written() -> Any:
                rows = await store_rows()  # read before the write below lands
                await manager.write_seen()
                return rows
            manager.store.workers.all = read_then_written
            try:
                rows = await manager.worker_rows()
            finally:
                manager.store.workers.all = store_rows
            assert manager.unwritten_seen == {}
            assert [(r["name"], r["last_seen"]) for r in rows] == [("w1", beat_at)]
        finally:
            await agent.close()


async def test_labels_changed_by_a_heartbeat_are_stored_at_once(tmp_path):
    """New labels in a heartbeat (a mount added on the agent) are stored when heard, not an interval later."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="5") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            assert agent.ws is not None
            await agent.ws.send_str(json.dumps({"type": "heartbeat", "runs": [], "labels": {"mount": "/mnt/x"}}))

            async def stored() -> bool:
                row = await cp.app[WORKERS].store.workers.get("w1")  # type: ignore[index]
                return row is not None and json.loads(row["labels"]) == {"mount": "/mnt/x"}
            await eventually(stored, "the new labels to be stored")
            assert (await cp.worker("w1"))["labels"] == {"mount": "/mnt/x"}
        finally:
            await agent.close()


async def test_a_heartbeat_sent_again_word_for_word_is_a_contact_and_any_other_is_read_whole(tmp_path):
    """An agent sends the same heartbeat every interval while nothing changes: the same text again is the
    worker's last contact (its liveness too), and a heartbeat that differs in anything is read whole, so
    labels that change back and forth are stored each time."""
    async with _plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="5") as cp:
        agent = FakeAgent(cp)
        manager = cp.app[WORKERS]  # type: ignore[index]

        async def beat(labels: dict[str, str]) -> None:
            """Send a heartbeat with ``labels`` and wait until the control plane has read it."""
            assert agent.ws is not None
            await agent.ws.send_str(json.dumps({"type": "heartbeat", "runs": [], "labels": labels}))
            await eventually(lambda: manager.conns["w1"].alive_at == cp.clock.monotonic(), "the heartbeat read")

        async def stored(labels: dict[str, str]) -> bool:
            row = await manager.store.workers.get("w1")
            return row is not None and json.loads(row["labels"]) == labels
        try:
            await agent.enroll()
            await agent.connect()
            for step, labels in enumerate([{"mount": "/mnt/x"}, {"mount": "/mnt/x"}, {"mount": "/mnt/y"},
                                           {"mount": "/mnt/y"}, {"mount": "/mnt/x"}, {"mount": "/mnt/x"}]):
                await cp.elapse(2)  # each heartbeat at a time of its own
                beat_at = cp.clock.time()
                await beat(labels)
                assert (await cp.worker("w1"))["last_seen"] == iso(beat_at), step
                assert manager.conns["w1"].labels == labels, step
                await eventually(lambda labels=labels: stored(labels), f"the labels of heartbeat {step} stored")
            # The last one was the one before word for word: its time is the last contact written with the
            # others', and the connection, silent since, is alive.
            await cp.elapse(5)
            await eventually(lambda: _is(_stored_last_seen(cp, "w1"), beat_at), "the last contact to be written")
            assert not manager.conns["w1"].ws.closed
        finally:
            await agent.close()


async def _is(value: Any, expected: Any) -> bool:
    return await value == expected


async def test_events_messages_back_to_back_are_stored_once_in_order_across_a_disconnect(tmp_path):
    """A flood's messages come without waiting for acknowledgements: the control plane reads the next
    while it stores the one before, and stores each in the order sent. Messages sent right before the
    connection ends are stored or, unacknowledged, sent again after the reconnect: every event once."""
    async with _plane(tmp_path) as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run_id = await _start_run(cp, agent, 0)
            for i in range(1, 61):  # one message each, none waiting for its ack
                agent.spool_event(run_id, "progress", tick=i)
                assert agent.ws is not None
                await agent.ws.send_str(protocol.encode_events(run_id, agent.spool[run_id][-1:])[0])
            await agent.wait_acked(run_id, agent.spool[run_id][-1]["src_seq"])
            assert _ticks(await cp.events(run_id)) == list(range(1, 61))
            for i in range(61, 121):
                agent.spool_event(run_id, "progress", tick=i)
                await agent.ws.send_str(protocol.encode_events(run_id, agent.spool[run_id][-1:])[0])
            await agent.drop()
            await cp.wait_status(run_id, "disconnected")
            welcome = await agent.connect(held=[run_id])
            assert welcome["runs"][run_id]["action"] == "continue"
            await agent.flush(run_id)
            await agent.status(run_id, "succeeded")
            evs = await cp.events(run_id)
            assert _ticks(evs) == list(range(1, 121))
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
        finally:
            await agent.close()


async def test_follow_updates_from_the_panel_goes_with_the_version_refusal(tmp_path):
    """"Follow updates" (the Workers panel's switch, POST /api/workers/{name}/follow-updates) is stored with the
    worker and sent with its next version refusal (``update: true``), with what its agent will do; without it, the
    refusal says how to follow. The route refuses what is not a boolean and a worker that does not exist."""
    async with _plane(tmp_path) as cp:
        w1 = FakeAgent(cp, "w1", ("cpu",))
        await w1.enroll()

        async def refused() -> dict:
            async with w1._session.ws_connect(cp.url.replace("http", "ws", 1) + "/ws/worker",
                                              headers={"Authorization": f"Bearer {w1.credential}"}) as ws:
                await ws.send_str(json.dumps(protocol.hello("0.0.1", "w1", ["cpu"], {}, "fake-machine", [])))
                msg = await ws.receive(timeout=60)
                return json.loads(msg.data)
        try:
            first = await refused()
            assert first["type"] == "refused" and first["code"] == "version_mismatch" and "update" not in first
            assert "run `cdui update --from BUNDLE`" in first["message"] and "CODEFYUI_AGENT_AUTO_UPDATE=1" in \
                first["message"], first
            assert await cp.call("POST", "/api/workers/w1/follow-updates", {"enabled": True}) == {
                "name": "w1", "follow_updates": True}
            assert (await cp.worker("w1"))["follow_updates"] is True
            second = await refused()
            assert second["update"] is True and "the owner lets this worker follow the update" in second["message"]
            listed = [r for r in (await cp.call("GET", "/api/workers"))["rejected"] if r["name"] == "w1"]
            assert [r["reason"] for r in listed] == [f"version mismatch: worker 0.0.1, control plane {__version__}"]
            status, body = await cp.api("POST", "/api/workers/w1/follow-updates", {"enabled": "yes"})
            assert (status, body["error"]["code"]) == (400, "bad_request") and "'yes'" in body["error"]["message"]
            status, body = await cp.api("POST", "/api/workers/nobody/follow-updates", {"enabled": True})
            assert status == 404
            assert await cp.call("POST", "/api/workers/w1/follow-updates", {"enabled": False}) == {
                "name": "w1", "follow_updates": False}
            assert "update" not in await refused()
        finally:
            await w1.close()

"""``POST /api/workers/ssh`` and the disable/enable/retry actions, in-process.

The SSH targets here point at 127.0.0.1 port 1, where nothing listens: the
real ssh fails at once and is retried on the fake clock, which never moves."""
from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from harness import FakeAgent, Plane, eventually

TARGET = {"target": "nobody@127.0.0.1", "port": 1}


async def test_adding_ssh_workers(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"], CODEFYUI_SSH_REMOTE_PORT_RANGE="18000-18001") as plane:
        await FakeAgent(plane, "w1").enroll()
        a = await plane.call("POST", "/api/workers/ssh", {**TARGET, "name": "gpu1"}, expect=201)
        assert (a["name"], a["slot"], a["port"], a["remote_cdui"], a["enabled"]) == (
            "gpu1", 18000, 1, "~/CodefyUI/bin/cdui", True)
        iid = (dirs["user_data"] / "ssh-instance-id").read_text().strip()
        assert a["control"] == f"http://cp-{iid}.invalid:18000" and a["remote_dir"] == f"~/.codefyui-ssh/{iid}-18000"
        b = await plane.call("POST", "/api/workers/ssh", {"target": "alice@gpu2.lab", "port": 1}, expect=201)
        assert (b["name"], b["slot"]) == ("gpu2", 18001)
        for name in ("gpu1", "w1"):  # an SSH worker's name, an enrolled worker's name
            status, body = await plane.api("POST", "/api/workers/ssh", {**TARGET, "name": name})
            assert status == 409 and body["error"]["code"] == "name_taken", body
        status, body = await plane.api("POST", "/api/workers/ssh", {**TARGET, "name": "gpu3"})
        assert status == 409 and body["error"]["code"] == "no_slot"
        for bad in ({"target": "-oProxyCommand=touch /tmp/x"}, {"target": "a b"}, {**TARGET, "port": 0},
                    {**TARGET, "port": "22"}, {**TARGET, "name": "../x"}, {**TARGET, "identity": "-i/x"}):
            status, body = await plane.api("POST", "/api/workers/ssh", bad)
            assert status == 400, (bad, body)
        workers = {w["name"]: w for w in (await plane.call("GET", "/api/workers"))["workers"]}
        assert workers["gpu1"]["never_connected"] is True and workers["gpu1"]["ssh"]["slot"] == 18000
        assert "ssh" not in workers["w1"]
        listed = (await plane.call("GET", "/api/workers/ssh"))["ssh_workers"]
        assert [w["name"] for w in listed] == ["gpu1", "gpu2"]


async def test_disable_enable_and_retry(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as plane:
        await plane.call("POST", "/api/workers/ssh", {**TARGET, "name": "gpu1"}, expect=201)
        assert await plane.call("POST", "/api/workers/gpu1/disable") == {"name": "gpu1", "disabled": True}
        view = (await plane.call("GET", "/api/workers/ssh"))["ssh_workers"][0]
        assert view["enabled"] is False and view["tunnel"]["state"] == "stopped"
        status, body = await plane.api("POST", "/api/workers/gpu1/retry")
        assert status == 409 and body["error"]["code"] == "disabled"
        assert await plane.call("POST", "/api/workers/gpu1/enable") == {"name": "gpu1", "disabled": False}
        assert (await plane.call("GET", "/api/workers/ssh"))["ssh_workers"][0]["enabled"] is True
        assert await plane.call("POST", "/api/workers/gpu1/retry") == {"name": "gpu1", "retrying": True}
        assert (await plane.call("DELETE", "/api/workers/gpu1")) == {"removed": "gpu1", "cleanup": "started"}
        assert (await plane.call("GET", "/api/workers/ssh"))["ssh_workers"] == []
        status, _ = await plane.api("POST", "/api/workers/nosuch/disable")
        assert status == 404


async def test_a_disabled_worker_takes_no_runs_whoever_connects(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as plane:
        agent = await FakeAgent(plane, "w1").enroll()
        await plane.call("POST", "/api/workers/w1/drain")
        await plane.call("POST", "/api/workers/w1/disable")
        await agent.connect()
        run = await plane.submit({"target": {"worker": "w1"}})
        queued = await plane.wait_status(run["id"], "queued")
        assert (await plane.worker("w1") or {})["status"] == "disabled"
        await plane.call("POST", "/api/workers/w1/enable")  # also ends the drain
        assert (await plane.worker("w1") or {})["drained"] is False
        assert (await agent.assignment())["run_id"] == run["id"]
        await agent.status(run["id"], "succeeded")
        assert queued["status"] == "queued" and (await plane.run(run["id"]))["status"] == "succeeded"


async def tunnel_when(plane: Plane, name: str, pred: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    """The SSH worker's tunnel once ``pred`` holds: waits for the reaction to a real ssh's exit."""
    async def tunnel() -> dict[str, Any]:
        workers = (await plane.call("GET", "/api/workers/ssh"))["ssh_workers"]
        return dict({w["name"]: w for w in workers}[name]["tunnel"])

    async def check() -> dict[str, Any] | None:
        t = await tunnel()
        return t if pred(t) else None
    return dict(await eventually(check, what, timeout, tunnel))


# It runs real subprocesses (an ssh per attempt): the e2e tier, so the default tier stays fast.
@pytest.mark.e2e
async def test_retry_starts_at_once_and_keeps_the_drain(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as plane:
        await plane.call("POST", "/api/workers/ssh", {**TARGET, "name": "gpu1"}, expect=201)
        failed = await tunnel_when(plane, "gpu1", lambda t: t["state"] == "failed" and t["retrying"],
                                   "the first attempt to fail and wait for its retry")
        assert failed["next_attempt_s"] == 2 and failed["attempts"] == 1
        # The worker has enrolled once (its row exists) and is drained.
        await FakeAgent(plane, "gpu1").enroll()
        await plane.call("POST", "/api/workers/gpu1/drain")
        assert (await plane.worker("gpu1") or {})["drained"] is True
        before = plane.clock.monotonic()
        assert await plane.call("POST", "/api/workers/gpu1/retry") == {"name": "gpu1", "retrying": True}
        # The fake clock has not moved: only Retry can have started the second attempt.
        again = await tunnel_when(plane, "gpu1", lambda t: t["attempts"] == 2 and t["state"] == "failed",
                                  "the retried attempt")
        assert plane.clock.monotonic() == before
        assert again["retrying"] and again["next_attempt_s"] == 2  # a fresh series, not the next step of the old
        w = await plane.worker("gpu1") or {}
        assert w["drained"] is True and w["status"] != "disabled", w


class SilentHost:
    """A TCP listener standing in for an ssh host: it accepts every connection and answers none,
    except those whose number (from 1) is in ``refuse``, which it closes at once. An ssh to it waits
    for the server's greeting until the connection is closed."""

    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            if self.accepted in self.refuse:
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        """Every held connection ends: each ssh waiting on one exits at once."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.sock.close()
        self._thread.join(30)
        for conn in self.held:
            conn.close()


async def until(what: str, pred: Any, timeout: float = 30.0) -> None:
    """Wait for something a real subprocess or socket does; fails after ``timeout`` real seconds."""
    await eventually(pred, what, timeout)


# It runs real subprocesses (an ssh per attempt): the e2e tier, so the default tier stays fast.
@pytest.mark.e2e
async def test_a_pending_cleanup_keeps_its_slot_across_a_restart(dirs: dict[str, Path]) -> None:
    """A delete's remote cleanup still waiting on its host when the control plane stops: the next
    start still keeps the slot out of use, runs the cleanup again, and frees the slot when it ends."""
    # Connection 1: the worker's preparation (held); 2: the delete's stop, answered with a close at
    # once so that the delete goes on; 3: the cleanup (held until the stop); 4: the cleanup again.
    host = SilentHost(refuse={2})
    settings = {"CODEFYUI_SSH_REMOTE_PORT_RANGE": "18000-18001"}
    try:
        async with Plane(dirs["user_data"], dirs["data_dir"], **settings) as plane:
            await plane.call("POST", "/api/workers/ssh", {"target": "nobody@127.0.0.1", "port": host.port,
                                                          "name": "gone"}, expect=201)

            async def accepted(n: int) -> bool:
                return host.accepted >= n
            await until("the preparation's connection", lambda: accepted(1))
            assert await plane.call("DELETE", "/api/workers/gone") == {"removed": "gone", "cleanup": "started"}
            await until("the cleanup's connection", lambda: accepted(3))
            assert (await plane.call("GET", "/api/workers/ssh"))["cleaning_slots"] == [18000]
        # The server stopped while the cleanup waited: the next start resumes it.
        async with Plane(dirs["user_data"], dirs["data_dir"], **settings) as plane:
            await until("the resumed cleanup's connection", lambda: accepted(4))
            listed = await plane.call("GET", "/api/workers/ssh")
            assert (listed["ssh_workers"], listed["cleaning_slots"]) == ([], [18000])
            other = await plane.call("POST", "/api/workers/ssh", {"target": "nobody@127.0.0.1", "port": host.port,
                                                                  "name": "other"}, expect=201)
            assert other["slot"] == 18001
            host.close()  # the host answers now (with a close): the attempt ends, and with it the reservation

            async def freed() -> bool:
                return (await plane.call("GET", "/api/workers/ssh"))["cleaning_slots"] == []
            await until("the cleanup to end", freed)
            third = await plane.call("POST", "/api/workers/ssh", {"target": "nobody@127.0.0.1", "port": host.port,
                                                                  "name": "third"}, expect=201)
            assert third["slot"] == 18000
    finally:
        host.close()

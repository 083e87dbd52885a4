"""A hostile worker: it enrolls with a real token and speaks the real
``/ws/worker`` protocol (messages built with :mod:`cdui.protocol`), then tries
to make the control plane open, hash or serve paths of its choosing, and to
crash or starve it with malformed messages.

The control plane is a real ``cdui start`` process; the fake agent is this
test, with an aiohttp WebSocket client.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdui import __version__, protocol
from cdui.artifact_files import ArtifactRefused, confine, inspect
from procs import ServerProc, start_then, wait_for

NAME = "evil"


class FakeAgent:
    """Just enough of an agent: enroll, hello, take one assignment, send events, read acks."""

    def __init__(self, cp: ServerProc) -> None:
        self.cp = cp
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.seq = 0

    async def connect(self) -> dict[str, Any]:
        tok = await asyncio.to_thread(self.cp.call, "POST", "/api/workers/tokens", {"ttl_s": 600, "uses": 1})
        status, body = await asyncio.to_thread(self.cp.api, "POST", "/api/workers/enroll",
                                               {"token": tok["token"], "name": NAME, "devices": ["cpu"],
                                                "version": __version__, "machine_id": "another-machine"},
                                               False)
        assert status == 201, body
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(f"{self.cp.url}/ws/worker",
                                                headers={"Authorization": f"Bearer {body['credential']}"})
        await self.ws.send_str(json.dumps(protocol.hello(__version__, NAME, ["cpu"], {}, "another-machine", [])))
        welcome = await self.receive()
        assert welcome["type"] == "welcome", welcome
        return welcome

    async def receive(self, timeout: float = 60) -> dict[str, Any]:
        assert self.ws is not None
        msg = await self.ws.receive(timeout=timeout)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        return json.loads(msg.data)

    async def receive_type(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            m = await self.receive(max(0.1, deadline - time.monotonic()))
            if m["type"] == kind:
                return m

    async def send_events(self, run_id: str, events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """Send events with the next src_seqs; wait for the ack that covers them all."""
        assert self.ws is not None
        batch = []
        for kind, data in events:
            self.seq += 1
            batch.append({"src_seq": self.seq, "kind": kind, "data": data, "at": time.time()})
        await self.ws.send_str(json.dumps({"type": "events", "run_id": run_id, "events": batch}))
        ack = await self.receive_type("ack")
        assert ack == {"type": "ack", "run_id": run_id, "acked": self.seq}, ack
        return ack

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()


@pytest.fixture
def cp(tmp_path):
    s = ServerProc(tmp_path).start()
    yield s
    s.stop()


def assert_still_serving(cp: ServerProc) -> None:
    """Every kind of route answers (a blocked event loop or database thread would time out)."""
    for path in ("/api/health", "/api/runs", "/api/workers", "/api/workers/tokens"):
        r = cp.raw("GET", path, timeout=20)
        assert r.status == 200, (path, r.status, r.body[:300])


def test_worker_artifact_paths_are_never_opened_or_served(cp, tmp_path):
    """A worker's artifact events naming /etc/passwd, the user data folder, /dev/zero, a FIFO,
    a link out or a ``../`` path become artifact_refused warnings, no artifact row, nothing to
    download; a left_on_worker path is shown but refused by the download route."""
    out = cp.data_dir / "output"
    out.mkdir(parents=True, exist_ok=True)
    os.mkfifo(out / "fifo")
    (out / "passwd-link").symlink_to("/etc/passwd")
    (out / "zero-link").symlink_to("/dev/zero")
    (out / "private-link").symlink_to(cp.user_data)
    (out / "folder-with-fifo").mkdir()
    os.mkfifo(out / "folder-with-fifo" / "pipe")
    hostile: list[dict[str, Any]] = [
        # No backend: the local-path branch, which a worker's event must never take.
        {"kind": "model", "name": "passwd", "path": "/etc/passwd"},
        {"kind": "model", "name": "token", "path": str(cp.user_data / "session-token")},
        {"kind": "model", "name": "userdata", "path": str(cp.user_data)},
        {"kind": "model", "name": "zero", "path": "/dev/zero"},
        {"kind": "model", "name": "fifo", "path": str(out / "fifo")},
        {"kind": "model", "name": "odd", "path": "/etc/passwd", "backend": "local"},
        # Mount paths are relative to the data folder, resolved and checked here.
        {"kind": "model", "name": "a", "backend": "mount", "label": "data", "relative_path": "/etc/passwd"},
        {"kind": "model", "name": "b", "backend": "mount", "label": "data", "relative_path": "../../../../etc/passwd"},
        {"kind": "model", "name": "c", "backend": "mount", "label": "data",
         "relative_path": f"../{cp.user_data.name}/session-token"},
        {"kind": "model", "name": "d", "backend": "mount", "label": "data", "relative_path": "output/passwd-link"},
        {"kind": "model", "name": "e", "backend": "mount", "label": "data", "relative_path": "output/zero-link"},
        {"kind": "model", "name": "f", "backend": "mount", "label": "data", "relative_path": "output/private-link"},
        {"kind": "model", "name": "g", "backend": "mount", "label": "data", "relative_path": "output/fifo"},
        {"kind": "model", "name": "h", "backend": "mount", "label": "data", "relative_path": "output/folder-with-fifo"},
    ]
    left = {"kind": "model", "name": "stayed", "path": "/etc/passwd", "backend": "left_on_worker", "size": 10}

    async def scenario() -> str:
        agent = FakeAgent(cp)
        try:
            await agent.connect()
            run = await asyncio.to_thread(cp.submit, start_then("TensorCreate"), {"target": {"worker": NAME}})
            assign = await agent.receive_type("assign")
            assert assign["run_id"] == run["id"]
            await agent.send_events(run["id"], [("status", {"status": "running"})])
            for data in hostile:
                await agent.send_events(run["id"], [("artifact", data)])
            await agent.send_events(run["id"], [("artifact", left)])
            await asyncio.to_thread(assert_still_serving, cp)
            await agent.send_events(run["id"], [("status", {"status": "succeeded"})])
            return run["id"]
        finally:
            await agent.close()

    run_id = asyncio.run(scenario())
    evs = cp.events(run_id)
    refused = [e["data"] for e in evs if e["kind"] == "run_warning" and e["data"].get("kind") == "artifact_refused"]
    expected_paths = [d.get("path") or d.get("relative_path") for d in hostile]
    assert [r["path"] for r in refused] == expected_paths, refused
    assert all(r["path"] in r["message"] for r in refused), refused
    arts = cp.call("GET", f"/api/runs/{run_id}/artifacts", expect=200)
    assert [(a["backend"], a["name"], a["path"]) for a in arts] == [("left_on_worker", "stayed", "/etc/passwd")], arts
    for aid in range(1, 30):
        r = cp.raw("GET", f"/api/runs/{run_id}/artifacts/{aid}/download")
        assert r.status == 404, (aid, r.status, r.body[:200])
        assert b"root:" not in r.body
    status, body = cp.api("GET", f"/api/runs/{run_id}/artifacts/{arts[0]['id']}/download")
    assert body["error"]["code"] == "not_here" and "stayed on the worker" in body["error"]["message"], body
    assert cp.run(run_id)["status"] == "succeeded"
    assert_still_serving(cp)


def test_a_mount_artifact_inside_the_data_folder_is_still_recorded(cp):
    """The checks keep the legitimate case: a regular file under data/ becomes a mount row with this
    server's path (and null where the content differs)."""
    model = cp.data_dir / "models" / "m.pt"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(b"weights")
    import hashlib
    sha = hashlib.sha256(b"weights").hexdigest()

    async def scenario() -> str:
        agent = FakeAgent(cp)
        try:
            await agent.connect()
            run = await asyncio.to_thread(cp.submit, start_then("TensorCreate"), {"target": {"worker": NAME}})
            await agent.receive_type("assign")
            await agent.send_events(run["id"], [
                ("status", {"status": "running"}),
                ("artifact", {"kind": "model", "name": "m.pt", "backend": "mount", "label": "data",
                              "relative_path": "models/m.pt", "size": 7, "sha256": sha}),
                ("artifact", {"kind": "model", "name": "m.pt", "backend": "mount", "label": "data",
                              "relative_path": "models/m.pt", "size": 7, "sha256": "0" * 64}),
                ("status", {"status": "succeeded"})])
            return run["id"]
        finally:
            await agent.close()

    run_id = asyncio.run(scenario())
    arts = cp.call("GET", f"/api/runs/{run_id}/artifacts", expect=200)
    assert [(a["backend"], a["path"]) for a in arts] == [("mount", str(model)), ("mount", None)], arts
    r = cp.raw("GET", f"/api/runs/{run_id}/artifacts/{arts[0]['id']}/download")
    assert r.status == 200 and r.body == b"weights"


def test_inspect_refuses_what_is_not_a_plain_file(tmp_path):
    """The file checks on their own: confinement, links, FIFOs, devices, folders with odd entries, the hash cap."""
    root = tmp_path / "data"
    private = root / "private"
    private.mkdir(parents=True)
    (root / "ok.bin").write_bytes(b"x" * 10)
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    (root / "dir" / "a").write_bytes(b"abc")
    (root / "dir" / "link").symlink_to(root / "ok.bin")
    facts = inspect(confine(root / "ok.bin", [root]), max_hash_bytes=100)
    assert facts is not None and facts.size == 10 and facts.sha256 is not None
    big = inspect(confine(root / "ok.bin", [root]), max_hash_bytes=5)
    assert big is not None and big.size == 10 and big.sha256 is None
    assert inspect(confine(root / "missing", [root]), 100) is None
    for path, roots, why in [
        ("/etc/passwd", [root], "outside"),
        (str(root / ".." / "x"), [root], "outside"),
        (str(private / "cred"), [root], "private"),
        ("relative/path", [root], "absolute"),
    ]:
        with pytest.raises(ArtifactRefused, match=why):
            confine(path, roots, [private])
    with pytest.raises(ArtifactRefused, match="not a regular file"):
        inspect(root / "fifo", 100)
    with pytest.raises(ArtifactRefused, match="not a regular file"):
        inspect(Path("/dev/zero"), 100)
    with pytest.raises(ArtifactRefused, match="link"):
        inspect(root / "dir", 100)

"""A hostile worker: it enrolls with a real token and speaks the real
``/ws/worker`` protocol (messages built with :mod:`cdui.wire.protocol`), then tries
to make the control plane open, hash or serve paths of its choosing, and to
crash or starve it with malformed messages.

The control plane is a real ``cdui start`` process; the fake agent is this
test, with an aiohttp WebSocket client.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdui import __version__
from cdui.plane.files.artifact_files import ArtifactRefused, confine, inspect
from cdui.wire import protocol
from procs import ServerProc, start_then

sys.path.insert(0, str(Path(__file__).parent / "inproc"))
from harness import FakeAgent  # noqa: E402

# Every test here starts real cdui processes (servers, agents or run subprocesses) and checks what
# they do on the machine: the e2e tier.
pytestmark = pytest.mark.e2e

NAME = "evil"


async def evil_agent(cp: ServerProc) -> FakeAgent:
    """The hostile worker, enrolled and connected (another machine's id)."""
    agent = FakeAgent(cp, NAME)
    agent.machine_id = "another-machine"
    await agent.enroll()
    await agent.connect()
    return agent


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
        agent = await evil_agent(cp)
        try:
            run = await asyncio.to_thread(cp.submit, start_then("TensorCreate"), {"target": {"worker": NAME}})
            assign = await agent.assignment()
            assert assign["run_id"] == run["id"]
            await agent.status(run["id"], "running")
            for data in hostile:
                await agent.artifact(run["id"], **data)
            await agent.artifact(run["id"], **left)
            await asyncio.to_thread(assert_still_serving, cp)
            await agent.status(run["id"], "succeeded")
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
        agent = await evil_agent(cp)
        try:
            run = await asyncio.to_thread(cp.submit, start_then("TensorCreate"), {"target": {"worker": NAME}})
            await agent.assignment()
            await agent.send_batch(run["id"], [
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


def _events_msg(**event: Any) -> str:
    ev = {"src_seq": 1, "kind": "log", "data": {"message": "hi"}, "at": 1.7e9, **event}
    return json.dumps({"type": "events", "run_id": "r1", "events": [ev]})


def _nested(depth: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(depth):
        d = {"x": d}
    return d


MALFORMED = [
    ("not json", "not JSON"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": NaN}, "at": 1.7e9}]}',
     "NaN"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": -Infinity}}]}',
     "Infinity"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {}, "at": 1e999}]}',
     "out of range"),
    (_events_msg(at=-1), "UNIX time"),
    (_events_msg(at="yesterday"), "UNIX time"),
    (_events_msg(at=True), "UNIX time"),
    (_events_msg(src_seq=0), "src_seq=0 is out of range"),
    (_events_msg(src_seq=2 ** 60), "out of range"),
    (_events_msg(src_seq=True), "type bool"),
    (_events_msg(kind="k" * 1000), "over the limit"),
    (_events_msg(data=_nested(40)), "nests deeper"),
    (_events_msg(data=[1, 2]), "not an object"),
    (json.dumps({"type": "events", "run_id": "r1", "events": [{"src_seq": i + 1, "kind": "log", "data": {}}
                                                              for i in range(protocol.MAX_EVENTS + 1)]}),
     "over the limit"),
    (json.dumps({"type": "events", "run_id": "r" * 1000, "events": []}), "over the limit"),
    ("[" * 100000 + "]" * 100000, "nests too deeply"),
    ('{"type": "surprise"}', "unknown message type"),
    ('{"type": "heartbeat", "runs": [1, 2]}', "must be a string"),
    ('{"type": "heartbeat", "labels": {"k": {"nested": 1}}}', "must be a string"),
    (json.dumps(protocol.hello(__version__, NAME, ["cpu"], {}, "m", [])), "hello was already received"),
]


def test_malformed_worker_messages_get_an_error_and_the_connection_stays_up(cp):
    """Each malformed message is answered with a protocol error saying what was wrong; the
    connection handler keeps going and the server keeps serving."""

    async def scenario() -> None:
        agent = await evil_agent(cp)
        try:
            assert agent.ws is not None
            for i, (raw, why) in enumerate(MALFORMED, 1):
                await agent.ws.send_str(raw)
                answer = await agent.message("error", i)
                assert why in answer["message"], (raw[:80], answer)
            await agent.ws.send_bytes(b"\x00\x01")
            answer = await agent.message("error", len(MALFORMED) + 1)
            assert "binary frames" in answer["message"], answer
            # Still the same, working connection: events for a run it does not hold are acknowledged.
            await agent.ws.send_str(_events_msg(src_seq=3))
            await agent.wait_acked("r1", 3)
            assert agent.acked["r1"] == 3
            await asyncio.to_thread(assert_still_serving, cp)
            w = [x for x in (await asyncio.to_thread(cp.call, "GET", "/api/workers"))["workers"] if x["name"] == NAME]
            assert w and w[0]["online"], w
        finally:
            await agent.close()

    asyncio.run(scenario())
    assert "sent a malformed message" in cp.log_text()


def test_an_oversized_message_closes_only_that_connection(cp):
    async def scenario() -> None:
        agent = await evil_agent(cp)
        try:
            assert agent.ws is not None
            try:
                await agent.ws.send_str(_events_msg(data={"pad": "x" * (protocol.MAX_MESSAGE + 1)}))
            except ConnectionError:
                pass  # the server hung up while the frame was still going out: what we want
            assert agent._reader is not None
            await asyncio.wait_for(agent._reader, 60)  # whatever aiohttp reports for the close ends its reading
            # The server closed it: a close frame (with its code) or the connection's end.
            assert agent.ws.closed or agent.ws.close_code is not None, agent.ws.exception()
            # Only that connection ended: the same worker connects again and is welcomed.
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"{cp.url}/ws/worker",
                                        headers={"Authorization": f"Bearer {agent.credential}"}) as ws:
                    await ws.send_str(json.dumps(protocol.hello(__version__, NAME, ["cpu"], {}, "m", [])))
                    assert json.loads((await ws.receive(timeout=60)).data)["type"] == "welcome"
        finally:
            await agent.close()

    asyncio.run(scenario())
    assert_still_serving(cp)


def test_rejected_connections_keep_the_latest_50_names(cp):
    """A worker naming itself anything cannot grow the list of refused connections without end."""

    async def scenario() -> None:
        agent = await evil_agent(cp)
        try:
            cred = f"Bearer {agent.credential}"
        finally:
            await agent.close()
        async with aiohttp.ClientSession() as s:
            for i in range(60):
                async with s.ws_connect(f"{cp.url}/ws/worker", headers={"Authorization": cred}) as ws:
                    await ws.send_str(json.dumps(protocol.hello(__version__, f"n{i}", ["cpu"], {}, "m", [])))
                    m = json.loads((await ws.receive(timeout=60)).data)
                    assert m["type"] == "refused" and m["code"] == "credential_mismatch", m

    asyncio.run(scenario())
    rejected = cp.call("GET", "/api/workers", expect=200)["rejected"]
    assert sorted(r["name"] for r in rejected) == sorted(f"n{i}" for i in range(10, 60)), rejected


def test_encode_events_splits_by_size_and_keeps_the_sequence():
    """The agent's side of the message limit: batches split in order, an event too big on its own
    becomes a warning with the same src_seq, NaN travels as a string; every message parses."""
    evs = [{"src_seq": i, "kind": "log", "data": {"message": "m" * 500, "v": float("nan")}, "at": 1.7e9}
           for i in range(1, 301)]
    evs.append({"src_seq": 301, "kind": "log", "data": {"message": "x" * 40000}, "at": 1.7e9})
    msgs = protocol.encode_events("r1", evs, limit=20000)
    assert len(msgs) > 1 and all(len(m.encode()) <= 20000 for m in msgs)
    parsed = [protocol.parse_agent_message(m) for m in msgs]
    got = [e for p in parsed for e in p.events]  # type: ignore[union-attr]
    assert [e["src_seq"] for e in got] == list(range(1, 302))
    assert got[0]["data"]["v"] == "nan"
    assert got[-1]["kind"] == "run_warning" and got[-1]["data"]["kind"] == "event_too_large"


# A node of a local run that reports artifacts at paths it names itself.
PLANTER = '''
import os
from pathlib import Path
from cdui.nodes.base import Node, Param, Port


class Planter(Node):
    NODE_NAME = "Planter"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("paths", "string", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        for p in params["paths"].split("|"):
            ctx.emit("artifact", {"kind": "output", "path": p, "name": Path(p).name})
        return {"value": 1.0}
'''


def test_local_artifacts_are_confined_to_the_data_folders(tmp_path):
    """Artifacts of a run on the control plane itself: only regular files inside the data folders
    become rows; /etc/passwd, the user data folder, /dev/zero and a FIFO become warnings."""
    cp = ServerProc(tmp_path)
    (cp.data_dir / "custom_nodes").mkdir(parents=True)
    (cp.data_dir / "custom_nodes" / "planter.py").write_text(PLANTER)
    (cp.data_dir / "output").mkdir(parents=True)
    os.mkfifo(cp.data_dir / "output" / "fifo")
    good = cp.data_dir / "output" / "good.txt"
    good.write_text("fine")
    cp.start()
    try:
        bad = ["/etc/passwd", str(cp.user_data / "session-token"), "/dev/zero", str(cp.data_dir / "output" / "fifo")]
        run = cp.submit(start_then("Planter", paths="|".join(bad + [str(good)])))
        from procs import wait_run
        assert wait_run(cp, run["id"], timeout=120)["status"] == "succeeded"
        refused = [e["data"]["path"] for e in cp.events(run["id"])
                   if e["kind"] == "run_warning" and e["data"].get("kind") == "artifact_refused"]
        assert refused == bad
        arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
        assert [(a["backend"], a["path"]) for a in arts] == [("local", str(good))], arts
        r = cp.raw("GET", f"/api/runs/{run['id']}/artifacts/{arts[0]['id']}/download")
        assert r.status == 200 and r.body == b"fine"
        assert_still_serving(cp)
    finally:
        cp.stop()


def test_a_folder_artifact_downloads_as_a_zip_of_its_regular_files_only(cp):
    """A mount folder of regular files is recorded; a link planted in it later is left out of the zip."""
    import io
    import zipfile
    tb = cp.data_dir / "output" / "tb"
    (tb / "sub").mkdir(parents=True)
    (tb / "a.txt").write_text("a")
    (tb / "sub" / "b.txt").write_text("b")

    async def scenario() -> str:
        agent = await evil_agent(cp)
        try:
            run = await asyncio.to_thread(cp.submit, start_then("TensorCreate"), {"target": {"worker": NAME}})
            await agent.assignment()
            await agent.send_batch(run["id"], [
                ("status", {"status": "running"}),
                ("artifact", {"kind": "tensorboard", "name": "tb", "backend": "mount", "label": "data",
                              "relative_path": "output/tb"}),
                ("status", {"status": "succeeded"})])
            return run["id"]
        finally:
            await agent.close()

    run_id = asyncio.run(scenario())
    arts = cp.call("GET", f"/api/runs/{run_id}/artifacts", expect=200)
    assert [(a["backend"], a["path"]) for a in arts] == [("mount", str(tb))], arts
    (tb / "passwd").symlink_to("/etc/passwd")
    (tb / "etc").symlink_to("/etc")
    r = cp.raw("GET", f"/api/runs/{run_id}/artifacts/{arts[0]['id']}/download")
    assert r.status == 200, r.body[:300]
    with zipfile.ZipFile(io.BytesIO(r.body)) as z:
        assert sorted(z.namelist()) == ["a.txt", "sub/b.txt"]

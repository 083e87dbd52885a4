"""Bad input from a worker, a user or anyone on the network, against a real
control plane app in this test's event loop (the in-process tier: real
sockets, a real sqlite file, no processes).

Each case gets a clear error (a WebSocket ``error``/``refused`` message, or the
one JSON error shape over HTTP), the server keeps serving (``/api/health``
and the rest answer after it), and nothing is written outside the folders the
route owns (the whole test folder is snapshotted before and after).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import aiohttp

from cdui import __version__
from cdui.plane.appkeys import SESSION_TOKEN
from cdui.wire import protocol
from inproc.harness import Plane

NAME = "w1"


# -- helpers -----------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (not following links): path -> (size, mtime in ns)."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
            allowed: tuple[str, ...] = ()) -> list[str]:
    """Files added, removed or modified, except the database's own and those under ``allowed``."""
    own = ("ud/cdui.sqlite3",)
    out = []
    for path in sorted(set(before) | set(after)):
        if before.get(path) == after.get(path) or path.startswith(own) or path.startswith(allowed):
            continue
        out.append(path)
    return out


async def serving(plane: Plane) -> None:
    """The server still answers every kind of route (a crashed handler or a stuck writer would not)."""
    for path in ("/api/health", "/api/runs", "/api/workers", "/api/workers/tokens"):
        status, body = await plane.api("GET", path)
        assert status == 200, (path, status, body)
    status, body = await plane.api("GET", "/api/health")
    assert body["status"] == "ok", body


async def error_of(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    body = json.loads(await resp.text())
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]


class RawWorker:
    """An enrolled worker that sends exactly the frames the test writes, and reads every answer."""

    def __init__(self, plane: Plane, name: str = NAME) -> None:
        self.plane = plane
        self.name = name
        self.credential = ""
        self.session = aiohttp.ClientSession()
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def enroll(self) -> RawWorker:
        tok = (await self.plane.call("POST", "/api/workers/tokens", {"ttl_s": 600, "uses": 1}, expect=201))["token"]
        res = await self.plane.call("POST", "/api/workers/enroll", {
            "token": tok, "name": self.name, "devices": ["cpu"], "version": __version__,
            "machine_id": "elsewhere"}, expect=201)
        self.credential = res["credential"]
        return self

    async def open(self, credential: str | None = None) -> aiohttp.ClientWebSocketResponse:
        cred = self.credential if credential is None else credential
        self.ws = await self.session.ws_connect(self.plane.url.replace("http", "ws", 1) + "/ws/worker",
                                                headers={"Authorization": f"Bearer {cred}"}, max_msg_size=0)
        return self.ws

    async def connect(self) -> dict[str, Any]:
        ws = await self.open()
        await ws.send_str(json.dumps(protocol.hello(__version__, self.name, ["cpu"], {}, "elsewhere", [])))
        welcome = await self.receive()
        assert welcome["type"] == "welcome", welcome
        return welcome

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        assert self.ws is not None
        msg = await self.ws.receive(timeout=timeout)
        assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, msg.extra)
        return json.loads(msg.data)

    async def receive_type(self, kind: str, timeout: float = 30) -> dict[str, Any]:
        while True:
            m = await self.receive(timeout)
            if m["type"] == kind:
                return m

    async def events(self, run_id: str, events: list[dict[str, Any]]) -> int:
        """Send one events message as given; return the acknowledgement."""
        assert self.ws is not None
        await self.ws.send_str(json.dumps({"type": "events", "run_id": run_id, "events": events}))
        ack = await self.receive_type("ack")
        assert ack["run_id"] == run_id, ack
        return int(ack["acked"])

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        await self.session.close()


def ev(seq: int, kind: str = "progress", **data: Any) -> dict[str, Any]:
    return {"src_seq": seq, "kind": kind, "data": data or {"tick": seq}, "at": 1_800_000_000.0 + seq}


async def assigned_run(plane: Plane, worker: RawWorker) -> str:
    run = await plane.submit({"target": {"worker": worker.name}})
    assign = await worker.receive_type("assign")
    assert assign["run_id"] == run["id"], assign
    return str(run["id"])


# -- the WebSocket of a worker ------------------------------------------------------------
def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


MALFORMED: list[tuple[str, str]] = [
    ("not json at all", "not JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('"hello"', "must be a JSON object"),
    ('{"type": "nonsense"}', "unknown message type 'nonsense'"),
    ('{"no_type": 1}', "unknown message type 'None'"),
    ('{"type": "events"}', "missing field 'events'"),
    ('{"type": "events", "run_id": "r", "events": {}}', "field 'events' has type dict"),
    ('{"type": "events", "run_id": "r", "events": [{"kind": "log"}]}', "missing field 'src_seq'"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 0, "kind": "log"}]}', "src_seq=0 is out of range"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": -3, "kind": "log"}]}', "out of range"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 18446744073709551616, "kind": "log"}]}',
     "out of range"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": "1", "kind": "log"}]}', "has type str"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": true, "kind": "log"}]}', "has type bool"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "log", "data": {"v": NaN}}]}',
     "not a number JSON allows"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "log", "data": {"v": 1e999}}]}',
     "out of range for a number"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "log", "data": [1]}]}',
     "data is not an object"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "log", "at": 1e15}]}',
     "is not a UNIX time"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "log", "data": {"d": '
     + deep(20) + '}}]}', "nests deeper than 16 levels"),
    ('{"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "log", "data": {"d": '
     + deep(200_000) + '}}]}', "nests too deeply"),
    (json.dumps({"type": "events", "run_id": "r", "events": [{"src_seq": 1, "kind": "k" * 500}]}),
     "over the limit of 128"),
    (json.dumps({"type": "events", "run_id": "r" * 500, "events": []}), "over the limit of 128"),
    (json.dumps({"type": "events", "run_id": "r", "events": [ev(i + 1) for i in range(2001)]}),
     "over the limit of 2000"),
    ('{"type": "heartbeat", "runs": "all"}', "field 'runs' has type str"),
    ('{"type": "heartbeat", "runs": [], "labels": {"k": 5}}', "must be a string"),
    (json.dumps(protocol.hello(__version__, NAME, ["cpu"], {}, "elsewhere", [])), "hello was already received"),
]


def _lines_head(run_id: str, src_seq: object = 1) -> bytes:
    return json.dumps({"type": "lines", "run_id": run_id, "src_seq": src_seq}).encode() + b"\n"


# Binary frames (a run's lines as an agent passes them through) that are not laid out as one: each gets an
# error that says what is wrong, and nothing of it is stored.
MALFORMED_FRAMES = [
    (lambda r: b"\x00\x01binary", "a binary frame must start with a lines header of at most 1024 bytes and a "
                                   "newline (binary frames carry nothing else)"),
    (lambda r: b"{nope\n{}", "lines header is not JSON: Expecting property name enclosed in double quotes: "
                             "line 1 column 2 (char 1)"),
    (lambda r: b'{"type": "events"}\n{}', "a binary frame's header must be an object of type 'lines'"),
    (lambda r: b'{"type": "lines", "src_seq": 1}\n{}', "lines: missing field 'run_id'"),
    (lambda r: _lines_head(r, 0) + b"{}", "lines.src_seq=0 is out of range (1..9007199254740992)"),
    (lambda r: _lines_head(r, "1") + b"{}", "lines: field 'src_seq' has type str"),
    (lambda r: _lines_head(r, 2 ** 53 - 1) + b"{}\n{}\n{}",
     "lines.src_seq=9007199254740991 numbers its lines past 9007199254740992"),
    (lambda r: _lines_head(r) + b"\n".join([b"{}"] * 2001), "lines frame of 2001 lines is over the 2000 line limit"),
    (lambda r: _lines_head("r" * 200) + b"{}", "lines.run_id is 200 characters long, over the limit of 128"),
]



async def test_malformed_messages_each_get_an_error_and_the_connection_stays_up(tmp_path):
    """Every malformed message is answered by an ``error`` naming what is wrong, on the same
    connection, which then still carries events and heartbeats."""
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        w = await RawWorker(plane).enroll()
        try:
            await w.connect()
            run_id = await assigned_run(plane, w)
            before = snapshot(tmp_path)
            assert w.ws is not None
            for raw, expected in MALFORMED:
                await w.ws.send_str(raw)
                answer = await w.receive()
                assert answer["type"] == "error" and expected in answer["message"], (raw[:80], answer)
            for frame, expected in MALFORMED_FRAMES:
                await w.ws.send_bytes(frame(run_id))
                answer = await w.receive()
                assert answer == {"type": "error", "message": f"malformed message: {expected}"}, answer
            assert await w.events(run_id, [ev(1), ev(2)]) == 2, "the connection still carries events"
            await w.ws.send_str(json.dumps({"type": "heartbeat", "runs": [run_id]}))
            assert await w.events(run_id, [ev(3, "status", status="succeeded")]) == 3
            assert (await plane.wait_status(run_id, "succeeded"))["status"] == "succeeded"
            assert changed(before, snapshot(tmp_path)) == []
            await serving(plane)
        finally:
            await w.close()


async def test_a_worker_s_lines_are_each_one_event_whatever_they_hold(tmp_path):
    """An agent passes a run's lines through as written (a binary ``lines`` frame). A hostile one may send any
    bytes as lines: each line is still exactly one event of the run (an event the protocol takes, or a
    warning quoting the line), numbered on from the header's src_seq, so nothing it sends holds back the
    run's later events, and a frame sent again (a replay) stores nothing twice."""
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        w = await RawWorker(plane).enroll()
        try:
            await w.connect()
            run_id = await assigned_run(plane, w)
            assert w.ws is not None
            lines = [b'{"kind": "progress", "data": {"tick": 1}, "at": 1800000001.0}',
                     b"\xff\xfe not JSON at all",
                     b'{"kind": "' + b"k" * 129 + b'", "data": {}, "at": 1800000001.0}',
                     b'{"kind": "metric", "data": {"value": NaN}, "at": 1800000001.0}',
                     b"[" * 100000 + b"]" * 100000,
                     b"",
                     b'{"kind": "progress", "data": {"tick": 7}, "at": 5}']
            await w.ws.send_bytes(_lines_head(run_id) + b"\n".join(lines))
            assert (await w.receive_type("ack"))["acked"] == 7
            # Sent again, and a frame overlapping it: only the new line is stored.
            await w.ws.send_bytes(_lines_head(run_id) + b"\n".join(lines))
            assert (await w.receive_type("ack"))["acked"] == 7
            await w.ws.send_bytes(_lines_head(run_id, 7) + lines[-1] + b'\n{"kind": "progress", "data": {"tick": 8}, '
                                                                      b'"at": 1800000002.0}')
            assert (await w.receive_type("ack"))["acked"] == 8
            evs = [e for e in await plane.events(run_id) if e["kind"] != "status"]
            assert [(e["kind"], e["data"].get("tick")) for e in evs] == [
                ("progress", 1), ("log", None), ("log", None), ("metric", None), ("log", None), ("log", None),
                ("progress", 7), ("progress", 8)]
            # A line's own time where it gave one the protocol takes; else the control plane's time it was read.
            assert [e["at"] for e in evs] == ["2027-01-15T08:00:01.000Z"] + ["2027-01-15T08:00:00.000Z"] * 2 + [
                "2027-01-15T08:00:01.000Z"] + ["2027-01-15T08:00:00.000Z"] * 3 + ["2027-01-15T08:00:02.000Z"]
            assert evs[1]["data"] == {"message": "\ufffd\ufffd not JSON at all\n", "level": "warning",
                                      "stream": "stdout"}
            assert evs[2]["data"]["message"].startswith("the run wrote a line that is not an event a control plane "
                                                        "takes (the event.kind is 129 characters long, over the "
                                                        "limit of 128): ")
            assert evs[3]["data"] == {"value": "nan"}  # as a run process writes a NaN
            assert evs[4]["data"]["message"] == ("[" * 100000)[:4000]
            assert evs[5]["data"]["message"] == "\n"
            assert await w.events(run_id, [ev(9, "status", status="succeeded")]) == 9
            assert (await plane.wait_status(run_id, "succeeded"))["status"] == "succeeded"
            await serving(plane)
        finally:
            await w.close()


async def test_an_oversized_message_closes_only_that_connection(tmp_path):
    """A message over the 8 MiB limit ends that worker's connection (its run disconnected);
    another worker's connection carries on, and the first one can come back."""
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        big, other = await RawWorker(plane, "big").enroll(), await RawWorker(plane, "other").enroll()
        try:
            await big.connect()
            await other.connect()
            run_id = await assigned_run(plane, big)
            await big.events(run_id, [ev(1, "status", status="running")])
            assert big.ws is not None
            with contextlib.suppress(ConnectionError):  # the server may close before it has read it all
                await big.ws.send_str('{"type": "events", "run_id": "x", "events": [], "pad": "'
                                      + "x" * (protocol.MAX_MESSAGE + 1) + '"}')
            # Whether the 1009 close frame arrives before the reset depends on how much was still
            # unsent; that the connection ends is the promise.
            msg = await big.ws.receive(timeout=30)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR), msg
            assert big.ws.closed
            assert (await plane.wait_status(run_id, "disconnected"))["status"] == "disconnected"
            other_run = await assigned_run(plane, other)
            assert await other.events(other_run, [ev(1, "status", status="succeeded")]) == 1
            await serving(plane)
            await big.close()
            big.session = aiohttp.ClientSession()
            big.ws = await big.open()
            await big.ws.send_str(json.dumps(protocol.hello(__version__, "big", ["cpu"], {}, "elsewhere",
                                                            [{"run_id": run_id, "running": True, "last_seq": 1}])))
            welcome = await big.receive()
            assert welcome["runs"] == {run_id: {"acked": 1, "action": "continue"}}, welcome
            assert (await plane.wait_status(run_id, "running"))["status"] == "running"
        finally:
            await big.close()
            await other.close()


async def test_out_of_order_gapped_and_replayed_events_keep_the_log_gapless(tmp_path):
    """Events out of order, past a gap, replayed, or for a run that is not this worker's: the
    acknowledgement is always the highest contiguous src_seq stored, and the log is 1..n once each."""
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        w, thief = await RawWorker(plane).enroll(), await RawWorker(plane, "thief").enroll()
        try:
            await w.connect()
            await thief.connect()
            run_id = await assigned_run(plane, w)
            assert await w.events(run_id, [ev(2), ev(3)]) == 0, "a batch that starts past the next is refused"
            assert await w.events(run_id, [ev(3), ev(1), ev(2)]) == 3, "a batch is stored in src_seq order"
            assert await w.events(run_id, [ev(1), ev(2), ev(3)]) == 3, "a replay is a no-op"
            assert await w.events(run_id, [ev(6)]) == 3, "a gap is not acknowledged past"
            assert await w.events(run_id, [ev(4), ev(6)]) == 4, "stored up to the gap"
            assert await w.events(run_id, [ev(5), ev(6)]) == 6
            assert await w.events(run_id, [ev(7), ev(7)]) == 7, "twice in one batch is stored once"
            # Another worker's events for this run, and for a run that does not exist, are not stored.
            assert await thief.events(run_id, [ev(8), ev(9)]) == 9
            assert await thief.events("no-such-run", [ev(1)]) == 1
            assert await w.events(run_id, [ev(8, "status", status="succeeded")]) == 8
            await plane.wait_status(run_id, "succeeded")
            # After the end, more events (even a replayed "failed") change nothing.
            assert await w.events(run_id, [ev(9), ev(10, "status", status="failed")]) == 10
            evs = await plane.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
            assert [e["data"]["tick"] for e in evs if e["kind"] == "progress"] == [1, 2, 3, 4, 5, 6, 7]
            run = await plane.run(run_id)
            assert run["status"] == "succeeded" and run["late_result"] is None, run
            await serving(plane)
        finally:
            await w.close()
            await thief.close()


async def test_a_first_message_that_is_not_a_hello_is_refused_and_listed(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        w = await RawWorker(plane).enroll()
        cases = [
            # The version is read before anything else: without one, nothing else is looked at.
            (json.dumps({"type": "events", "run_id": "r", "events": []}), "version_mismatch",
             "version mismatch: worker unknown"),
            (json.dumps({"version": __version__, "type": "events", "run_id": "r", "events": []}), "bad_hello",
             "the first message must be a hello"),
            (json.dumps({"version": __version__, "type": "hello", "name": NAME}), "bad_hello",
             "missing field 'devices'"),
            (json.dumps(protocol.hello(__version__, "someone-else", ["cpu"], {}, "m", [])), "credential_mismatch",
             "belongs to worker w1"),
            ("{" * 100_000, "version_mismatch", "worker unknown"),
        ]
        try:
            for raw, code, text in cases:
                ws = await w.open()
                await ws.send_str(raw)
                answer = await w.receive()
                assert answer["type"] == "refused" and answer["code"] == code and text in answer["message"], answer
                msg = await ws.receive(timeout=30)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
            rejected = (await plane.call("GET", "/api/workers"))["rejected"]
            assert sorted(r["name"] for r in rejected) == ["someone-else", NAME], rejected
            assert (await w.connect())["type"] == "welcome", "the worker itself still gets in"
            await serving(plane)
        finally:
            await w.close()


# -- tokens and credentials ------------------------------------------------------------------
async def test_expired_used_revoked_and_superseded_tokens_and_credentials_are_refused_by_name(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        async def enroll(token: str, name: str) -> tuple[int, Any]:
            return await plane.api("POST", "/api/workers/enroll", {"token": token, "name": name, "devices": ["cpu"],
                                                                    "version": __version__, "machine_id": "m"})

        async def token(**body: Any) -> dict[str, Any]:
            return dict(await plane.call("POST", "/api/workers/tokens", {"ttl_s": 60, "uses": 1, **body}, expect=201))

        short, used, revoked = await token(), await token(), await token()
        await plane.clock.advance(61)
        status, body = await enroll(short["token"], "late")
        assert (status, body["error"]["code"]) == (401, "token_expired"), body
        assert f"{short['id']}.… expired" in body["error"]["message"] and "--ttl" in body["error"]["hint"]

        used = await token()
        status, first = await enroll(used["token"], "first")
        assert status == 201, first
        status, body = await enroll(used["token"], "second")
        assert (status, body["error"]["code"]) == (401, "token_used_up"), body
        assert "1 of 1 uses" in body["error"]["message"]

        await plane.call("DELETE", f"/api/workers/tokens/{revoked['id']}")
        status, body = await enroll(revoked["token"], "third")
        assert (status, body["error"]["code"]) == (401, "token_revoked"), body

        for bad, code in (("zzzzzz.0123456789abcdef", "token_unknown"), (used["id"] + ".0000000000000000",
                                                                       "token_unknown"),
                          ("../../etc/passwd", "bad_token"), ("", "bad_token")):
            status, body = await enroll(bad, "fourth")
            assert (status, body["error"]["code"]) == (401, code), (bad, body)

        # A reissue supersedes the credential; the old one is then refused as revoked, the token once used.
        reissue = await plane.call("POST", "/api/workers/first/reissue", {"ttl_s": 60}, expect=201)
        status, second = await enroll(reissue["token"], "first")
        assert status == 201, second
        status, body = await enroll(reissue["token"], "first")
        assert (status, body["error"]["code"]) == (401, "token_used_up"), body
        w = RawWorker(plane, "first")
        try:
            ws = await w.open(first["credential"])
            await ws.send_str(json.dumps(protocol.hello(__version__, "first", ["cpu"], {}, "m", [])))
            answer = await w.receive()
            assert answer["code"] == "revoked" and "superseded by a reissue" in answer["message"], answer
            # Removed: the current credential is refused as revoked too.
            await plane.call("DELETE", "/api/workers/first")
            ws = await w.open(second["credential"])
            await ws.send_str(json.dumps(protocol.hello(__version__, "first", ["cpu"], {}, "m", [])))
            answer = await w.receive()
            assert answer["code"] == "revoked" and "was removed" in answer["message"], answer
            ws = await w.open("cdw_made-up")
            await ws.send_str(json.dumps(protocol.hello(__version__, "first", ["cpu"], {}, "m", [])))
            assert (await w.receive())["code"] == "unknown_credential"
        finally:
            await w.close()
        names = [x["name"] for x in (await plane.call("GET", "/api/workers"))["workers"]]
        assert names == [], "no refused attempt enrolled anyone"
        await serving(plane)


async def test_a_worker_credential_opens_only_the_worker_routes(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        w = await RawWorker(plane).enroll()
        try:
            auth = {"Authorization": f"Bearer {w.credential}"}
            async with aiohttp.ClientSession() as s:
                for method, path in (("GET", "/api/runs"), ("POST", "/api/workers/tokens"), ("GET", "/api/workers"),
                                     ("DELETE", "/api/workers/w1"), ("GET", "/api/files")):
                    async with s.request(method, plane.url + path, headers=auth) as r:
                        err = await error_of(r)
                        assert (r.status, err["code"]) == (403, "forbidden"), (method, path, err)
                async with s.get(plane.url + "/api/files/download/anything.csv", headers=auth) as r:
                    err = await error_of(r)
                    assert (r.status, err["code"]) == (403, "forbidden") and "not an input" in err["message"], err
            assert [x["name"] for x in (await plane.call("GET", "/api/workers"))["workers"]] == ["w1"]
        finally:
            await w.close()


# -- HTTP Host ----------------------------------------------------------------------------------
async def raw_http(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as written (a client library would refuse some of these) and read the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_wrong_host_headers_are_answered_421_on_every_route(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        assert plane.server is not None
        port = plane.server.port
        assert port is not None
        bad = ["evil.example", f"evil.example:{port}", "localhost.evil.example", f"127.0.0.1.nip.io:{port}",
               f"192.0.2.1:{port}", "127.0.0.1:1@evil.example", "localhost:80/evil", "localhost:+1", "[::1",
               "[::1]evil", "x" * 4000,
               "%31%32%37.0.0.1", "127.0.0.1\tevil"]
        assert plane.app is not None
        token = plane.app[SESSION_TOKEN]
        for host in bad:
            for path in ("/api/health", "/api/runs", "/api/workers/enroll", "/ws/worker", "/"):
                req = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nX-CodefyUI-Token: {token}\r\n"
                       f"Connection: close\r\n\r\n").encode()
                status, body = await raw_http(port, req)
                assert status == 421, (host[:40], path, status, body[:200])
                err = json.loads(body)["error"]
                assert err["code"] == "host_not_allowed" and "CODEFYUI_EXTRA_ALLOWED_HOSTS" in err["hint"], err
        # No Host at all (an HTTP/1.0 client) counts as the address it connected to, this server's
        # own: a browser, the only client a rebinding page can use, always sends one.
        status, _ = await raw_http(port, b"GET /api/health HTTP/1.0\r\n\r\n")
        assert status == 200
        for host in ("localhost", f"127.0.0.1:{port}", f"localhost:{port}"):
            status, body = await raw_http(port, f"GET /api/health HTTP/1.1\r\nHost: {host}\r\n"
                                                f"Connection: close\r\n\r\n".encode())
            assert status == 200, (host, body)
        await serving(plane)

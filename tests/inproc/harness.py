"""The in-process tier: a real control plane app in the test's own event loop.

``Plane`` serves ``build_app(config, clock)`` with aiohttp's ``TestServer`` on
a loopback port, over a real sqlite file in the test's tmp folder; its HTTP
client carries the owner's session token. ``FakeAgent`` is a worker that
speaks the real ``/ws/worker`` protocol over a real socket and does only what
the test tells it: runs "execute" as the events the test sends. Nothing here
starts a process, so a test costs milliseconds, and the clock is a
``FakeClock`` that moves only when the test steps it.

A control-plane crash (kill -9) is a snapshot of the database taken with
sqlite's backup API while the plane runs: exactly what a killed process
leaves (committed transactions only). A second plane started on that file is
the restarted control plane.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from cdui import __version__
from cdui.core.clock import FakeClock
from cdui.core.config import load
from cdui.plane import appkeys as _keys
from cdui.plane import server
from cdui.plane.runs import RUNS
from cdui.plane.workers import WORKERS
from cdui.run.catalog import node_catalog
from cdui.wire import protocol
from procs import ServerProc

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}

# Whether the worker manager's timers (resume grace, heartbeat watchdog) sleep on
# the injected clock. build_app takes the clock now, but until those timers use
# it the timer tests run with sub-second real settings and :meth:`Plane.elapse`
# also waits in real time. Set it to True when they do (issue #8, k1).
TIMERS_ON_CLOCK = True


def build(config: Any, clock: FakeClock) -> web.Application:
    return server.build_app(config, clock)


def n(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    """A graph node as CodefyUI writes it (the short form graph-building tests share)."""
    return {"id": nid, "type": ntype, "data": {"params": params}}


def e(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
    """A data edge from ``src``'s output ``sh`` to ``dst``'s input ``th``."""
    return {"source": src, "sourceHandle": sh, "target": dst, "targetHandle": th}


def t(dst: str) -> dict[str, Any]:
    """The trigger edge from the Start node named ``start`` to ``dst``."""
    return {"source": "start", "sourceHandle": "trigger", "target": dst, "type": "trigger"}


def graph() -> dict[str, Any]:
    """The smallest graph the control plane accepts; a fake agent never runs it."""
    return {"format_version": 1, "name": "inproc", "edges": [
        {"id": "t", "source": "start", "sourceHandle": "trigger", "target": "n", "targetHandle": None,
         "type": "trigger"}], "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "n", "type": "TensorCreate", "position": {"x": 0, "y": 0}, "data": {"params": {}}}]}


async def eventually(pred: Callable[[], Any], what: str, timeout: float = 30.0,
                     detail: Callable[[], Any] | None = None) -> Any:
    """``pred()``'s first truthy value (``pred`` may be a coroutine function), polled in real time.

    For what the test cannot await directly: another task's or a socket's reaction
    (a status the server sets when a connection closes, a file a run subprocess
    writes). Never a wait for time to pass: that is a clock step. Fails naming
    ``what`` (and ``detail()``) after ``timeout`` real seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            extra = ""
            if detail is not None:
                state = detail()
                extra = f"; last state: {await state if inspect.isawaitable(state) else state}"
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
        await asyncio.sleep(0.01)


class Link(aiohttp.TCPConnector):
    """A connector whose connections a test cuts as a network failure does.

    Given to the real agent (``Agent(connector=lambda: link)``), it carries its
    ``/ws/worker`` connection and file transfers. :meth:`cut` aborts every open
    connection (no WebSocket close handshake: the control plane sees the TCP
    connection end) and keeps the link down, so that reconnects fail, until
    :meth:`restore`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self._open: set[asyncio.BaseTransport] = set()

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        if self.down:
            raise aiohttp.ClientConnectionError("the link is down (the test cut it)")
        proto = await super()._create_connection(req, traces, timeout)
        if proto.transport is not None:
            self._open.add(proto.transport)
        return proto

    def cut(self) -> None:
        self.down = True
        for transport in self._open:
            transport.abort()
        self._open.clear()

    def restore(self) -> None:
        self.down = False


class Plane:
    """One control plane app served on 127.0.0.1, with an owner's HTTP client."""

    def __init__(self, user_data: Path, data_dir: Path, clock: FakeClock | None = None,
                 **settings: str) -> None:
        env = {"CODEFYUI_USER_DATA_DIR": str(user_data), "CODEFYUI_DATA_DIR": str(data_dir), **settings}
        self.config = load(env)
        self.clock = clock or FakeClock()
        self.app: web.Application | None = None
        self.server: TestServer | None = None
        self.session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> Plane:
        self.app = build(self.config, self.clock)
        self.server = TestServer(self.app, host="127.0.0.1")
        await self.server.start_server()
        token = self.app[_keys.SESSION_TOKEN]
        self.session = aiohttp.ClientSession(headers={"X-CodefyUI-Token": token})
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.session is not None:
            await self.session.close()
        if self.server is not None:
            await self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    @property
    def runs(self) -> Any:
        assert self.app is not None
        return self.app[RUNS]

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.session is not None
        async with self.session.request(method, self.url + path, json=body) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if text else None
            except ValueError:
                return r.status, text

    async def call(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        status, parsed = await self.api(method, path, body)
        assert status == expect, f"{method} {path} answered {status}, expected {expect}: {parsed}"
        return parsed

    async def submit(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.call("POST", "/api/runs", {"graph": graph(), "options": options or {}}, expect=201)

    async def run(self, run_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/api/runs/{run_id}")

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = await self.call("GET", f"/api/runs/{run_id}/events?after={out[-1]['seq'] if out else 0}")
            out += page
            if len(page) < 1000:
                return out

    async def worker(self, name: str) -> dict[str, Any] | None:
        for w in (await self.call("GET", "/api/workers"))["workers"]:
            if w["name"] == name:
                return w
        return None

    async def wait_status(self, run_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        """The run once its status is one of ``statuses``.

        What changes the status here is the server reacting to a socket event
        (a close, a message), which the test cannot await directly; this waits
        for that reaction, never for time to pass in the control plane."""
        async def reached() -> dict[str, Any] | None:
            r = await self.run(run_id)
            return r if r["status"] in statuses else None
        return dict(await eventually(reached, f"run {run_id} to be one of {statuses}", timeout,
                                     lambda: self.run(run_id)))

    async def elapse(self, seconds: float, sleepers: int = 1) -> None:
        """Let ``seconds`` of control-plane time pass: once ``sleepers`` timers wait on
        the fake clock, step it (see TIMERS_ON_CLOCK for the real wait meanwhile).
        The run service's dispatch loop is one more sleeper (its pass every 5 s), not
        counted in ``sleepers``."""
        if TIMERS_ON_CLOCK:
            await self.clock.wait_for_sleepers(sleepers + 1)
            await self.clock.advance(seconds)
        else:
            await self.clock.advance(seconds)
            await asyncio.sleep(seconds)

    async def graceful_stop(self) -> None:
        """What SIGTERM does before aiohttp drops the connections: stop the runs
        while every worker socket is still read (see server._run_until_signal)."""
        await self.runs.close()

    def crash_copy(self, user_data: Path) -> None:
        """The database as kill -9 would leave it, as ``user_data``'s database."""
        user_data.mkdir(mode=0o700, parents=True, exist_ok=True)
        src = sqlite3.connect(f"file:{self.config.db_path}?mode=ro", uri=True)
        dst = sqlite3.connect(user_data / self.config.db_path.name)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()


class FakeAgent:
    """A worker that speaks the real protocol and does only what the test says.

    It keeps every event it "sent" for a run (its spool), numbers them by
    ``src_seq`` as the real agent does, and replays from the control plane's
    acknowledgement on reconnect. It sends heartbeats only when told, so a
    connection is silent unless the test speaks; it answers ``stop`` by ending
    the run ``cancelled`` when ``answer_stop`` is set.

    The one fake agent of the tests: against an in-process :class:`Plane`, or a
    control plane process (``procs.ServerProc``, whose blocking HTTP helpers it
    calls off the event loop; such a control plane's catalog is not known here,
    so "same" reports none, and its events carry the wall time)."""

    def __init__(self, plane: Plane | ServerProc, name: str = "w1", devices: tuple[str, ...] = ("cpu",),
                 catalog: dict[str, Any] | None | str = "same", fingerprint: dict[str, Any] | None = None) -> None:
        self.plane = plane
        self.name = name
        self.devices = list(devices)
        # The node catalog its hello reports: "same" (the control plane's own, a worker in sync),
        # a {types, hash} of its own, or None (its catalog helper failed).
        self.catalog = catalog
        self.fingerprint = fingerprint
        self.credential = ""
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.welcome: dict[str, Any] = {}
        self.spool: dict[str, list[dict[str, Any]]] = {}
        self.acked: dict[str, int] = {}
        self.assigned: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stops: list[str] = []
        self.inbox: list[dict[str, Any]] = []
        self.answer_stop = False
        self.capabilities: list[str] = []  # what its hello offers (["s3"]: it has boto3)
        self.device_memory: dict[str, dict[str, int]] | None = None  # its devices' memory, as its hello says
        self.labels: dict[str, str] = {}  # its hello's labels (mounts, read-roots)
        self.headers: dict[str, str] = {}  # more headers on its /ws/worker request (a proxy's X-Forwarded-*)
        self.machine_id = "fake-machine"  # the id its hello names
        # How it answers a same-machine probe (cdui/wire/same_machine.py): the answer for the probe, or None
        # to leave it unanswered. The probes it got are kept.
        self.on_probe: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
        self.probes: list[dict[str, Any]] = []
        self._acks = asyncio.Condition()
        self._session = aiohttp.ClientSession()
        self._reader: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seq = itertools.count(1)
        self._closed = False

    async def enroll(self) -> FakeAgent:
        tok = (await self._call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, 201))["token"]
        res = await self._call("POST", "/api/workers/enroll", {
            "token": tok, "name": self.name, "devices": self.devices, "version": __version__,
            "machine_id": self.machine_id}, 201)
        self.credential = res["credential"]
        return self

    async def _call(self, method: str, path: str, body: Any, expect: int) -> Any:
        if isinstance(self.plane, Plane):
            return await self.plane.call(method, path, body, expect=expect)
        return await asyncio.to_thread(self.plane.call, method, path, body, expect=expect)

    def _now(self) -> float:
        return self.plane.clock.time() if isinstance(self.plane, Plane) else time.time()

    def use_plane(self, plane: Plane) -> None:
        """Talk to another control plane (the restarted one) with the same credential."""
        self.plane = plane

    async def connect(self, held: list[str] | None = None) -> dict[str, Any]:
        """Connect, say hello holding ``held`` runs (with what was spooled of them), return the welcome."""
        runs = [{"run_id": r, "running": True, "last_seq": len(self.spool.get(r, []))} for r in held or []]
        # autoclose off: when the control plane closes the socket (a missed-heartbeat verdict),
        # the agent drops the link instead of completing the close handshake, as a dead link does.
        self.ws = await self._session.ws_connect(self.plane.url.replace("http", "ws", 1) + "/ws/worker",
                                                 headers={"Authorization": f"Bearer {self.credential}",
                                                          **self.headers},
                                                 autoclose=False)
        hello = protocol.hello(__version__, self.name, self.devices, dict(self.labels), self.machine_id, runs)
        hello["capabilities"] = list(self.capabilities)
        if not (self.catalog == "same" and not isinstance(self.plane, Plane)):
            hello["catalog"] = (node_catalog(self.plane.runs.registry)  # type: ignore[union-attr]
                                if self.catalog == "same" else self.catalog)
            hello["catalog_error"] = None if hello["catalog"] is not None else "the helper failed (a test says so)"
        hello["fingerprint"] = self.fingerprint
        hello["device_memory"] = self.device_memory
        await self.ws.send_str(json.dumps(hello))
        msg = await self.ws.receive(timeout=60)
        if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data).get("type") == "probe":
            self.probes.append(json.loads(msg.data))
            answer = self.on_probe(self.probes[-1]) if self.on_probe is not None else None
            if answer is not None:
                await self.ws.send_str(json.dumps({"type": "probe_answer", **answer}))
            msg = await self.ws.receive(timeout=60)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        self.welcome = json.loads(msg.data)
        assert self.welcome["type"] == "welcome", self.welcome
        for run_id, a in self.welcome["runs"].items():
            self.acked[run_id] = a["acked"]
        self._reader = asyncio.create_task(self._read(self.ws))
        return self.welcome

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.CLOSE:
                await self._cut()
                break
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            d = json.loads(msg.data)
            t = d.get("type")
            if t == "assign":
                self.spool.setdefault(d["run_id"], [])
                await self.assigned.put(d)
            elif t == "ack":
                async with self._acks:
                    self.acked[d["run_id"]] = max(self.acked.get(d["run_id"], 0), d["acked"])
                    self._acks.notify_all()
            elif t == "stop":
                self.stops.append(d["run_id"])
                if self.answer_stop:
                    self._spawn(self.status(d["run_id"], "cancelled"))
            else:
                self.inbox.append(d)
        async with self._acks:
            self._acks.notify_all()  # wake waiters: no ack comes on a closed socket

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def assignment(self, timeout: float = 30.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.assigned.get(), timeout)

    def spool_event(self, run_id: str, kind: str, **data: Any) -> dict[str, Any]:
        """Record an event as the agent's spool does, without sending it (the link is down)."""
        evs = self.spool.setdefault(run_id, [])
        ev = {"src_seq": len(evs) + 1, "kind": kind, "data": data, "at": self._now()}
        evs.append(ev)
        return ev

    async def send(self, run_id: str, kind: str, wait_ack: bool = True, **data: Any) -> int:
        """Spool one event, send everything not yet acknowledged, and (by default) wait for its ack."""
        ev = self.spool_event(run_id, kind, **data)
        await self.flush(run_id, wait_ack)
        return ev["src_seq"]

    async def flush(self, run_id: str, wait_ack: bool = True) -> None:
        """Send the spooled events after the last acknowledgement (the replay after a reconnect)."""
        assert self.ws is not None and not self.ws.closed, "not connected"
        pending = self.spool.get(run_id, [])[self.acked.get(run_id, 0):]
        if not pending:
            return
        for text in protocol.encode_events(run_id, pending):
            await self.ws.send_str(text)
        if wait_ack:
            await self.wait_acked(run_id, pending[-1]["src_seq"])

    async def wait_acked(self, run_id: str, seq: int, timeout: float = 30.0) -> None:
        async def until() -> None:
            async with self._acks:
                await self._acks.wait_for(lambda: self.acked.get(run_id, 0) >= seq
                                          or self.ws is None or self.ws.closed)
        await asyncio.wait_for(until(), timeout)
        assert self.acked.get(run_id, 0) >= seq, f"the control plane acknowledged {self.acked.get(run_id)} < {seq}"

    async def artifact(self, run_id: str, **data: Any) -> None:
        """Send an artifact event as the agent does (``kind`` in ``data`` is the artifact's, not the event's)."""
        evs = self.spool.setdefault(run_id, [])
        evs.append({"src_seq": len(evs) + 1, "kind": "artifact", "data": data, "at": self._now()})
        await self.flush(run_id)

    async def send_batch(self, run_id: str, events: list[tuple[str, dict[str, Any]]]) -> int:
        """Spool ``(kind, data)`` events and send them in one message; wait for the ack of the last."""
        evs = self.spool.setdefault(run_id, [])
        for kind, data in events:
            evs.append({"src_seq": len(evs) + 1, "kind": kind, "data": data, "at": self._now()})
        await self.flush(run_id)
        return len(evs)

    async def message(self, kind: str, count: int = 1, timeout: float = 60.0) -> dict[str, Any]:
        """The ``count``-th message of type ``kind`` (errors, outputs requests...) in the inbox, once it came."""
        def got() -> list[dict[str, Any]]:
            return [m for m in self.inbox if m.get("type") == kind]
        await eventually(lambda: len(got()) >= count, f"{count} {kind!r} message(s)", timeout, lambda: self.inbox)
        return got()[count - 1]

    async def status(self, run_id: str, status: str, **data: Any) -> int:
        return await self.send(run_id, "status", status=status, **data)

    async def log(self, run_id: str, message: str) -> int:
        return await self.send(run_id, "log", message=message, stream="stdout")

    async def heartbeat(self, runs: list[str], timeout: float = 30.0) -> None:
        """Send a heartbeat and wait until the control plane has read it (its
        connection's liveness stamp is the clock's now), so a clock step that
        follows cannot overtake it."""
        assert self.ws is not None
        await self.ws.send_str(json.dumps({"type": "heartbeat", "runs": runs}))
        assert isinstance(self.plane, Plane) and self.plane.app is not None
        manager = self.plane.app[WORKERS]
        plane = self.plane

        def read() -> bool:
            conn = manager.conns.get(self.name)
            return conn is not None and conn.alive_at == plane.clock.monotonic()
        await eventually(read, f"the control plane to read {self.name}'s heartbeat", timeout)

    async def drop(self) -> None:
        """Cut the connection as a network failure does: the TCP connection ends
        without a WebSocket close handshake (the session's connections are dropped)."""
        await self._cut()
        if self._reader is not None and self._reader is not asyncio.current_task():
            await self._reader

    async def _cut(self) -> None:
        session, self._session = self._session, aiohttp.ClientSession()
        await session.close()

    async def close(self) -> None:
        """Disconnect for good."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self.drop()
        for t in list(self._tasks):
            t.cancel()
        await self._session.close()

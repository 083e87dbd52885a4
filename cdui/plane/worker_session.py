"""One ``/ws/worker`` connection, from its first message to its end.

A :class:`WorkerSession` lives exactly as long as one WebSocket of one agent:

1. :meth:`~WorkerSession.handshake`: read the credential and the first
   message, ask the pure :func:`cdui.plane.sched.worker_admission.decide` whether it gets
   in, and either send ``refused`` or register the connection (:class:`Conn`)
   with the manager;
2. :meth:`~WorkerSession.welcome`: answer the runs the agent says it holds,
   and settle the runs it should hold but does not;
3. :meth:`~WorkerSession.serve`: every message until the socket closes (the
   manager closes it after three missed heartbeats);
4. :meth:`~WorkerSession.gone`: what the departed worker's runs become.

What outlives a connection (the registry of open connections, the grace
timers, adoption at start, the list of refused connections, shutdown) is the
:class:`~cdui.plane.workers.WorkerManager`'s; a session reads and changes it only
through the manager's methods. The session sees the manager through :class:`Manager`, the
port this module defines (the manager creates the sessions, so this module does not import it).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from cdui import __version__
from cdui.core.clock import Clock
from cdui.core.config import Config
from cdui.core.diskfull import DiskFull
from cdui.core.layout import read_roots_in
from cdui.plane import enroll, oneshot
from cdui.plane.http import proxies
from cdui.plane.runs import RunService, iso
from cdui.plane.sched import catalog_check
from cdui.plane.sched import worker_admission as admission
from cdui.plane.store import TERMINAL, Run, Store, WorkerRow
from cdui.plane.turns import Turns
from cdui.run import catalog
from cdui.wire import protocol, same_machine
from cdui.wire.event import Event
from cdui.wire.job import Job
from cdui.wire.same_machine import Verdict

log = logging.getLogger("cdui.plane.workers")  # the same logger as before the split, so log filters keep working
# Checked events messages of one worker that may wait while the one before them is stored (see serve).
EVENTS_AHEAD = 4
HELLO_TIMEOUT_S = 30.0
# How a heartbeat's text begins as agents write it (protocol.Heartbeat.to_json): only such a text is kept
# to be recognised when it comes again (see WorkerSession._heard_again).
BEAT_PREFIX = '{"type": "heartbeat"'
# aiohttp hands over every message that one read of a socket brought, and a message that is handed over
# is handled without the event loop serving anything else: a burst of one agent's messages (a reconnect's
# replay, a flood) kept every request waiting until its last. A session that has handled BURST_S of
# messages back to back lets the loop serve the sockets that became ready first. A receive that took
# longer than WAITED_S waited for its message (the loop ran meanwhile): a new burst starts there.
BURST_S = 0.002
WAITED_S = 0.0001
CLOSED_TYPES = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)


async def behind_ready_sockets() -> None:
    """Go on once the event loop has served the sockets that are ready now: a callback due at once (a
    timer) runs after those the loop's next look at its sockets finds, where ``asyncio.sleep(0)`` would
    run before them."""
    loop = asyncio.get_running_loop()
    turn: asyncio.Future[None] = loop.create_future()

    def go_on() -> None:
        if not turn.done():  # cancelled meanwhile: the connection ended
            turn.set_result(None)
    loop.call_at(loop.time(), go_on)
    await turn


class InOrder:
    """One connection's events messages, handled one after another, in the order read, by a task that
    exists only while some wait (slots: one per connected agent). A connected agent that runs nothing
    holds no task, no queue and no frame for them: a waiting task and an ``asyncio.Queue`` were about
    4 KiB per connection, a fifth of what a connection costs the control plane.

    :meth:`put` waits while EVENTS_AHEAD messages wait their turn (the one being handled not counted),
    as ``asyncio.Queue(EVENTS_AHEAD).put`` did, so reading the socket waits in turn."""

    __slots__ = ("handle", "waiting", "task", "room")

    def __init__(self, handle: Callable[[protocol.Events], Awaitable[None]]) -> None:
        self.handle = handle
        self.waiting: list[protocol.Events] = []
        self.task: asyncio.Task[None] | None = None
        self.room: asyncio.Future[None] | None = None  # what put() waits on while EVENTS_AHEAD wait

    async def put(self, m: protocol.Events) -> None:
        while len(self.waiting) >= EVENTS_AHEAD:
            if self.room is None or self.room.done():
                self.room = asyncio.get_running_loop().create_future()
            await self.room
        self.waiting.append(m)
        if self.task is None:
            self.task = asyncio.create_task(self._in_order())

    async def _in_order(self) -> None:
        try:
            while self.waiting:
                m = self.waiting.pop(0)
                if self.room is not None:
                    if not self.room.done():
                        self.room.set_result(None)
                    self.room = None
                await self.handle(m)
        finally:
            # Nothing waits (no await since the check): the next put() starts a task of its own.
            self.task = None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def drained(self) -> None:
        """Once every message put has been handled."""
        while (task := self.task) is not None:
            await task


class PendingOutputs:
    """The outputs and raw tensor requests on one connection that wait for their answers
    (:mod:`cdui.plane.http.api_outputs` adds them; the session answers them). An answer whose
    request id nobody waits for is dropped."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[Any]] = {}

    def answered(self, msg: protocol.OutputsAnswer | protocol.RawAnswer | protocol.LogAnswer
                 | protocol.PluginPushAnswer | protocol.AppAnswer) -> None:
        fut = self.waiting.pop(msg.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def gone(self) -> None:
        """The connection closed: nothing waits for its answers any longer."""
        for fut in self.waiting.values():
            if not fut.done():
                fut.cancel()
        self.waiting.clear()


@dataclass(slots=True)
class Conn:
    """The state of one admitted connection, as the rest of the control plane sees it
    (slots: thousands of them are held at once)."""

    name: str
    ws: web.WebSocketResponse
    hello: protocol.Hello
    address: str
    unencrypted: bool
    # Wall time, shown and stored (the server's clock sets both).
    connected_at: float = 0.0
    last_seen: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    # When it last spoke, on the monotonic clock: liveness must not jump with the wall clock.
    alive_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The agent read a nonce in this control plane's data folder and can write its folders
    # (cdui/wire/same_machine.py): its runs keep this machine's paths.
    same_machine: bool = False
    # A pinned agent's {pin it matched, next pin it holds}, from its hello and heartbeats (key rotation).
    tls: dict[str, str | None] | None = None
    # Each CUDA card's use as its agent last reported it (heartbeat.gpu), and when (wall time); none on a
    # machine without CUDA cards.
    gpu: list[dict[str, Any]] | None = None
    gpu_at: float | None = None
    outputs: PendingOutputs = field(default_factory=PendingOutputs)
    # The published apps' serving processes its agent last reported (heartbeat.serving); None: it never served one.
    serving: list[dict[str, Any]] | None = None

    async def send(self, msg: protocol.ServerMessage) -> bool:
        if self.ws.closed:
            return False
        try:
            async with self.lock:
                await self.ws.send_str(msg.to_json())
            return True
        except (ConnectionError, RuntimeError):
            return False


class Manager(Protocol):
    """What a session uses of the worker manager (:class:`cdui.plane.workers.WorkerManager`)."""

    @property
    def config(self) -> Config: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def store(self) -> Store: ...
    @property
    def runs(self) -> RunService: ...
    @property
    def conns(self) -> dict[str, Conn]: ...
    @property
    def same_machine(self) -> dict[str, Verdict]: ...
    @property
    def unstored(self) -> set[str]: ...
    @property
    def drain_flags(self) -> dict[str, bool]: ...
    @property
    def grace(self) -> float: ...
    @property
    def heartbeat(self) -> float: ...
    @property
    def closing(self) -> bool: ...
    @property
    def handover(self) -> bool: ...
    @property
    def machine_id(self) -> str: ...
    @property
    def turns(self) -> Turns: ...

    def register(self, conn: Conn) -> None: ...

    def unregister(self, conn: Conn) -> None: ...

    def seen(self, conn: Conn) -> None: ...

    def reject(self, name: str, reason: str, address: str, cred_hash: str | None = None) -> None: ...

    def start_timer(self, run_id: str, adopted: bool) -> None: ...

    def cancel_timer(self, run_id: str) -> None: ...

    def compare_catalog(self, hello: Any, same_machine: bool) -> catalog_check.CatalogState: ...

    def shared_catalog(self, reported: dict[str, Any]) -> dict[str, Any]: ...


class RemoteExecutor:
    """A connected worker, as the run queue sees it (slots: thousands of them are held at once)."""

    __slots__ = ("manager", "conn", "name", "drained", "disabled", "credential", "one_shot", "taken", "reserved",
                 "catalog")

    def __init__(self, manager: Manager, conn: Conn) -> None:
        self.manager = manager
        self.conn = conn
        self.name = conn.name
        self.drained = False
        self.disabled = False
        # One-shot agents (see cdui.plane.oneshot): the credential an instance shares, its one run.
        self.credential = conn.name
        self.one_shot = False
        self.taken: str | None = None
        self.reserved: str | None = None
        # Reported once, at the agent's start: it holds for this connection only.
        self.catalog = manager.compare_catalog(conn.hello, conn.same_machine)

    def devices(self) -> list[str]:
        return list(self.conn.hello.devices)

    def device_memory(self) -> dict[str, dict[str, int]]:
        return dict(self.conn.hello.device_memory or {})

    def mounted(self) -> bool:
        return self.manager.config["CODEFYUI_MOUNT_LABEL"] in self.conn.labels

    def read_roots(self) -> list[str]:
        """The folders its machine lets runs read by absolute path, as its agent reported them."""
        return read_roots_in(self.conn.labels)

    def capabilities(self) -> list[str]:
        """What the agent declared it offers (``s3`` where it has boto3)."""
        return list(self.conn.hello.capabilities)

    def unavailable_reason(self) -> str | None:
        if self.disabled:
            return f"worker {self.name} is disabled"
        if self.drained:
            return f"worker {self.name} is draining (no new runs)"
        return oneshot.busy_reason(self)

    async def start(self, run: Run, job: Job) -> None:
        await self.manager.runs.oneshot.took(self.manager, self, run.id)
        if not self.conn.same_machine:
            job = job.without_local_paths()  # another machine resolves paths in its own installation
        # Checked again right before it goes: the worker may have come back with fewer types.
        missing = catalog_check.missing_types(self.catalog, job.graph, {}, self.manager.runs.registry.preset_params)
        if missing:
            raise catalog_check.refuse_missing(self.name, missing)
        # The stored facts, not the ones read when the run was claimed: the storage backend may have
        # added its own (the bucket of an s3 run) since. Changed inside one writer job (no read first).
        fingerprint = self.conn.hello.fingerprint
        await self.manager.store.change_execution_facts(run.id, lambda facts: catalog.start_facts(facts, fingerprint))
        await self._send(run.id, job)

    def claim_facts(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """The change of a run's facts that :meth:`start` makes, for the run service to make in the
        transaction that claims the run (one writer round trip less per run), then :meth:`start_claimed`
        instead of :meth:`start`; None where something between the claim and that change may refuse the
        run or write first (a one-shot agent takes its run with a write; a degraded catalog's check)."""
        if self.one_shot or (self.catalog is not None and self.catalog.reported and self.catalog.degraded):
            return None
        fingerprint = self.conn.hello.fingerprint
        return lambda facts: catalog.start_facts(facts, fingerprint)

    def local_paths(self) -> bool:
        """Only an agent on this machine resolves this machine's paths; another resolves its own."""
        return self.conn.same_machine

    async def start_claimed(self, run: Run, job: Job) -> None:
        """:meth:`start` of a run whose claim made the change :meth:`claim_facts` gave, its job built as
        :meth:`local_paths` says: nothing is left that may refuse it (see there) or write, so it is sent."""
        await self._send(run.id, job)

    async def _send(self, run_id: str, job: Job) -> None:
        if not await self.conn.send(protocol.Assign(run_id, job)):
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent")

    def stop(self, run_id: str, grace: float) -> bool:
        self.manager.runs.spawn(self.conn.send(protocol.Stop(run_id)))
        return True


class WorkerSession:
    """One agent's connection: handshake → welcome → serve → gone (slots: one per connected agent)."""

    __slots__ = ("m", "request", "ws", "client", "address", "conn", "beat_text", "_text")

    def __init__(self, manager: Manager, request: web.Request) -> None:
        self.m = manager
        self.request = request
        self.ws = web.WebSocketResponse(max_msg_size=protocol.MAX_MESSAGE, heartbeat=None)
        # The real client: behind a trusted proxy, the address the proxy names (cdui/plane/http/proxies.py).
        self.client = proxies.client_of(request)
        self.address = self.client.address
        self.conn: Conn | None = None  # set once admitted
        # The text of the last heartbeat handled whole (see _heard_again), and of the message being handled.
        self.beat_text: str | None = None
        self._text: str | None = None

    async def run(self) -> web.WebSocketResponse:
        """The whole connection; the route handler of ``/ws/worker``."""
        ws = self.ws
        await ws.prepare(self.request)
        row = await self.handshake()
        if row is None:
            return ws
        conn = self.conn
        assert conn is not None  # handshake admitted it
        # What the connection needs of the worker's row, and not the row: this frame lasts as long as the
        # connection (a row is about 1.6 KiB, held for each of thousands of agents).
        name, drained, disabled = row["name"], bool(row["drained"]), bool(row["disabled"])
        del row
        executor = RemoteExecutor(self.m, conn)
        try:
            await self.m.runs.oneshot.connected(self.m, executor, name)
            await self.welcome()
            # The row was read before the welcome; a drain or undrain since then is in drain_flags.
            executor.drained = self.m.drain_flags.get(name, drained)
            executor.disabled = disabled
            self.m.runs.attach_executor(executor)
            await self.m.runs.oneshot.start_wanted(self.m, executor)
            # Its liveness (three missed heartbeats) is checked by the manager, for all connections at once.
            await self.serve()
        finally:
            if self.m.conns.get(conn.name) is conn:
                # Only the worker's current connection: one that a reconnect replaced has left nothing.
                self.m.runs.oneshot.gone(executor)
                self.m.unregister(conn)
                self.m.runs.detach_executor(conn.name, executor)
                # aiohttp cancels this handler once a peer's clean close completes; what
                # the departed worker's runs become must not be cut short by that.
                await asyncio.shield(self.m.runs.spawn(self.gone()))
            await ws.close()
        return ws

    # -- 1. handshake ------------------------------------------------------------------
    async def _first_message(self) -> str | admission.NoHello:
        try:
            first = await self.ws.receive(timeout=HELLO_TIMEOUT_S)
        except TimeoutError:
            return admission.NoHello("no hello within 30 s")
        if first.type != WSMsgType.TEXT:
            return admission.NoHello("the first message must be a JSON text hello")
        return str(first.data)

    async def handshake(self) -> WorkerRow | None:
        """Admit the connection or refuse it; the credential's ``workers`` row if admitted, else None."""
        ws, store = self.ws, self.m.store
        auth = self.request.headers.get("Authorization", "")
        cred = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        h = enroll.hash_secret(cred) if cred else ""

        row = await store.workers.by_credential(h) if h else None
        old = None
        first: str | admission.NoHello | None = None
        if row is None:
            old = await store.workers.old_credential(h) if h else None
        else:
            first = await self._first_message()
        existing = self.m.conns.get(oneshot.peek_conn_name(row["name"], first)) if row is not None else None
        if existing is not None and existing.ws.closed:
            existing = None
        decision = admission.decide(row, old, first, existing.address if existing else None, __version__, h,
                                    existing.hello.agent_id if existing else None)
        if isinstance(decision, admission.Accept):
            decision = await self.m.runs.oneshot.admit(decision, self.m)
        if isinstance(decision, admission.Refuse):
            if decision.listed_name is not None:
                self.m.reject(decision.listed_name, decision.listed_reason or decision.code, self.address,
                              decision.listed_once_per)
            await ws.send_str(protocol.Refused(decision.code, decision.message, decision.update).to_json())
            await ws.close()
            return None
        name, hello = decision.name, decision.hello
        assert row is not None  # admitted: only a known credential's row is admitted
        if hello.catalog is not None:
            hello.catalog = self.m.shared_catalog(hello.catalog)
        verdict = await self._probe_same_machine(name, hello)
        if ws.closed:
            return None
        scheme_plain = self.client.unencrypted
        clock = self.m.clock
        now = clock.time()
        conn = Conn(name, ws, hello, self.address, scheme_plain, connected_at=now, last_seen=now,
                    alive_at=clock.monotonic(), same_machine=verdict.same, tls=hello.tls)
        conn.labels = labels = self._with_mount(conn, dict(hello.labels))
        self.m.same_machine[name] = verdict
        self.conn = conn
        replaced = self.m.conns.get(name) if decision.replaces else None
        self.m.register(conn)
        if replaced is not None and replaced is not conn:
            # Registered first: the old session, ending now, sees it is no longer the worker's
            # connection and leaves its runs alone (they are this connection's now).
            log.info("worker %s reconnected from %s before its old connection (from %s) was noticed to be gone; "
                     "replacing that one", name, self.address, replaced.address)
            replaced.outputs.gone()
            self.m.runs.detach_executor(name)  # the old one's; this connection attaches its own after the welcome
            # Not awaited: a dead peer never answers the close, and this agent's welcome must not wait
            # for the close handshake's timeout.
            self.m.runs.spawn(replaced.ws.close())
        await store.workers.connected(name, hello.version, list(hello.devices), labels, clock.time(), self.address,
                                      hello.machine_id)
        log.info("worker %s connected from %s (devices %s)", name, self.address, ",".join(hello.devices))
        return row

    def _with_mount(self, conn: Conn, labels: dict[str, str]) -> dict[str, str]:
        """An agent shown to read and write the server's data folder gets it as its mount label."""
        if conn.same_machine:
            labels[self.m.config["CODEFYUI_MOUNT_LABEL"]] = str(self.m.config.layout.data_dir)
        return labels

    async def _probe_same_machine(self, name: str, hello: protocol.Hello) -> same_machine.Verdict:
        """Before the welcome, for an agent that names this machine's id: can it read a nonce written
        into the data folder just now, and write the folders its runs write to? (cdui/wire/same_machine.py)"""
        if not hello.machine_id or hello.machine_id != self.m.machine_id:
            return same_machine.Verdict(False)
        layout = self.m.config.layout
        folders = [layout.folders[f] for f in same_machine.WRITE_FOLDERS]
        try:
            await asyncio.to_thread(layout.ensure)
            path, nonce = await asyncio.to_thread(same_machine.write_nonce, layout.data_dir)
        except OSError as exc:
            log.warning("worker %s is treated as another machine: no probe file could be written into %s: %s",
                        name, layout.data_dir, exc)
            return same_machine.Verdict(False, f"the control plane could not write its probe file: {exc}")
        found: protocol.ProbeAnswer | None = None
        why = "it did not answer the probe"
        try:
            await self.ws.send_str(protocol.Probe(str(path), [str(f) for f in folders]).to_json())
            try:
                msg = await self.ws.receive(timeout=same_machine.PROBE_TIMEOUT_S)
            except TimeoutError:
                msg = None
                why = f"it did not answer the probe within {same_machine.PROBE_TIMEOUT_S:.0f} s"
            if msg is not None and msg.type == WSMsgType.TEXT:
                try:
                    parsed = protocol.parse_agent_message(str(msg.data))
                except protocol.ProtocolError as exc:
                    why = f"its answer to the probe does not fit the protocol: {exc}"
                else:
                    if isinstance(parsed, protocol.ProbeAnswer):
                        found = parsed
                    else:
                        why = f"it answered the probe with {parsed.type!r}"
        finally:
            await asyncio.to_thread(same_machine.remove, path)
        verdict = same_machine.judge(nonce, found, why)
        if verdict.note:
            log.warning("worker %s is treated as another machine: %s", name, verdict.note)
        return verdict

    # -- 2. welcome --------------------------------------------------------------------
    async def welcome(self) -> None:
        conn = self.conn
        assert conn is not None
        m, store = self.m, self.m.store
        src = f"worker:{conn.name}"
        held = {r.run_id: r for r in conn.hello.runs}
        answer: dict[str, protocol.RunAnswer] = {}
        stops = []
        for run_id, h in held.items():
            run = await store.get_run(run_id)
            acked = await store.source_acked(run_id, src) if run else 0
            if run is None or run.worker_id != conn.name:
                answer[run_id] = protocol.RunAnswer(h.last_seq, "drop")
                continue
            if run.status in TERMINAL:
                answer[run_id] = protocol.RunAnswer(acked, "stop")
                continue
            answer[run_id] = protocol.RunAnswer(acked, "continue")
            m.cancel_timer(run_id)
            m.runs.adopt(run_id, conn.name, run.slot_device or "cpu", run.options)
            if run.status == "disconnected":
                await store.mark_reconnected(run_id)
                away = m.clock.time() - (run.disconnected_at or m.clock.time())
                await m.runs.record_cp(run_id, "run_warning", {
                    "kind": "worker_reconnected",
                    "message": f"worker {conn.name} reconnected after {away:.0f} s; resuming from event {acked}"})
            if run.stop_requested:
                stops.append(run_id)
        await conn.send(protocol.Welcome(__version__, conn.name, m.heartbeat, m.grace, answer))
        for run_id in stops:
            await conn.send(protocol.Stop(run_id))
        bucket = m.runs.storage
        if bucket is not None:  # its bucket credentials may come from a control plane that is gone
            await bucket.on_worker_resumed([r for r, a in answer.items() if a.action == "continue"])
        # Runs this worker should hold but does not: its agent restarted without them.
        active = await asyncio.to_thread(store.active_runs_of_sync, conn.name)
        for r in active:
            if r.id in held:
                continue
            m.cancel_timer(r.id)
            if await store.source_acked(r.id, src) == 0:
                # Not one event of it ever arrived: the assignment was lost in
                # transit (or the agent died before it started the run), so
                # nothing ran that could be lost by running it again.
                await m.runs.requeue(r.id, f"the run was requeued because its assignment never reached "
                                           f"worker {conn.name}: it reconnected without the run and had "
                                           f"sent no event of it")
            else:
                await m.runs.finish(r.id, "interrupted",
                                    f"worker {conn.name} reconnected without the run (its agent restarted)")

    # -- 3. serve ---------------------------------------------------------------------------
    async def serve(self) -> None:
        # A worker's events messages are handled in order by a task of their own, so that the next
        # message is read, decoded and checked while the previous one's events are being committed
        # (a flood's messages come back to back). Up to EVENTS_AHEAD wait their turn, then reading
        # waits too, and the agent's sends wait in turn, as when each message was handled where read.
        inbox = InOrder(self._events_one)
        try:
            await self._read_messages(inbox)
        except BaseException:
            inbox.cancel()
            raise
        # The connection ended: the messages already read are still stored, in order (those it could not
        # acknowledge any more the agent sends again after reconnecting, and they are stored once).
        await inbox.drained()

    async def _events_one(self, m: protocol.Events) -> None:
        conn = self.conn
        assert conn is not None
        try:
            await self.events(m)
        except DiskFull:
            pass  # the store reported the full disk once; the agent keeps the events in its spool
        except Exception:  # one bad message must not end the connection
            log.exception("handling an events message from worker %s failed", conn.name)
            await conn.send(protocol.Error("the control plane failed to handle that message; see its log"))

    async def _read_messages(self, inbox: InOrder) -> None:
        conn = self.conn
        assert conn is not None
        clock, ws, turns = self.m.clock, conn.ws, self.m.turns
        burst = time.perf_counter()
        while True:
            asked = time.perf_counter()
            msg = await ws.receive()
            now = time.perf_counter()
            if now - asked > WAITED_S:
                burst = now  # it waited for this one: the messages from here on are a new burst
            elif now - burst > BURST_S:
                # Handed over with the ones before it, and those took the loop BURST_S: what became ready
                # meanwhile (a request, another agent's message) is served before this one is handled.
                await behind_ready_sockets()
                burst = time.perf_counter()
            if msg.type in CLOSED_TYPES:  # what ends `async for` over the socket
                return
            conn.last_seen = clock.time()
            conn.alive_at = clock.monotonic()
            if self._heard_again(msg):
                continue  # its last heartbeat again, word for word: nothing changed but the last contact
            await turns.take()  # with every agent's other messages, a share of the loop's turn at most
            if msg.type != WSMsgType.TEXT and msg.type != WSMsgType.BINARY:
                return  # an error on the socket
            try:
                # A binary frame is a run's lines as the agent passed them through (protocol.parse_lines):
                # read here by the rules a local run's lines are read by, into the events they stand for.
                m = (protocol.parse_agent_message(msg.data) if msg.type == WSMsgType.TEXT
                     else protocol.parse_lines(msg.data, clock.time()))
            except protocol.ProtocolError as exc:
                log.warning("worker %s sent a malformed message: %s", conn.name, exc)
                await conn.send(protocol.Error(f"malformed message: {exc}"))
                continue
            try:
                if isinstance(m, protocol.Events):
                    await inbox.put(m)
                elif isinstance(m, protocol.Heartbeat):
                    await self.heartbeat(m)
                elif isinstance(m, (protocol.OutputsAnswer, protocol.RawAnswer, protocol.LogAnswer,
                                    protocol.PluginPushAnswer, protocol.AppAnswer)):
                    # A pushed pack's answer waits there too (cdui/plane/http/api_plugins.py), and an app
                    # invoke's (cdui/plane/apps.py).
                    conn.outputs.answered(m)
                else:
                    await conn.send(protocol.Error("hello was already received"))
            except DiskFull:
                pass  # the store reported the full disk once; a heartbeat's last_seen waits for room
            except Exception:  # one bad message must not end the connection
                log.exception("handling a message from worker %s failed", conn.name)
                await conn.send(protocol.Error("the control plane failed to handle that message; see its log"))

    def _heard_again(self, msg: Any) -> bool:
        """Whether ``msg`` is the text of the last heartbeat this session handled, and was noted as one.

        An agent sends the same heartbeat every interval while nothing changes (its running runs, its
        labels, its key pins). The same text decodes to the same message, whose handling changes
        nothing this time (its labels and pins are the connection's already) but the last contact, so
        it is not decoded and checked again: a comparison of a hundred characters instead of a JSON
        decode and the protocol's checks, thousands of times an interval. Anything else is handled whole."""
        text = msg.data if msg.type == WSMsgType.TEXT else None
        if text is None or not text.startswith(BEAT_PREFIX):
            self._text = None  # not a heartbeat as agents write them (an events message is not kept)
            return False
        if text == self.beat_text:
            assert self.conn is not None
            self.m.seen(self.conn)
            return True
        self._text = text  # kept by heartbeat() once handled whole
        return False

    async def heartbeat(self, m: protocol.Heartbeat) -> None:
        conn = self.conn
        assert conn is not None
        text, self._text = self._text, None
        if m.tls is not None:
            conn.tls = m.tls
        if m.gpu is not None:
            conn.gpu, conn.gpu_at = m.gpu, conn.last_seen
        if m.serving is not None:
            conn.serving = m.serving
            # Each serving process holds a slot of its device there, as a run does (queued runs wait for it).
            self.m.runs.hold_app_slots(conn.name, [p["device"] for p in m.serving])
        if m.labels is not None:
            labels = self._with_mount(conn, dict(m.labels))
            if labels != conn.labels:
                # Rare (a mount or read root changed): stored at once, as the hello's are.
                conn.labels = labels
                await self.m.store.workers.seen(conn.name, conn.last_seen, labels)
                self.beat_text = text  # stored: the same text again changes nothing
                return
        # The usual heartbeat changes nothing but the last contact: noted, and written with the
        # other workers' in one statement a heartbeat interval (WorkerManager._watch).
        self.m.seen(conn)
        self.beat_text = text

    async def events(self, m: protocol.Events) -> None:
        conn = self.conn
        assert conn is not None
        await self.m.turns.take()  # handled in a share of the loop's turn with every agent's other messages
        store = self.m.store
        held = self.m.runs.active.get(m.run_id)
        if held is not None and held[0] == conn.name:
            # It holds a slot on this worker: it is this worker's and has not ended (its ending frees
            # the slot), so its row need not be read for every message of a flood. The events go to the
            # store as the message carries them (protocol checked each: src_seq >= 1, kind, data, at),
            # each with its text where the message was laid out as agents write it.
            await self._record(conn, m.run_id, m.events, m.texts)
            return
        events = [Event.from_wire(e) for e in m.events]
        run = await store.get_run(m.run_id)
        if run is None or run.worker_id != conn.name:
            await conn.send(protocol.Ack(m.run_id, max((e.src_seq or 0 for e in events), default=0)))
            return
        if run.status in TERMINAL:
            # Ended here while the worker was away: keep the log as it is, keep its real ending.
            # A run this worker itself ended has no later ending to keep: whatever it sends
            # after its own final status (a replay after a restart) is not how the run ended.
            ended_by_it = any(e.kind == "status" and e.data.get("status") in TERMINAL
                              for e in events) and await self._ended_by(m.run_id, conn.name)
            for e in events:
                d = e.data
                if e.kind == "status" and d.get("status") in TERMINAL and not run.late_result and not ended_by_it:
                    late = {"status": d["status"], "error": d.get("error"), "worker_id": conn.name,
                            "at": iso(e.at or self.m.clock.time())}
                    facts = dict(run.execution_facts or {})
                    facts["late_result"] = late
                    await store.set_late_result(m.run_id, late, facts)
                    run = replace(run, late_result=late)
            await conn.send(protocol.Ack(m.run_id, max((e.src_seq or 0 for e in events), default=0)))
            return
        await self._record(conn, m.run_id, m.events, m.texts)

    async def _record(self, conn: Conn, run_id: str, events: list[dict[str, Any]],
                      texts: list[str | None] | None = None) -> None:
        """Store events of a run this worker holds (as its message carries them, each with its text where
        kept), and acknowledge them once stored."""
        try:
            acked = await self.m.runs.record_wire(run_id, f"worker:{conn.name}", events, texts)
        except DiskFull as err:
            # No ack: the agent keeps the events in its spool. Once there is room the
            # connection is renewed (see WorkerManager.on_disk_recovered) and it replays them.
            if conn.name not in self.m.unstored:
                log.error("worker %s: events of run %s not stored: %s", conn.name, run_id, err.message)
                await conn.send(protocol.Error(f"{err.message}; your events are not acknowledged: keep them in the "
                                               f"spool, they are asked for again once there is room"))
            self.m.unstored.add(conn.name)
            return
        await conn.send(protocol.Ack(run_id, acked))

    async def _ended_by(self, run_id: str, name: str) -> bool:
        """Whether the stored log holds a final status of the run from worker ``name``."""
        return await self.m.store.has_final_status_from(run_id, f"worker:{name}")

    # -- 4. gone -------------------------------------------------------------------------
    async def gone(self) -> None:
        conn = self.conn
        assert conn is not None
        m, name = self.m, conn.name
        log.warning("worker %s disconnected", name)
        conn.outputs.gone()
        m.runs.hold_app_slots(name, [])  # its serving processes hold no slot here while it is away
        for run_id, _, _ in m.runs.runs_on(name):
            if m.closing and m.handover:
                continue  # a stop for a restart: the run stays running, for the next start to adopt
            if m.closing:
                # Nobody would be left to wait for its return: the server is stopping.
                await m.runs.finish(run_id, "interrupted",
                                    f"the server was stopping and worker {name} disconnected before the run "
                                    f"stopped")
                continue
            if m.grace <= 0:
                await m.runs.finish(run_id, "interrupted",
                                    f"worker {name} disconnected and CODEFYUI_WORKER_RESUME_GRACE_S is 0")
                continue
            run = await m.store.get_run(run_id)
            if run is None or run.status != "running":
                continue
            now = m.clock.time()
            await m.store.mark_disconnected(run_id, now)
            await m.runs.record_cp(run_id, "run_warning", {
                "kind": "worker_disconnected",
                "message": f"worker {name} disconnected; the run keeps its slot for up to {m.grace:g} s"})
            m.start_timer(run_id, adopted=False)

"""Remote workers on the control plane: ``/ws/worker``, remote executors,
disconnects, resume and adoption. The plain HTTP routes (enrollment, tokens,
drain, reissue, remove) are in :mod:`cdui.worker_routes`; who may connect is
decided by :func:`cdui.worker_admission.decide`.

The wire shapes are in :mod:`cdui.protocol`, token policy in
:mod:`cdui.enroll`; this module is the loop that ties them to the run service.

Disconnect handling, in one place:

- a worker's connection closes, or it is silent for three heartbeats: each of
  its active runs becomes ``disconnected`` (``worker_disconnected`` warning),
  keeps its slot, and waits ``CODEFYUI_WORKER_RESUME_GRACE_S``;
- it reconnects holding the run: back to ``running`` (``worker_reconnected``),
  the agent replays every event after the last acknowledged one;
- the grace passes: the run ends ``interrupted`` and frees its slot; if the
  worker later returns with it, it is told to stop and the real ending is
  stored as ``late_result``;
- the control plane restarted (it was killed): worker runs are *adopted* at
  start (``disconnected``, same slot, same log) and wait the grace from then.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import WSMsgType, web

from cdui import __version__, catalog, enroll, protocol
from cdui import worker_admission as admission
from cdui.appkeys import CLOCK, CONFIG, RUNS
from cdui.config import machine_id
from cdui.diskfull import DiskFull
from cdui.errors import CduiError
from cdui.job import Job
from cdui.netaddr import is_loopback
from cdui.placement import no_mount_message
from cdui.runs import RunService, iso
from cdui.store import ACTIVE, TERMINAL, Run

log = logging.getLogger(__name__)
MAX_REJECTED = 50  # names kept in the list of refused connections


@dataclass
class Conn:
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

    async def send(self, msg: protocol.ServerMessage) -> bool:
        if self.ws.closed:
            return False
        try:
            async with self.lock:
                await self.ws.send_str(msg.to_json())
            return True
        except (ConnectionError, RuntimeError):
            return False


class RemoteExecutor:
    """A connected worker, as the run queue sees it."""

    def __init__(self, manager: WorkerManager, conn: Conn) -> None:
        self.manager = manager
        self.conn = conn
        self.name = conn.name
        self.drained = False
        self.disabled = False
        # Reported once, at the agent's start: it holds for this connection only.
        self.catalog = catalog.compare(manager.own_catalog, conn.hello.catalog, conn.hello.catalog_error)

    def devices(self) -> list[str]:
        return list(self.conn.hello.devices)

    def mounted(self) -> bool:
        return self.manager.config["CODEFYUI_MOUNT_LABEL"] in self.conn.labels

    def unavailable_reason(self) -> str | None:
        if self.disabled:
            return f"worker {self.name} is disabled"
        if self.drained:
            return f"worker {self.name} is draining (no new runs)"
        return None

    async def start(self, run: Run, job: Job) -> None:
        if self.conn.hello.machine_id != self.manager.machine_id:
            job = job.without_local_paths()  # another machine resolves paths in its own installation
        # Checked again right before it goes: the worker may have come back with fewer types.
        missing = catalog.missing_types(self.catalog, job.graph, {})
        if missing:
            raise catalog.refuse_missing(self.name, missing)
        await self.manager.store.update_run(run.id, execution_facts=catalog.start_facts(
            run.execution_facts, self.conn.hello.fingerprint))
        if not await self.conn.send(protocol.Assign(run.id, job)):
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent")

    def stop(self, run_id: str, grace: float) -> bool:
        self.manager.runs.spawn(self.conn.send(protocol.Stop(run_id)))
        return True


class WorkerManager:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.config = app[CONFIG]
        self.clock = app[CLOCK]
        self.runs: RunService = app[RUNS]
        self.store = self.runs.store
        self.conns: dict[str, Conn] = {}
        self.rejected: dict[str, dict[str, Any]] = {}
        self._revoked_seen: dict[str, float] = {}
        self.timers: dict[str, asyncio.Task[Any]] = {}
        self.grace = float(self.config["CODEFYUI_WORKER_RESUME_GRACE_S"])
        self.heartbeat = float(self.config["CODEFYUI_WORKER_HEARTBEAT_S"])
        self.machine_id = machine_id()
        self.own_catalog = catalog.node_catalog(self.runs.registry)
        self.limiter = enroll.RateLimiter(int(self.config["CODEFYUI_ENROLL_RATE_PER_MIN"]),
                                         clock=self.clock.monotonic)
        self.closing = False
        self._ended = asyncio.Event()
        self.unstored: set[str] = set()  # workers whose events a full disk kept from being stored

    # -- start: adopt what a killed control plane left -------------------------------
    async def before_dispatch(self) -> None:
        rows = await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE)
        for r in rows:
            if r.worker_id in (None, "local"):
                continue
            if self.grace <= 0:
                await self.runs.finish(r.id, "interrupted",
                                        "the server restarted and CODEFYUI_WORKER_RESUME_GRACE_S is 0, "
                                        "so worker runs are not adopted")
                continue
            now = self.clock.time()
            self.runs.adopt(r.id, r.worker_id, r.slot_device or "cpu")
            await self.store.update_run(r.id, status="disconnected", disconnected_at=now, adopted_at=now)
            await self.runs.record_cp(r.id, "run_warning", {
                "kind": "worker_disconnected", "restart": True,
                "message": f"the server restarted; waiting up to {self.grace:.0f} s for worker {r.worker_id} "
                           f"to reconnect with the run"})
            self._start_timer(r.id, adopted=True)

    # -- grace timers -------------------------------------------------------------
    def _start_timer(self, run_id: str, adopted: bool) -> None:
        self._cancel_timer(run_id)
        self.timers[run_id] = self.runs.spawn(self._grace_expiry(run_id, adopted))

    def _cancel_timer(self, run_id: str) -> None:
        t = self.timers.pop(run_id, None)
        if t is not None and t is not asyncio.current_task():
            t.cancel()

    async def _grace_expiry(self, run_id: str, adopted: bool) -> None:
        await self.clock.sleep(self.grace)
        self.timers.pop(run_id, None)
        run = await self.store.get_run(run_id)
        if run is None or run.status != "disconnected":
            return
        g = f"{self.grace:g}"
        if adopted:
            msg = f"it did not reconnect with the run within {g} s after this server restarted"
        else:
            msg = f"worker {run.worker_id} did not reconnect within {g} s (CODEFYUI_WORKER_RESUME_GRACE_S)"
        await self.runs.finish(run_id, "interrupted", msg)

    async def on_terminal(self, run_id: str, status: str) -> None:
        self._cancel_timer(run_id)
        self._ended.set()  # wakes a shutdown waiting for worker runs to end

    # -- connection lifecycle --------------------------------------------------------
    def _reject(self, name: str, reason: str, address: str, cred_hash: str | None = None) -> None:
        now = self.clock.time()
        if cred_hash is not None:
            last = self._revoked_seen.get(cred_hash)
            if last is not None and now - last < 3600:
                return
            self._revoked_seen[cred_hash] = now
        if len(self._revoked_seen) > MAX_REJECTED * 20:
            self._revoked_seen = {h: t for h, t in self._revoked_seen.items() if now - t < 3600}
        # The latest refusal per name, for at most MAX_REJECTED names: a flood of
        # made-up names cannot grow the list (or GET /api/workers) without end.
        name = name[:protocol.MAX_NAME]
        self.rejected.pop(name, None)
        self.rejected[name] = {"name": name, "reason": reason[:500], "address": address, "at": iso(now)}
        while len(self.rejected) > MAX_REJECTED:
            del self.rejected[next(iter(self.rejected))]
        log.warning("rejected worker connection %s from %s: %s", name, address, reason)

    async def _first_message(self, ws: web.WebSocketResponse) -> str | admission.NoHello:
        try:
            first = await ws.receive(timeout=30)
        except TimeoutError:
            return admission.NoHello("no hello within 30 s")
        if first.type != WSMsgType.TEXT:
            return admission.NoHello("the first message must be a JSON text hello")
        return str(first.data)

    async def ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=protocol.MAX_MESSAGE, heartbeat=None)
        await ws.prepare(request)
        address = request.remote or "?"
        auth = request.headers.get("Authorization", "")
        cred = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        h = enroll.hash_secret(cred) if cred else ""

        row = await self.store.read(
            lambda c: c.execute("SELECT * FROM workers WHERE credential_hash=?", (h,)).fetchone() if h else None)
        old = None
        first: str | admission.NoHello | None = None
        if row is None:
            old = await self.store.read(lambda c: c.execute("SELECT * FROM old_credentials WHERE credential_hash=?",
                                                            (h,)).fetchone() if h else None)
        else:
            first = await self._first_message(ws)
        existing = self.conns.get(row["name"]) if row is not None else None
        decision = admission.decide(row, old, first, existing.address if existing and not existing.ws.closed
                                    else None, __version__, h)
        if isinstance(decision, admission.Refuse):
            if decision.listed_name is not None:
                self._reject(decision.listed_name, decision.listed_reason or decision.code, address,
                             decision.listed_once_per)
            await ws.send_str(protocol.Refused(decision.code, decision.message).to_json())
            await ws.close()
            return ws
        name, hello = decision.name, decision.hello
        assert row is not None  # admitted: only a known credential's row is admitted
        labels = dict(hello.labels)
        if hello.machine_id and hello.machine_id == self.machine_id:
            labels[self.config["CODEFYUI_MOUNT_LABEL"]] = str(self.config.layout.data_dir)
        scheme_plain = request.scheme == "http" and not is_loopback(request)
        now = self.clock.time()
        conn = Conn(name, ws, hello, address, scheme_plain, connected_at=now, last_seen=now, labels=labels,
                    alive_at=self.clock.monotonic())
        self.conns[name] = conn
        self.rejected.pop(name, None)
        await self.store.write(lambda c: c.execute(
            "UPDATE workers SET version=?, devices=?, labels=?, last_seen=?, address=?, machine_id=? WHERE name=?",
            (hello.version, json.dumps(hello.devices), json.dumps(labels), self.clock.time(), address,
             hello.machine_id, name)))
        log.info("worker %s connected from %s (devices %s)", name, address, ",".join(hello.devices))
        executor = RemoteExecutor(self, conn)
        try:
            await self._welcome(conn, row)
            executor.drained = bool(row["drained"])
            executor.disabled = bool(row["disabled"])
            self.runs.attach_executor(executor)
            watchdog = self.runs.spawn(self._watchdog(conn))
            try:
                await self._serve(conn)
            finally:
                watchdog.cancel()
        finally:
            if self.conns.get(name) is conn:
                self.conns.pop(name, None)
                self.runs.detach_executor(name, executor)
                # aiohttp cancels this handler once a peer's clean close completes; what
                # the departed worker's runs become must not be cut short by that.
                await asyncio.shield(self.runs.spawn(self._worker_gone(name)))
            await ws.close()
        return ws

    async def _welcome(self, conn: Conn, row: Any) -> None:
        src = f"worker:{conn.name}"
        held = {r.run_id: r for r in conn.hello.runs}
        answer: dict[str, protocol.RunAnswer] = {}
        stops = []
        for run_id, h in held.items():
            run = await self.store.get_run(run_id)
            acked = await self.store.source_acked(run_id, src) if run else 0
            if run is None or run.worker_id != conn.name:
                answer[run_id] = protocol.RunAnswer(h.last_seq, "drop")
                continue
            if run.status in TERMINAL:
                answer[run_id] = protocol.RunAnswer(acked, "stop")
                continue
            answer[run_id] = protocol.RunAnswer(acked, "continue")
            self._cancel_timer(run_id)
            self.runs.adopt(run_id, conn.name, run.slot_device or "cpu")
            if run.status == "disconnected":
                await self.store.update_run(run_id, status="running", disconnected_at=None)
                away = self.clock.time() - (run.disconnected_at or self.clock.time())
                await self.runs.record_cp(run_id, "run_warning", {
                    "kind": "worker_reconnected",
                    "message": f"worker {conn.name} reconnected after {away:.0f} s; resuming from event {acked}"})
            if run.stop_requested:
                stops.append(run_id)
        await conn.send(protocol.Welcome(__version__, conn.name, self.heartbeat, self.grace, answer))
        for run_id in stops:
            await conn.send(protocol.Stop(run_id))
        # Runs this worker should hold but does not: its agent restarted without them.
        active = await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE)
        for r in active:
            if r.worker_id != conn.name or r.id in held:
                continue
            self._cancel_timer(r.id)
            if await self.store.source_acked(r.id, src) == 0:
                # Not one event of it ever arrived: the assignment was lost in
                # transit (or the agent died before it started the run), so
                # nothing ran that could be lost by running it again.
                await self.runs.requeue(r.id, f"the run was requeued because its assignment never reached "
                                                 f"worker {conn.name}: it reconnected without the run and had "
                                                 f"sent no event of it")
            else:
                await self.runs.finish(r.id, "interrupted",
                                        f"worker {conn.name} reconnected without the run (its agent restarted)")

    async def _serve(self, conn: Conn) -> None:
        async for msg in conn.ws:
            conn.last_seen = self.clock.time()
            conn.alive_at = self.clock.monotonic()
            if msg.type != WSMsgType.TEXT:
                if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                    return
                await conn.send(protocol.Error("binary frames are not part of the protocol"))
                continue
            try:
                m = protocol.parse_agent_message(msg.data)
            except protocol.ProtocolError as exc:
                log.warning("worker %s sent a malformed message: %s", conn.name, exc)
                await conn.send(protocol.Error(f"malformed message: {exc}"))
                continue
            try:
                if isinstance(m, protocol.Events):
                    await self._events(conn, m)
                elif isinstance(m, protocol.Heartbeat):
                    if m.labels is not None:
                        labels = dict(m.labels)
                        if conn.hello.machine_id == self.machine_id:
                            labels[self.config["CODEFYUI_MOUNT_LABEL"]] = str(self.config.layout.data_dir)
                        conn.labels = labels
                    await self.store.write(lambda c: c.execute("UPDATE workers SET last_seen=?, labels=? WHERE name=?",
                                                               (conn.last_seen, json.dumps(conn.labels), conn.name)))
                else:
                    await conn.send(protocol.Error("hello was already received"))
            except DiskFull:
                pass  # the store reported the full disk once; a heartbeat's last_seen waits for room
            except Exception:  # one bad message must not end the connection
                log.exception("handling a message from worker %s failed", conn.name)
                await conn.send(protocol.Error("the control plane failed to handle that message; see its log"))

    async def _watchdog(self, conn: Conn) -> None:
        while not conn.ws.closed:
            await self.clock.sleep(self.heartbeat)
            if self.clock.monotonic() - conn.alive_at > 3 * self.heartbeat:
                log.warning("worker %s missed 3 heartbeats; treating it as disconnected", conn.name)
                await conn.ws.close()
                return

    async def _events(self, conn: Conn, m: protocol.Events) -> None:
        run = await self.store.get_run(m.run_id)
        if run is None or run.worker_id != conn.name:
            await conn.send(protocol.Ack(m.run_id, max((e["src_seq"] for e in m.events), default=0)))
            return
        if run.status in TERMINAL:
            # Ended here while the worker was away: keep the log as it is, keep its real ending.
            for e in m.events:
                d = e.get("data") or {}
                if e["kind"] == "status" and d.get("status") in TERMINAL and not run.late_result:
                    late = {"status": d["status"], "error": d.get("error"), "worker_id": conn.name,
                            "at": iso(e.get("at") or self.clock.time())}
                    facts = dict(run.execution_facts or {})
                    facts["late_result"] = late
                    await self.store.update_run(m.run_id, late_result=late, execution_facts=facts)
                    run = replace(run, late_result=late)
            await conn.send(protocol.Ack(m.run_id, max((e["src_seq"] for e in m.events), default=0)))
            return
        try:
            acked = await self.runs.record_events(m.run_id, f"worker:{conn.name}", m.events)
        except DiskFull as err:
            # No ack: the agent keeps the events in its spool. Once there is room the
            # connection is renewed (see on_disk_recovered) and it replays them.
            if conn.name not in self.unstored:
                log.error("worker %s: events of run %s not stored: %s", conn.name, m.run_id, err.message)
                await conn.send(protocol.Error(f"{err.message}; your events are not acknowledged: keep them in the "
                                                    f"spool, they are asked for again once there is room"))
            self.unstored.add(conn.name)
            return
        await conn.send(protocol.Ack(m.run_id, acked))

    async def on_disk_recovered(self) -> None:
        """The disk has room again: renew the connections of workers whose events were not
        stored, so that each agent replays, in order, everything it kept in its spool."""
        names, self.unstored = self.unstored, set()
        for name in names:
            conn = self.conns.get(name)
            if conn is not None and not conn.ws.closed:
                log.warning("worker %s: disk space is back; reconnecting it to replay its unstored events", name)
                await conn.ws.close(message=b"disk space is back: reconnect and replay")

    async def _worker_gone(self, name: str) -> None:
        log.warning("worker %s disconnected", name)
        for run_id, _, _ in self.runs.runs_on(name):
            if self.closing:
                # Nobody would be left to wait for its return: the server is stopping.
                await self.runs.finish(run_id, "interrupted",
                                        f"the server was stopping and worker {name} disconnected before the run "
                                        f"stopped")
                continue
            if self.grace <= 0:
                await self.runs.finish(run_id, "interrupted",
                                        f"worker {name} disconnected and CODEFYUI_WORKER_RESUME_GRACE_S is 0")
                continue
            run = await self.store.get_run(run_id)
            if run is None or run.status != "running":
                continue
            now = self.clock.time()
            await self.store.update_run(run_id, status="disconnected", disconnected_at=now)
            await self.runs.record_cp(run_id, "run_warning", {
                "kind": "worker_disconnected",
                "message": f"worker {name} disconnected; the run keeps its slot for up to {self.grace:g} s"})
            self._start_timer(run_id, adopted=False)

    # -- graceful shutdown: runs on workers are stopped, not left to adopt ----------------
    async def on_shutdown(self) -> None:
        """Ask every worker run to stop and wait, up to the grace, for each worker's own ending.

        This runs while the server still reads every socket (see
        ``server._run_until_signal``), so a worker that stops its run at once
        has its final events stored and the run ends as it really did."""
        self.closing = True
        grace = float(self.config["CODEFYUI_SHUTDOWN_GRACE_S"])
        for run_id, name, _ in self.runs.runs_on():
            if name == "local":
                continue
            conn = self.conns.get(name)
            if conn is not None and not conn.ws.closed:
                await conn.send(protocol.Stop(run_id))
            else:
                await self.runs.finish(run_id, "interrupted",
                                        "the server stopped while the run's worker was disconnected")
        deadline = self.clock.monotonic() + grace + 5
        while any(ex != "local" for _, ex, _ in self.runs.runs_on()):
            self._ended.clear()
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                break
            if not await self._ended_within(remaining):
                break
        for run_id, name, _ in self.runs.runs_on():
            if name != "local":
                await self.runs.finish(run_id, "interrupted",
                                        f"the server stopped and the run did not stop within {grace:g} s")
        await self.close()

    async def _ended_within(self, seconds: float) -> bool:
        """Wait until a run ends or ``seconds`` pass on the clock; True if one ended."""
        ended = asyncio.ensure_future(self._ended.wait())
        timer = asyncio.ensure_future(self.clock.sleep(seconds))
        try:
            await asyncio.wait({ended, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            ended.cancel()
        return self._ended.is_set()

    async def close(self) -> None:
        """Let go of every connection and grace timer (the app's cleanup; idempotent)."""
        self.closing = True
        for conn in list(self.conns.values()):
            await conn.ws.close()
        for t in list(self.timers.values()):
            t.cancel()

    # -- HTTP -----------------------------------------------------------------------------
    async def worker_rows(self) -> list[dict[str, Any]]:
        return await self.store.read(lambda c: [dict(r) for r in c.execute("SELECT * FROM workers ORDER BY name")])

    async def worker_auth(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        cred = auth[7:].strip()
        if not cred:
            return None
        h = enroll.hash_secret(cred)
        row = await self.store.read(lambda c: c.execute("SELECT name FROM workers WHERE credential_hash=?",
                                                        (h,)).fetchone())
        return row[0] if row else None

    async def check_target(self, target: Any, graph: Any, files: Any) -> None:
        if not (isinstance(target, dict) and "worker" in target):
            return
        name = target["worker"]
        rows = {r["name"]: r for r in await self.worker_rows()}
        if name not in rows:
            raise CduiError("unknown_worker", f"no worker named {name!r} is enrolled",
                            hint=f"enrolled workers: {', '.join(rows) or 'none'}; add one with `cdui workers token`")
        ex = self.runs.executor(name)
        if isinstance(ex, RemoteExecutor) and isinstance(graph, dict):
            missing = catalog.missing_types(ex.catalog, graph, self.runs.preset_library())
            if missing:
                raise catalog.refuse_missing(name, missing)
        if files is None or not files.uses_files or files.transfer_ok:
            return
        conn = self.conns.get(name)
        labels = conn.labels if conn is not None else json.loads(rows[name]["labels"] or "{}")
        if self.config["CODEFYUI_MOUNT_LABEL"] not in labels:
            raise CduiError("no_mount", no_mount_message(name, files.reason),
                            hint="see docs/remote-workers.md#files-on-workers", status=400)

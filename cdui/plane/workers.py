"""Remote workers on the control plane: the registry of connections, grace
timers, adoption and shutdown. Each ``/ws/worker`` connection is one
:class:`~cdui.plane.worker_session.WorkerSession` (handshake, welcome, serve,
gone); the plain HTTP routes (enrollment, tokens, drain, reissue, remove) are
in :mod:`cdui.plane.http.worker_routes`; who may connect is decided by
:func:`cdui.plane.sched.worker_admission.decide`.

The wire shapes are in :mod:`cdui.wire.protocol`, token policy in
:mod:`cdui.plane.enroll`; this module is the loop that ties them to the run service.

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
from typing import Any

from aiohttp import web

from cdui.core.config import machine_id
from cdui.core.diskfull import DiskFull
from cdui.core.errors import CduiError
from cdui.core.layout import read_roots_in
from cdui.plane import enroll
from cdui.plane.appkeys import CLOCK, CONFIG
from cdui.plane.runs import RUNS, STOPPED_KILLED, RunService, iso
from cdui.plane.sched import catalog_check
from cdui.plane.sched.placement import no_mount_message, read_roots_message, unreadable
from cdui.plane.store import ACTIVE, WorkerRow
from cdui.plane.turns import Turns
from cdui.plane.worker_session import Conn, RemoteExecutor, WorkerSession
from cdui.run import catalog
from cdui.wire import protocol
from cdui.wire.same_machine import Verdict
from cdui.wire.target import Target, Worker, worker_name

__all__ = ["Conn", "RemoteExecutor", "WorkerManager", "WorkerSession"]

log = logging.getLogger(__name__)
MAX_REJECTED = 50  # names kept in the list of refused connections
MAX_CATALOGS = 64  # distinct node catalogs of agents kept once for all (see shared_catalog)


class WorkerManager:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.config = app[CONFIG]
        self.clock = app[CLOCK]
        self.runs: RunService = app[RUNS]
        self.store = self.runs.store
        self.conns: dict[str, Conn] = {}
        self.rejected: dict[str, dict[str, Any]] = {}
        # Workers whose agent fetched this control plane's update bundle (cdui/plane/http/worker_update.py) and
        # has not come back on its version yet: {"to", "since"} by name, for GET /api/workers.
        self.updating: dict[str, dict[str, Any]] = {}
        self._revoked_seen: dict[str, float] = {}
        self.timers: dict[str, asyncio.Task[Any]] = {}
        self.grace = float(self.config["CODEFYUI_WORKER_RESUME_GRACE_S"])
        self.heartbeat = float(self.config["CODEFYUI_WORKER_HEARTBEAT_S"])
        self.machine_id = machine_id()
        # Every agent's messages share one budget per turn of the event loop (see cdui/plane/turns.py).
        self.turns = Turns()
        # Each worker's last same-machine verdict (cdui/wire/same_machine.py), from its last connection.
        self.same_machine: dict[str, Verdict] = {}
        self.own_catalog = catalog.node_catalog(self.runs.registry)
        self._catalogs: dict[tuple[Any, tuple[Any, ...]], dict[str, Any]] = {}  # see shared_catalog
        self._verdicts: dict[tuple[int, bool, str | None], tuple[Any, catalog_check.CatalogState]] = {}
        self.limiter = enroll.EnrollLimiter(int(self.config["CODEFYUI_ENROLL_RATE_PER_MIN"]),
                                           clock=self.clock.monotonic)
        self.closing = False
        self.handover = False  # set by the handover stop (envs.HANDOVER_SIGNAL): worker runs are left to adopt
        self._ended = asyncio.Event()
        self.unstored: set[str] = set()  # workers whose events a full disk kept from being stored
        # Each worker's drain flag as last set by an operator in this process. A session reads its row
        # before it attaches its executor: a drain that lands in between would otherwise be lost until
        # the worker reconnected (set_drained finds no executor yet), so the session takes it from here.
        self.drain_flags: dict[str, bool] = {}
        # Each worker's last contact heard since it was last written: a heartbeat only notes it here and
        # one write a heartbeat interval stores them all (see _watch). Readers of the rows see them
        # already (worker_rows); a kill loses at most one interval of them, a stop none.
        self.unwritten_seen: dict[str, float] = {}
        # One task for every connection's liveness check and those writes, while any is connected.
        self._watch_task: asyncio.Task[None] | None = None

    # -- start: adopt what a killed control plane left -------------------------------
    async def before_dispatch(self) -> None:
        rows = await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE)
        for r in rows:
            if r.worker_id in (None, "local"):
                continue
            if self.runs.killed_while_stopping:
                # Its worker was told to stop it before the kill: there is nothing to adopt.
                await self.runs.finish(r.id, "interrupted", f"{STOPPED_KILLED}; worker {r.worker_id} had been "
                                                             f"told to stop it")
                continue
            if self.grace <= 0:
                await self.runs.finish(r.id, "interrupted",
                                        "the server restarted and CODEFYUI_WORKER_RESUME_GRACE_S is 0, "
                                        "so worker runs are not adopted")
                continue
            now = self.clock.time()
            self.runs.adopt(r.id, r.worker_id, r.slot_device or "cpu", r.options)
            await self.store.mark_disconnected(r.id, now, adopted=True)
            await self.runs.record_cp(r.id, "run_warning", {
                "kind": "worker_disconnected", "restart": True,
                "message": f"the server restarted; waiting up to {self.grace:.0f} s for worker {r.worker_id} "
                           f"to reconnect with the run"})
            self.start_timer(r.id, adopted=True)

    # -- grace timers -------------------------------------------------------------
    def start_timer(self, run_id: str, adopted: bool) -> None:
        self.cancel_timer(run_id)
        self.timers[run_id] = self.runs.spawn(self._grace_expiry(run_id, adopted))

    def cancel_timer(self, run_id: str) -> None:
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
        self.cancel_timer(run_id)
        self._ended.set()  # wakes a shutdown waiting for worker runs to end

    # -- the registry of connections (each one a WorkerSession) --------------------------
    async def ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        """``/ws/worker``: one :class:`~cdui.plane.worker_session.WorkerSession` per connection."""
        return await WorkerSession(self, request).run()

    def register(self, conn: Conn) -> None:
        """An admitted connection becomes the worker's current one (a newer one replaces it)."""
        self.conns[conn.name] = conn
        self.rejected.pop(conn.name, None)
        self.updating.pop(conn.name, None)  # admitted: its version is this control plane's
        if self._watch_task is None and not self.closing:
            self._watch_task = self.runs.spawn(self._watch())

    def unregister(self, conn: Conn) -> None:
        """The worker's current connection ended: it is no longer watched, and its last contact is
        written now (not a heartbeat interval later)."""
        if self.conns.get(conn.name) is conn:
            del self.conns[conn.name]
        if not self.conns and self._watch_task is not None:
            # Nothing left to watch: no timer waits on the clock for no connection.
            self._watch_task.cancel()
            self._watch_task = None
        if self.unwritten_seen:
            self.runs.spawn(self.write_seen())

    def seen(self, conn: Conn) -> None:
        """A heartbeat of the connection: its last contact, written with the others' (see _watch)."""
        self.unwritten_seen[conn.name] = conn.last_seen

    async def write_seen(self) -> None:
        """Write every last contact heard since the last write, in one statement."""
        batch = dict(self.unwritten_seen)
        try:
            await self.store.workers.seen_many(batch)
        except DiskFull:
            return  # kept for the next write
        # Forgotten only once stored (the rows read meanwhile still show them), unless a newer one came.
        for name, at in batch.items():
            if self.unwritten_seen.get(name) == at:
                del self.unwritten_seen[name]

    async def _watch(self) -> None:
        """Every heartbeat interval: close each connection silent for three of them, then write
        the last contacts heard. One task for all connections (a task and a timer per connection
        cost memory and a wakeup per heartbeat each with thousands of agents)."""
        clock, beat = self.clock, self.heartbeat
        try:
            while self.conns:
                await clock.sleep(beat)
                now = clock.monotonic()
                for conn in list(self.conns.values()):
                    if not conn.ws.closed and now - conn.alive_at > 3 * beat:
                        log.warning("worker %s missed 3 heartbeats; treating it as disconnected", conn.name)
                        # Not awaited: a dead peer never answers the close, and the others wait their turn.
                        self.runs.spawn(conn.ws.close())
                if self.unwritten_seen:
                    await self.write_seen()
        finally:
            if self._watch_task is asyncio.current_task():
                self._watch_task = None

    def reject(self, name: str, reason: str, address: str, cred_hash: str | None = None) -> None:
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

    async def on_disk_recovered(self) -> None:
        """The disk has room again: renew the connections of workers whose events were not
        stored, so that each agent replays, in order, everything it kept in its spool."""
        names, self.unstored = self.unstored, set()
        for name in names:
            conn = self.conns.get(name)
            if conn is not None and not conn.ws.closed:
                log.warning("worker %s: disk space is back; reconnecting it to replay its unstored events", name)
                await conn.ws.close(message=b"disk space is back: reconnect and replay")

    # -- operator actions (the HTTP routes call these) ------------------------------------
    def set_drained(self, name: str, drained: bool) -> None:
        """A connected worker's executor takes new runs or not (the stored flag is the caller's)."""
        self.drain_flags[name] = drained
        ex = self.runs.executor(name)
        if isinstance(ex, RemoteExecutor):
            ex.drained = drained
        self.runs.oneshot.set_drain(name, drained, self)
        # Only this worker's executors changed (a one-shot credential's instances NAME.ID too): the next
        # dispatch pass asks those for a free slot, not every executor (500 undrains would be 500 full passes).
        self.runs.wake(name)
        for e in self.runs.instances_of(name):
            self.runs.wake(e.name)

    async def remove_worker(self, name: str) -> None:
        """Forget an enrolled worker: its credential is revoked, its connection told and closed,
        its runs end (running ones ``interrupted``, queued ones aimed at it ``failed``)."""
        await self.store.workers.remove(name, self.clock.time())
        self.unwritten_seen.pop(name, None)
        self.drain_flags.pop(name, None)
        conn = self.conns.pop(name, None)
        self.runs.detach_executor(name)
        if conn is not None:
            await conn.send(protocol.Revoked(f"worker {name} was removed from the control plane; its credential "
                                             f"is revoked"))
            await conn.ws.close()
        for run_id, _, _ in self.runs.runs_on(name):
            await self.runs.finish(run_id, "interrupted", f"worker {name} was removed")
        for r in await asyncio.to_thread(self.store.runs_in_status_sync, {"queued"}):
            if r.target == Worker(name):
                await self.runs.finish(r.id, "failed", f"worker {name} was removed before the run started")
        for r in await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE):
            if r.worker_id == name:
                await self.runs.finish(r.id, "interrupted", f"worker {name} was removed")
        await self.runs.oneshot.revoke_instances(name, self)

    # -- graceful shutdown: runs on workers are stopped, not left to adopt ----------------
    async def on_shutdown(self) -> None:
        """Ask every worker run to stop and wait, up to the grace, for each worker's own ending.

        This runs while the server still reads every socket (see
        ``server._run_until_signal``), so a worker that stops its run at once
        has its final events stored and the run ends as it really did."""
        self.closing = True
        if self.handover:
            # A stop for a restart (`cdui update`): the workers keep their runs, and the next start adopts them
            # (their rows stay running) as it does after a crash.
            return
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
        if self._watch_task is not None:
            self._watch_task.cancel()
            self._watch_task = None
        if self.unwritten_seen:
            try:
                await self.write_seen()
            except Exception:  # the store may be closed already: a stop loses at most one interval of them
                log.warning("the workers' last contacts of the last %g s could not be written", self.heartbeat)
        for conn in list(self.conns.values()):
            await conn.ws.close()
        for t in list(self.timers.values()):
            t.cancel()

    # -- HTTP -----------------------------------------------------------------------------
    async def worker_rows(self) -> list[WorkerRow]:
        """The stored rows, with the last contacts not written yet. Those pending before the read are taken
        too: one written while the rows were read (a worker that just went: its last contact is written at
        once) is no longer pending after the read, and the row may have been read before it."""
        pending = dict(self.unwritten_seen)
        rows = await self.store.workers.all()
        pending.update(self.unwritten_seen)
        if pending:
            for r in rows:
                at = pending.get(r["name"])
                if at is not None and (r["last_seen"] is None or at > r["last_seen"]):
                    r["last_seen"] = at
        return rows

    async def worker_auth(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        cred = auth[7:].strip()
        if not cred:
            return None
        h = enroll.hash_secret(cred)
        row = await self.store.workers.by_credential(h)
        return row["name"] if row is not None else None

    def catalog_state(self, name: str) -> catalog_check.CatalogState | None:
        """The connected worker's catalog against ours (None: not connected); from its hello,
        so it holds from the welcome on, before its executor is attached."""
        conn = self.conns.get(name)
        if conn is None or conn.ws.closed:
            return None
        return self.compare_catalog(conn.hello, conn.same_machine)

    def shared_catalog(self, reported: dict[str, Any]) -> dict[str, Any]:
        """One copy of each distinct node catalog the agents report (thousands of agents report a
        few), so that a connection does not hold its own list of every type; at most
        MAX_CATALOGS kept, so that agents reporting made-up catalogs cannot grow it."""
        key = (reported.get("hash"), tuple(reported.get("types") or ()))
        shared = self._catalogs.get(key)
        if shared is None:
            if len(self._catalogs) >= MAX_CATALOGS:
                return reported
            shared = self._catalogs[key] = reported
        return shared

    def compare_catalog(self, hello: Any, same_machine: bool) -> catalog_check.CatalogState:
        """A worker's catalog against ours. An agent on this machine runs its jobs with the control
        plane's own plugin and custom-node folders (the job keeps the local paths), so those types
        count as its own whatever its helper, reading its own data folder, saw."""
        reported = hello.catalog
        # The verdict for a catalog shared by many agents is one frozen value, made once.
        key = (id(reported), same_machine, hello.catalog_error)
        cached = self._verdicts.get(key)
        if cached is not None and cached[0] is reported:
            return cached[1]
        state = self._compare_catalog(reported, hello.catalog_error, same_machine)
        if reported is None or any(reported is c for c in self._catalogs.values()):
            self._verdicts[key] = (reported, state)
        return state

    def _compare_catalog(self, reported: dict[str, Any] | None, error: str | None,
                         same_machine: bool) -> catalog_check.CatalogState:
        if reported is not None and same_machine:
            local = {t for t, src in self.runs.registry.sources.items() if src != "builtin"}
            types = set(reported.get("types") or []) | local
            reported = self.own_catalog if types == set(self.own_catalog["types"]) else {**reported,
                                                                                        "types": sorted(types)}
        return catalog_check.compare(self.own_catalog, reported, error)

    async def check_target(self, target: Target, graph: Any, files: Any) -> None:
        name = worker_name(target)
        if name is None:
            return
        rows = {r["name"]: r for r in await self.worker_rows()}
        if name not in rows and not await self.runs.oneshot.names_instance(self.runs, name):
            raise CduiError("unknown_worker", f"no worker named {name!r} is enrolled",
                            hint=f"enrolled workers: {', '.join(rows) or 'none'}; add one with `cdui workers token`")
        if isinstance(graph, dict):
            library = await asyncio.to_thread(self.runs.preset_library)  # reads files: off the event loop
            missing = catalog_check.missing_types(self.catalog_state(name), graph, library,
                                            self.runs.registry.preset_params)
            if missing:
                raise catalog_check.refuse_missing(name, missing)
        conn = self.conns.get(name)
        row = rows.get(name) or rows.get(name.rpartition(".")[0])  # an instance has its credential's mounts
        labels = conn.labels if conn is not None else json.loads(row["labels"] or "{}") if row is not None else {}
        if files is not None and files.reads:
            roots = read_roots_in(labels)
            missing = unreadable(files.reads, roots)
            if missing:
                raise CduiError("path_not_readable", read_roots_message(name, missing, roots),
                                hint="add its folder to CODEFYUI_READ_ROOTS where the worker's agent starts and "
                                     "restart the agent (see docs/remote-workers.md#absolute-dataset-paths)")
        if files is None or not files.uses_files or files.transfer_ok:
            return
        if self.config["CODEFYUI_MOUNT_LABEL"] not in labels:
            raise CduiError("no_mount", no_mount_message(name, files.reason),
                            hint="see docs/remote-workers.md#files-on-workers", status=400)


# The worker manager in the control plane's app (cdui.plane.server.build_app makes it).
WORKERS: web.AppKey[WorkerManager] = web.AppKey("workers")



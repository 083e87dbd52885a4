"""Remote workers on the control plane: enrollment routes, ``/ws/worker``,
remote executors, disconnects, resume and adoption (ENR, CONN, DISC, ROUTE).

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
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from cdui import __version__, enroll, protocol
from cdui.config import machine_id
from cdui.diskfull import DiskFull
from cdui.errors import CduiError, NotFound
from cdui.httpjson import DEFAULT_LIMIT, PUBLIC_LIMIT, read_object
from cdui.placement import no_mount_message
from cdui.runs import RunService, iso
from cdui.appkeys import CLOCK, CONFIG, RUNS, WORKERS
from cdui.loopback import is_loopback
from cdui.store import ACTIVE, TERMINAL

log = logging.getLogger(__name__)
MAX_REJECTED = 50  # names kept in the list of refused connections


@dataclass
class Conn:
    name: str
    ws: web.WebSocketResponse
    hello: protocol.Hello
    address: str
    unencrypted: bool
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    labels: dict[str, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, msg: dict[str, Any]) -> bool:
        if self.ws.closed:
            return False
        try:
            async with self.lock:
                await self.ws.send_str(json.dumps(msg))
            return True
        except (ConnectionError, RuntimeError):
            return False


class RemoteExecutor:
    """A connected worker, as the run queue sees it."""

    def __init__(self, manager: "WorkerManager", conn: Conn) -> None:
        self.manager = manager
        self.conn = conn
        self.name = conn.name
        self.drained = False
        self.disabled = False

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

    async def start(self, run: dict[str, Any], job: dict[str, Any]) -> None:
        if self.conn.hello.machine_id != self.manager.machine_id:
            # Another machine: it resolves paths in its own installation.
            for k in ("layout", "custom_nodes_dir", "plugins_dir"):
                job.pop(k, None)
        if not await self.conn.send(protocol.assign(run["id"], job)):
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent")

    def stop(self, run_id: str, grace: float) -> bool:
        self.manager.runs.spawn(self.conn.send(protocol.stop(run_id)))
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
        self.limiter = enroll.RateLimiter(int(self.config["CODEFYUI_ENROLL_RATE_PER_MIN"]))
        self.closing = False
        self._ended = asyncio.Event()
        self.unstored: set[str] = set()  # workers whose events a full disk kept from being stored

    # -- start: adopt what a killed control plane left -------------------------------
    async def before_dispatch(self) -> None:
        rows = await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE)
        for r in rows:
            if r.get("worker_id") in (None, "local"):
                continue
            if self.grace <= 0:
                await self.runs._finish(r["id"], "interrupted",
                                        "the server restarted and CODEFYUI_WORKER_RESUME_GRACE_S is 0, "
                                        "so worker runs are not adopted")
                continue
            now = time.time()
            self.runs.active[r["id"]] = (r["worker_id"], r.get("slot_device") or "cpu")
            await self.store.update_run(r["id"], status="disconnected", disconnected_at=now, adopted_at=now)
            await self.runs.record_cp(r["id"], "run_warning", {
                "kind": "worker_disconnected", "restart": True,
                "message": f"the server restarted; waiting up to {self.grace:.0f} s for worker {r['worker_id']} "
                           f"to reconnect with the run"})
            self._start_timer(r["id"], adopted=True)

    # -- grace timers -------------------------------------------------------------
    def _start_timer(self, run_id: str, adopted: bool) -> None:
        self._cancel_timer(run_id)
        self.timers[run_id] = self.runs.spawn(self._grace_expiry(run_id, adopted))

    def _cancel_timer(self, run_id: str) -> None:
        t = self.timers.pop(run_id, None)
        if t is not None and t is not asyncio.current_task():
            t.cancel()

    async def _grace_expiry(self, run_id: str, adopted: bool) -> None:
        await asyncio.sleep(self.grace)
        self.timers.pop(run_id, None)
        run = await self.store.get_run(run_id)
        if run is None or run["status"] != "disconnected":
            return
        g = f"{self.grace:g}"
        if adopted:
            msg = f"it did not reconnect with the run within {g} s after this server restarted"
        else:
            msg = f"worker {run['worker_id']} did not reconnect within {g} s (CODEFYUI_WORKER_RESUME_GRACE_S)"
        await self.runs._finish(run_id, "interrupted", msg)

    async def on_terminal(self, run_id: str, status: str) -> None:
        self._cancel_timer(run_id)
        self._ended.set()  # wakes a shutdown waiting for worker runs to end

    # -- connection lifecycle --------------------------------------------------------
    def _reject(self, name: str, reason: str, address: str, cred_hash: str | None = None) -> None:
        now = time.time()
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

    async def ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=protocol.MAX_MESSAGE, heartbeat=None)
        await ws.prepare(request)
        address = request.remote or "?"
        auth = request.headers.get("Authorization", "")
        cred = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        h = enroll.hash_secret(cred) if cred else ""

        async def refuse(code: str, message: str) -> web.WebSocketResponse:
            await ws.send_str(json.dumps(protocol.refused(code, message)))
            await ws.close()
            return ws

        row = await self.store.read(lambda c: c.execute("SELECT * FROM workers WHERE credential_hash=?", (h,)).fetchone()
                                    if h else None)
        if row is None:
            old = await self.store.read(lambda c: c.execute("SELECT * FROM old_credentials WHERE credential_hash=?",
                                                            (h,)).fetchone() if h else None)
            if old is not None:
                what = "was removed" if old["reason"] == "removed" else "was superseded by a reissue"
                self._reject(old["worker"], f"revoked credential ({what})", address, h)
                return await refuse("revoked", f"the credential of worker {old['worker']} {what}; "
                                               f"this agent can no longer connect")
            return await refuse("unknown_credential", "this control plane does not know the agent's credential")
        name = row["name"]
        try:
            first = await ws.receive(timeout=30)
        except asyncio.TimeoutError:
            return await refuse("bad_hello", "no hello within 30 s")
        if first.type != WSMsgType.TEXT:
            return await refuse("bad_hello", "the first message must be a JSON text hello")
        version = protocol.peek_version(first.data)
        if version != __version__:
            msg = f"version mismatch: worker {version or 'unknown'}, control plane {__version__}"
            self._reject(name, msg, address)
            return await refuse("version_mismatch", msg)
        try:
            hello = protocol.parse_agent_message(first.data)
            if not isinstance(hello, protocol.Hello):
                raise protocol.ProtocolError("the first message must be a hello")
        except protocol.ProtocolError as exc:
            self._reject(name, f"bad hello: {exc}", address)
            return await refuse("bad_hello", str(exc))
        if hello.name != name:
            self._reject(hello.name, f"its credential belongs to worker {name}", address)
            return await refuse("credential_mismatch", f"this credential belongs to worker {name}, not {hello.name}")
        existing = self.conns.get(name)
        if existing is not None and not existing.ws.closed:
            self._reject(name, f"worker {name} is already connected from {existing.address}", address)
            return await refuse("name_in_use", f"worker {name} is already connected from {existing.address}; "
                                               f"stop the other agent first")
        labels = dict(hello.labels)
        if hello.machine_id and hello.machine_id == self.machine_id:
            labels[self.config["CODEFYUI_MOUNT_LABEL"]] = str(self.config.layout.data_dir)
        scheme_plain = request.scheme == "http" and not is_loopback(request)
        conn = Conn(name, ws, hello, address, scheme_plain, labels=labels)
        self.conns[name] = conn
        self.rejected.pop(name, None)
        await self.store.write(lambda c: c.execute(
            "UPDATE workers SET version=?, devices=?, labels=?, last_seen=?, address=?, machine_id=? WHERE name=?",
            (hello.version, json.dumps(hello.devices), json.dumps(labels), time.time(), address,
             hello.machine_id, name)))
        log.info("worker %s connected from %s (devices %s)", name, address, ",".join(hello.devices))
        try:
            await self._welcome(conn, row)
            executor = RemoteExecutor(self, conn)
            executor.drained = bool(row["drained"])
            executor.disabled = bool(row["disabled"])
            self.runs.executors[name] = executor
            self.runs.wake()
            watchdog = self.runs.spawn(self._watchdog(conn))
            try:
                await self._serve(conn)
            finally:
                watchdog.cancel()
        finally:
            if self.conns.get(name) is conn:
                self.conns.pop(name, None)
                if self.runs.executors.get(name) is not None and getattr(self.runs.executors[name], "conn", None) is conn:
                    self.runs.executors.pop(name, None)
                await self._worker_gone(name)
            await ws.close()
        return ws

    async def _welcome(self, conn: Conn, row: Any) -> None:
        src = f"worker:{conn.name}"
        held = {r.run_id: r for r in conn.hello.runs}
        answer: dict[str, dict[str, Any]] = {}
        stops = []
        for run_id, h in held.items():
            run = await self.store.get_run(run_id)
            acked = await self.store.source_acked(run_id, src) if run else 0
            if run is None or run.get("worker_id") != conn.name:
                answer[run_id] = {"acked": h.last_seq, "action": "drop"}
                continue
            if run["status"] in TERMINAL:
                answer[run_id] = {"acked": acked, "action": "stop"}
                continue
            answer[run_id] = {"acked": acked, "action": "continue"}
            self._cancel_timer(run_id)
            self.runs.active[run_id] = (conn.name, run.get("slot_device") or "cpu")
            if run["status"] == "disconnected":
                await self.store.update_run(run_id, status="running", disconnected_at=None)
                away = time.time() - (run.get("disconnected_at") or time.time())
                await self.runs.record_cp(run_id, "run_warning", {
                    "kind": "worker_reconnected",
                    "message": f"worker {conn.name} reconnected after {away:.0f} s; resuming from event {acked}"})
            if run["stop_requested"]:
                stops.append(run_id)
        await conn.send(protocol.welcome(__version__, conn.name, self.heartbeat, self.grace, answer))
        for run_id in stops:
            await conn.send(protocol.stop(run_id))
        # Runs this worker should hold but does not: its agent restarted without them.
        active = await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE)
        for r in active:
            if r.get("worker_id") != conn.name or r["id"] in held:
                continue
            self._cancel_timer(r["id"])
            if await self.store.source_acked(r["id"], src) == 0:
                # Not one event of it ever arrived: the assignment was lost in
                # transit (or the agent died before it started the run), so
                # nothing ran that could be lost by running it again.
                await self.runs.requeue(r["id"], f"the run was requeued because its assignment never reached "
                                                 f"worker {conn.name}: it reconnected without the run and had "
                                                 f"sent no event of it")
            else:
                await self.runs._finish(r["id"], "interrupted",
                                        f"worker {conn.name} reconnected without the run (its agent restarted)")

    async def _serve(self, conn: Conn) -> None:
        async for msg in conn.ws:
            conn.last_seen = time.time()
            if msg.type != WSMsgType.TEXT:
                if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                    return
                await conn.send(protocol.error("binary frames are not part of the protocol"))
                continue
            try:
                m = protocol.parse_agent_message(msg.data)
            except protocol.ProtocolError as exc:
                log.warning("worker %s sent a malformed message: %s", conn.name, exc)
                await conn.send(protocol.error(f"malformed message: {exc}"))
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
                    await conn.send(protocol.error("hello was already received"))
            except DiskFull:
                pass  # the store reported the full disk once; a heartbeat's last_seen waits for room
            except Exception:  # one bad message must not end the connection
                log.exception("handling a message from worker %s failed", conn.name)
                await conn.send(protocol.error("the control plane failed to handle that message; see its log"))

    async def _watchdog(self, conn: Conn) -> None:
        while not conn.ws.closed:
            await asyncio.sleep(self.heartbeat)
            if time.time() - conn.last_seen > 3 * self.heartbeat:
                log.warning("worker %s missed 3 heartbeats; treating it as disconnected", conn.name)
                await conn.ws.close()
                return

    async def _events(self, conn: Conn, m: protocol.Events) -> None:
        run = await self.store.get_run(m.run_id)
        if run is None or run.get("worker_id") != conn.name:
            await conn.send(protocol.ack(m.run_id, max((e["src_seq"] for e in m.events), default=0)))
            return
        if run["status"] in TERMINAL:
            # Ended here while the worker was away: keep the log as it is, keep its real ending.
            for e in m.events:
                d = e.get("data") or {}
                if e["kind"] == "status" and d.get("status") in TERMINAL and not run.get("late_result"):
                    late = {"status": d["status"], "error": d.get("error"), "worker_id": conn.name,
                            "at": iso(e.get("at") or time.time())}
                    facts = dict(run.get("execution_facts") or {})
                    facts["late_result"] = late
                    await self.store.update_run(m.run_id, late_result=late, execution_facts=facts)
                    run["late_result"] = late
            await conn.send(protocol.ack(m.run_id, max((e["src_seq"] for e in m.events), default=0)))
            return
        try:
            acked = await self.runs.record_events(m.run_id, f"worker:{conn.name}", m.events)
        except DiskFull as err:
            # No ack: the agent keeps the events in its spool. Once there is room the
            # connection is renewed (see on_disk_recovered) and it replays them.
            if conn.name not in self.unstored:
                log.error("worker %s: events of run %s not stored: %s", conn.name, m.run_id, err.message)
                await conn.send(protocol.error(f"{err.message}; your events are not acknowledged: keep them in the "
                                                    f"spool, they are asked for again once there is room"))
            self.unstored.add(conn.name)
            return
        await conn.send(protocol.ack(m.run_id, acked))

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
        for run_id, (ex, _) in list(self.runs.active.items()):
            if ex != name:
                continue
            if self.closing:
                # Nobody would be left to wait for its return: the server is stopping.
                await self.runs._finish(run_id, "interrupted",
                                        f"the server was stopping and worker {name} disconnected before the run "
                                        f"stopped")
                continue
            if self.grace <= 0:
                await self.runs._finish(run_id, "interrupted",
                                        f"worker {name} disconnected and CODEFYUI_WORKER_RESUME_GRACE_S is 0")
                continue
            run = await self.store.get_run(run_id)
            if run is None or run["status"] != "running":
                continue
            now = time.time()
            await self.store.update_run(run_id, status="disconnected", disconnected_at=now)
            await self.runs.record_cp(run_id, "run_warning", {
                "kind": "worker_disconnected",
                "message": f"worker {name} disconnected; the run keeps its slot for up to {self.grace:g} s"})
            self._start_timer(run_id, adopted=False)

    # -- graceful shutdown (DISC-20, DISC-21) -------------------------------------------
    async def on_shutdown(self) -> None:
        """Ask every worker run to stop and wait, up to the grace, for each worker's own ending.

        This runs while the server still reads every socket (see
        ``server._run_until_signal``), so a worker that stops its run at once
        has its final events stored and the run ends as it really did."""
        self.closing = True
        grace = float(self.config["CODEFYUI_SHUTDOWN_GRACE_S"])
        for run_id, (name, _) in list(self.runs.active.items()):
            if name == "local":
                continue
            conn = self.conns.get(name)
            if conn is not None and not conn.ws.closed:
                await conn.send(protocol.stop(run_id))
            else:
                await self.runs._finish(run_id, "interrupted",
                                        "the server stopped while the run's worker was disconnected")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace + 5
        while any(ex != "local" for ex, _ in self.runs.active.values()):
            self._ended.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._ended.wait(), remaining)
            except asyncio.TimeoutError:
                break
        for run_id, (name, _) in list(self.runs.active.items()):
            if name != "local":
                await self.runs._finish(run_id, "interrupted",
                                        f"the server stopped and the run did not stop within {grace:g} s")
        await self.close()

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

    async def list_workers(self, request: web.Request) -> web.Response:
        rows = await self.worker_rows()
        out = []
        for r in rows:
            conn = self.conns.get(r["name"])
            online = conn is not None and not conn.ws.closed
            devices = json.loads(r["devices"] or "[]") if not online else conn.hello.devices
            runs_here = [rid for rid, (ex, _) in self.runs.active.items() if ex == r["name"]]
            used: dict[str, int] = {}
            for rid, (ex, dev) in self.runs.active.items():
                if ex == r["name"]:
                    used[dev] = used.get(dev, 0) + 1
            status = "disabled" if r["disabled"] else ("draining" if r["drained"] and online else
                                                        ("online" if online else "offline"))
            out.append({
                "name": r["name"], "status": status, "online": online, "version": r["version"],
                "drained": bool(r["drained"]), "disabled": bool(r["disabled"]),
                "devices": [{"device": d, "slots": self.runs.caps.slots(r["name"], d), "in_use": used.get(d, 0)}
                            for d in devices],
                "runs": runs_here, "last_seen": iso(conn.last_seen if online else r["last_seen"]),
                "address": conn.address if online else r["address"],
                "labels": conn.labels if online else json.loads(r["labels"] or "{}"),
                "unencrypted": bool(conn.unencrypted) if online else False,
                "same_machine": (r["machine_id"] == self.machine_id),
                "connected_at": iso(conn.connected_at) if online else None,
            })
        return web.json_response({"workers": out, "rejected": sorted(self.rejected.values(), key=lambda x: x["at"])})

    async def create_token(self, request: web.Request) -> web.Response:
        body = await read_object(request, DEFAULT_LIMIT)
        ttl, uses = enroll.check_token_request(body.get("ttl_s", 86400), body.get("uses", 1))
        worker = body.get("worker")
        if worker is not None:
            enroll.check_name(worker)
            exists = await self.store.read(lambda c: c.execute("SELECT 1 FROM workers WHERE name=?", (worker,)).fetchone())
            if not exists:
                raise NotFound("worker", worker, hint="a reissue token is for an enrolled worker; list them with "
                                                      "`cdui workers list`")
        now = time.time()
        tok = await self.store.write(lambda c: enroll.issue_token(c, ttl, uses, worker, now))
        return web.json_response(self._token_answer(request, tok), status=201)

    def _token_answer(self, request: web.Request, tok: dict[str, Any]) -> dict[str, Any]:
        control = f"{request.scheme}://{request.host}"
        cmd = f"cdui agent start --control {control} --token {tok['token']}"
        if tok.get("worker"):
            cmd += f" --name {tok['worker']}"
        out = {"token": tok["token"], "id": tok["id"], "expires_at": iso(tok["expires_at"]), "uses": tok["uses"],
               "worker": tok.get("worker"), "command": cmd}
        host = request.host.rsplit(":", 1)[0].strip("[]")
        if host in ("127.0.0.1", "localhost", "::1"):
            # ENR-06: a loopback address reaches this machine only.
            others = _own_addresses()
            out["note"] = ("this command uses a loopback address, which works only on this machine; for another "
                           "machine start the server with --host 0.0.0.0 and give the agent an address it can reach"
                           + (f", e.g. {', '.join(others)}" if others else ""))
            out["other_addresses"] = others
        return out

    async def list_tokens(self, request: web.Request) -> web.Response:
        rows = await self.store.read(lambda c: [dict(r) for r in c.execute(
            "SELECT id, uses_left, uses_total, expires_at, worker, revoked, created_at FROM enroll_tokens "
            "WHERE revoked=0 ORDER BY created_at")])
        now = time.time()
        for r in rows:
            r["expired"] = r["expires_at"] <= now
            r["used_up"] = r["uses_left"] <= 0
            r["expires_at"] = iso(r["expires_at"])
            r["created_at"] = iso(r["created_at"])
        return web.json_response(rows)

    async def delete_token(self, request: web.Request) -> web.Response:
        tid = request.match_info["token_id"]
        n = await self.store.write(lambda c: c.execute("UPDATE enroll_tokens SET revoked=1 WHERE id=?", (tid,)).rowcount)
        if not n:
            raise NotFound("enrollment token", tid)
        return web.json_response({"revoked": tid})

    async def enroll_route(self, request: web.Request) -> web.Response:
        address = request.remote or "?"
        wait = self.limiter.blocked(address)
        if wait is not None:
            raise CduiError("rate_limited", f"too many failed enrollment attempts from {address}",
                            hint=f"try again in {max(wait, 1):.0f} s", status=429)
        try:
            res = await self._enroll(request)
        except CduiError:
            # Only failures count: agents sharing an address must not lock each other out.
            self.limiter.failure(address)
            raise
        log.info("worker %s enrolled from %s", res["worker"], address)
        return web.json_response({"worker": res["worker"], "credential": res["credential"],
                                  "version": __version__}, status=201)

    async def _enroll(self, request: web.Request) -> dict[str, Any]:
        # Anyone on the network reaches this route: a small body, bounded fields.
        body = await read_object(request, PUBLIC_LIMIT)
        devices = body.get("devices") or []
        if (not isinstance(devices, list) or len(devices) > protocol.MAX_SMALL_LIST
                or not all(isinstance(d, str) and 0 < len(d) <= protocol.MAX_NAME for d in devices)):
            raise CduiError("bad_request", f"devices={str(devices)[:200]!r} must be a list of at most "
                                           f"{protocol.MAX_SMALL_LIST} device names")
        version = body.get("version")
        if version is not None and version != __version__:
            raise CduiError("version_mismatch", f"version mismatch: worker {str(version)[:64]}, "
                                                f"control plane {__version__}",
                            hint=f"install cdui {__version__} on the worker", status=400)
        machine = body.get("machine_id") or ""
        if not isinstance(machine, str) or len(machine) > protocol.MAX_NAME:
            raise CduiError("bad_request", f"machine_id={str(machine)[:80]!r} must be a string of at most "
                                           f"{protocol.MAX_NAME} characters")
        now = time.time()
        return await self.store.write(lambda c: enroll.enroll(c, str(body.get("token", "")), body.get("name"),
                                                              devices, machine, now))

    async def _worker_or_404(self, name: str) -> dict[str, Any]:
        row = await self.store.read(lambda c: c.execute("SELECT * FROM workers WHERE name=?", (name,)).fetchone())
        if row is None:
            raise NotFound("worker", name, hint="list workers with `cdui workers list`")
        return dict(row)

    async def set_drain(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._worker_or_404(name)
        drain = request.path.endswith("/drain")
        await self.store.write(lambda c: c.execute("UPDATE workers SET drained=? WHERE name=?", (int(drain), name)))
        ex = self.runs.executors.get(name)
        if isinstance(ex, RemoteExecutor):
            ex.drained = drain
        self.runs.wake()
        return web.json_response({"name": name, "drained": drain})

    async def reissue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._worker_or_404(name)
        body = await read_object(request, DEFAULT_LIMIT)
        ttl, _ = enroll.check_token_request(body.get("ttl_s", 86400), 1)
        now = time.time()
        tok = await self.store.write(lambda c: enroll.issue_token(c, ttl, 1, name, now))
        return web.json_response(self._token_answer(request, tok), status=201)

    async def remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        row = await self._worker_or_404(name)
        now = time.time()

        def fn(c: Any) -> None:
            if row["credential_hash"]:
                c.execute("INSERT OR REPLACE INTO old_credentials (credential_hash, worker, reason, at) VALUES (?,?,?,?)",
                          (row["credential_hash"], name, "removed", now))
            c.execute("DELETE FROM workers WHERE name=?", (name,))
            c.execute("UPDATE enroll_tokens SET revoked=1 WHERE worker=?", (name,))
        await self.store.write(fn)
        conn = self.conns.pop(name, None)
        self.runs.executors.pop(name, None)
        if conn is not None:
            await conn.send(protocol.revoked(f"worker {name} was removed from the control plane; its credential "
                                             f"is revoked"))
            await conn.ws.close()
        for run_id, (ex, _) in list(self.runs.active.items()):
            if ex == name:
                await self.runs._finish(run_id, "interrupted", f"worker {name} was removed")
        for r in await asyncio.to_thread(self.store.runs_in_status_sync, {"queued"}):
            if r["target"] == {"worker": name}:
                await self.runs._finish(r["id"], "failed", f"worker {name} was removed before the run started")
        for r in await asyncio.to_thread(self.store.runs_in_status_sync, ACTIVE):
            if r.get("worker_id") == name:
                await self.runs._finish(r["id"], "interrupted", f"worker {name} was removed")
        return web.json_response({"removed": name})

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
        if files is None or not files.uses_files or files.transfer_ok:
            return
        conn = self.conns.get(name)
        labels = conn.labels if conn is not None else json.loads(rows[name]["labels"] or "{}")
        if self.config["CODEFYUI_MOUNT_LABEL"] not in labels:
            raise CduiError("no_mount", no_mount_message(name, files.reason),
                            hint="see docs/remote-workers.md#files-on-workers", status=400)


def _own_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses, as far as its host name tells."""
    import socket
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({i[4][0] for i in infos if not i[4][0].startswith("127.")})


def setup(app: web.Application) -> None:
    """Add the worker routes; the manager is ``app[WORKERS]`` (made by ``build_app``)."""
    m = app[WORKERS]
    r = app.router
    r.add_get("/api/workers", m.list_workers)
    r.add_post("/api/workers/tokens", m.create_token)
    r.add_get("/api/workers/tokens", m.list_tokens)
    r.add_delete("/api/workers/tokens/{token_id}", m.delete_token)
    r.add_post("/api/workers/enroll", m.enroll_route)
    r.add_get("/ws/worker", m.ws_handler)
    r.add_delete("/api/workers/{name}", m.remove)
    r.add_post("/api/workers/{name}/drain", m.set_drain)
    r.add_post("/api/workers/{name}/undrain", m.set_drain)
    r.add_post("/api/workers/{name}/reissue", m.reissue)

"""The worker agent: ``cdui agent start``.

It connects outbound to the control plane's ``/ws/worker`` (the worker opens
no port), says hello, receives runs, runs each in its own subprocess through
the one launcher (:mod:`cdui.run.runner`), and streams their events back.

Durability: every event goes to the run's spool (:mod:`cdui.agent.spool`) before
it is sent and leaves it only when acknowledged, so a dropped connection or a
restarted control plane loses nothing: on reconnect the agent replays, in
order, what was not acknowledged.

Reconnects back off from 1 s doubling to 60 s with +-20 % jitter, reset after a
connection that stayed up for a minute (NOTES.md). Which failures end the agent
(with which exit code) and which are retried is one pure decision,
:func:`cdui.agent.connect_policy.decide`.

The agent is a component its caller assembles: its clock (every backoff,
heartbeat and grace wait sleeps on it), the event that asks it to stop (what
SIGTERM sets under ``cdui agent start``: :func:`serve`), its config and its
connector (how it opens the HTTP session of ``/ws/worker`` and file transfers)
come from outside, with the real ones as defaults, so tests run the real agent
in-process against an in-process control plane on one fake clock
(``tests/inproc/test_agent.py``).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import aiohttp

from cdui import __version__
from cdui.agent import connect_policy as policy
from cdui.agent import gpu_usage, self_update
from cdui.agent.app_serving import AgentApps
from cdui.agent.oneshot_agent import OneShot
from cdui.agent.run_files import run_files
from cdui.agent.spool import RunSpool, base_dir, live_run_ids, spooled_runs
from cdui.core import envs, exit_codes, logfile
from cdui.core.atomic import atomic_write
from cdui.core.backoff import backoff_delays
from cdui.core.clock import Clock, SystemClock, wait_event
from cdui.core.collector import collect_young_less_often
from cdui.core.config import load
from cdui.core.errors import CduiError
from cdui.core.layout import read_roots_label
from cdui.core.trust import AiohttpPinMismatch, Trust, presented_fingerprint, untrusted_message
from cdui.nodes import packs
from cdui.run import catalog, outputs, runner
from cdui.run.spare import SparePool
from cdui.wire import devicesets, protocol, same_machine
from cdui.wire.file_backend import FileBackend
from cdui.wire.job import Job
from cdui.wire.s3 import agent_capabilities

_kind = itemgetter("kind")
log = logging.getLogger("cdui.agent.agent")

REPLAY_CHUNK = 500  # events per message when replaying after a reconnect
# After SIGTERM the last events get this long to be acknowledged, twice at most: over the
# live connection, then over a fresh one if that one dropped.
ACK_WAIT_S = 15.0
# The longest a SIGTERM'd agent takes to exit, final uploads of transfer runs aside: runs
# get their stop grace, then the two acknowledgement waits. Service managers wait longer.
STOP_BUDGET_S = runner.STOP_GRACE_S + 2 * ACK_WAIT_S
# After the stop budget, the final uploads of transfer runs get this much.
FINAL_UPLOADS_S = 30.0


def stop_wait_s(outputs_write_timeout_s: float) -> float:
    """How long a SIGTERMed agent may take to end: the stop budget, the final uploads, and a
    run's recorded-output writes (``CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S``). ``cdui agent stop``
    waits this long, and the systemd unit's ``TimeoutStopSec`` must be longer (a test checks both)."""
    return STOP_BUDGET_S + FINAL_UPLOADS_S + outputs_write_timeout_s


class Refused(Exception):
    def __init__(self, code: str, message: str, update: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.update = update  # a version refusal that says the owner lets this worker follow the update


def credential_key(control: str) -> str:
    """``<host>-<port>`` of a control plane's address: names its credential file and its spool."""
    u = urlsplit(control)
    host = u.hostname or "localhost"
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"{host}-{port}"


def credential_path(user_data: Path, control: str) -> Path:
    return user_data / "agent" / f"{credential_key(control)}.token"


def watch_route(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> bool:
    """Let the kernel end the connection once data sent on it stays unacknowledged for ``seconds``
    (TCP_USER_TIMEOUT); False where it cannot (not a TCP socket, or the system has no such option)."""
    sock = ws.get_extra_info("socket")
    opt = getattr(socket, "TCP_USER_TIMEOUT", None)
    if opt is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, opt, max(1000, int(seconds * 1000)))
    except OSError:
        return False
    return True


def ws_url(control: str) -> str:
    u = urlsplit(control.rstrip("/"))
    scheme = "wss" if u.scheme == "https" else "ws"
    return f"{scheme}://{u.netloc}{u.path}/ws/worker"


class AgentRun:
    def __init__(self, run_id: str, spool: RunSpool) -> None:
        self.run_id = run_id
        self.spool = spool
        self.handle: runner.RunHandle | None = None
        self.finished = spool.read_state().get("finished", False)
        self.lock = asyncio.Lock()
        self.files: Any = None  # its cdui.wire.file_backend.FileBackend, once assigned

    @property
    def running(self) -> bool:
        return self.handle is not None and not self.handle.done


async def outputs_answer(store_root: Path, msg: protocol.OutputsRequest) -> protocol.OutputsAnswer:
    """The answer to the control plane's ``outputs_request``, read from this agent's own store."""
    try:
        if msg.node_id is None:
            nodes = await asyncio.to_thread(outputs.list_nodes, store_root, msg.run_id)
            if nodes is None:
                return protocol.OutputsAnswer(msg.request_id, msg.run_id, None,
                                              error=f"no recorded outputs of run {msg.run_id} are kept here "
                                                    "(never recorded, or dropped to stay within "
                                                    "CODEFYUI_RUN_OUTPUT_STORE_MAX_MB)")
            return protocol.OutputsAnswer(msg.request_id, msg.run_id, None, nodes=nodes)
        summary = await asyncio.to_thread(outputs.read_node, store_root, msg.run_id, msg.node_id)
        return protocol.OutputsAnswer(msg.request_id, msg.run_id, msg.node_id, summary=summary)
    except (OSError, ValueError) as exc:
        return protocol.OutputsAnswer(msg.request_id, msg.run_id, msg.node_id,
                                      error=f"reading the recorded outputs failed: {type(exc).__name__}: {exc}")


async def raw_answer(store_root: Path, msg: protocol.RawRequest) -> protocol.RawAnswer:
    """One chunk of a recorded raw tensor file, for the control plane's ``raw_request``: the file is
    found in this agent's own store from the run id, node id and port (never a path), and a file
    over the download bound is refused whole before a byte is sent."""
    def err(code: str, text: str) -> protocol.RawAnswer:
        return protocol.RawAnswer(msg.request_id, msg.chunk, error=text, code=code)

    try:
        got = await asyncio.to_thread(outputs.read_raw_chunk, store_root, msg.run_id, msg.node_id, msg.port,
                                      msg.chunk, protocol.RAW_CHUNK_BYTES)
    except outputs.RawNotKept as exc:
        return err("not_kept", str(exc))
    except outputs.RawTooLarge as exc:
        return protocol.RawAnswer(msg.request_id, msg.chunk, size=exc.size, error=str(exc), code="too_large")
    except outputs.RawChunkOutOfRange as exc:
        return err("bad_chunk", str(exc))
    except OSError as exc:
        return err("not_kept", f"the raw tensor of output {msg.port!r} of node {msg.node_id!r} is gone: "
                               f"{exc.strerror or exc}")
    except ValueError as exc:
        return err("failed", f"reading the raw tensor failed: {exc}")
    return protocol.RawAnswer(msg.request_id, msg.chunk, got.size, got.sha256,
                              base64.b64encode(got.data).decode("ascii"))


class Agent:
    def __init__(self, control: str, credential: str, name: str, devices: list[str], user_data: Path,
                 machine_id: str, labels: Callable[[], dict[str, str]] | None = None,
                 status_file: Path | None = None, config: Any = None, trust: Trust | None = None,
                 on_connected: Callable[[], None] | None = None, one_shot: OneShot | None = None,
                 uds: str | None = None, clock: Clock | None = None, stop: asyncio.Event | None = None,
                 connector: Callable[[], aiohttp.BaseConnector] | None = None,
                 catalog_probe: Callable[[Path | None, Path | None], catalog.Probe] | None = None) -> None:
        self.config = config if config is not None else load()
        self.clock: Clock = clock or SystemClock()
        # Set from outside (SIGTERM, Ctrl-C, a test): the agent stops as SIGTERM says (request_shutdown).
        self.stop = stop or asyncio.Event()
        # One certificate check for enrollment, /ws/worker and every file transfer (cdui/core/trust.py).
        self.trust = trust or Trust()
        self.on_connected = on_connected
        self._untrusted_seen = False
        self.control = control.rstrip("/")
        self.credential = credential
        self.name = name
        self.devices = devices
        self.gpu_sampler = gpu_usage.Sampler(devices)
        self.user_data = user_data
        self.machine_id = machine_id
        self.labels = labels or (lambda: {})
        self.status_file = status_file
        # An SSH worker's agent reaches the control plane through this Unix socket (the tunnel's far end).
        self.uds = uds
        self._connector = connector
        # Whether a dead route is left to the kernel (see _connect_once): over the agent's own TCP connector
        # where the system has TCP_USER_TIMEOUT (Linux); else, and after it once failed, WebSocket pings.
        self._kernel_watch = uds is None and connector is None and hasattr(socket, "TCP_USER_TIMEOUT")
        # How it learns its node catalog: the helper subprocess (a plugin that crashes at import
        # must not take the agent with it); a test in one process may read it in-process.
        self._catalog_probe = catalog_probe or (
            lambda custom, plugins: catalog.probe(custom, plugins, plugin_store=self.config.plugin_store))
        # Its every connection says it is this same agent (protocol.Hello.agent_id).
        self.agent_id = secrets.token_hex(8)
        # This credential's own spool: other control planes' agents may share the user data folder.
        # The caller holds its lock (cdui.agent.spool.SpoolLock) before anything in it is read.
        self.spool_root = base_dir(user_data) / credential_key(self.control)
        self.runs: dict[str, AgentRun] = {}
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.heartbeat_s = 10.0
        self.grace_s = 300.0
        self.stopping = False
        self._stop_event = asyncio.Event()  # ends a backoff wait: the agent is leaving
        self._acked = asyncio.Event()  # an acknowledgement arrived or the connection ended
        self.exit_code = exit_codes.OK
        # Set once an opted-in agent installed the control plane's update and its runs ended: the caller
        # replaces the process with this interpreter's agent (cdui/agent/self_update.py).
        self.reexec: Path | None = None
        self.install_root = envs.launcher_root()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._early_stops: set[str] = set()
        self.one_shot = one_shot
        # Runs forked by a zygote from the first run on; a one-shot agent has no second run (cdui/run/spare.py).
        self.spares = SparePool(bool(self.config["CODEFYUI_RUN_WARM_SPARE"]) and one_shot is None)
        self.probe = catalog.Probe(error="the node catalog helper has not run yet")
        # Published apps served here (docs/apps.md): their warm processes, started by the same launcher.
        self.apps = AgentApps(self, self.spares, self._beat_soon)
        self._beat_now = asyncio.Event()  # a heartbeat goes now, not at the interval (a serving process changed)
        for run_id in spooled_runs(self.spool_root):
            r = AgentRun(run_id, RunSpool(self.spool_root, run_id))
            self.runs[run_id] = r
            if not r.finished:
                # Its subprocess died with the previous agent. Record its end here, as
                # its recorder would have; the control plane gets it with the replay.
                r.spool.append([{"src_seq": r.spool.last_seq + 1, "kind": "status", "at": self.clock.time(),
                                 "data": {"status": "interrupted",
                                          "error": f"worker {name} reconnected without the run (its agent "
                                                   f"restarted while the run was running)"}}])
                r.finished = True
                r.spool.write_state({"run_id": run_id, "finished": True, "status": "interrupted"})

    # -- status for `cdui agent start` (the parent waits on it) -------------------------
    def _status(self, state: str, message: str = "") -> None:
        if self.status_file is None:
            return
        # atomic_write's temporary name is this process's own: two agents sharing a user data folder
        # must not rename each other's file away (that failure used to drop the live connection).
        try:
            atomic_write(self.status_file, json.dumps({"state": state, "message": message, "pid": os.getpid(),
                                                       "control": self.control, "name": self.name,
                                                       "at": self.clock.time()}))
        except OSError as exc:  # the status file informs `cdui agent start`; it is no reason to disconnect
            log.warning("could not write %s: %s", self.status_file, exc)

    # -- main loop --------------------------------------------------------------------
    async def run(self) -> int:
        """Connect, serve, reconnect until stopped; the exit code (cdui/core/exit_codes.py)."""
        watcher = asyncio.create_task(self._watch_stop())
        try:
            return await self._run()
        finally:
            # Nothing it started outlives it (a one-shot agent's deadline, an answer still being
            # sent): hosted in a longer-lived event loop, as in the in-process tests, they would.
            leftover = [watcher, *self._tasks]
            for t in leftover:
                t.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)

    async def _watch_stop(self) -> None:
        await self.stop.wait()
        self.request_shutdown()

    def _session_connector(self) -> aiohttp.BaseConnector:
        if self._connector is not None:
            return self._connector()
        # An SSH worker's agent reaches the control plane through its tunnel's Unix socket.
        return aiohttp.UnixConnector(path=self.uds) if self.uds else self.trust.connector()

    async def _run(self) -> int:
        await self._probe_catalog()
        delays = backoff_delays()
        down_since = self.clock.monotonic()
        async with aiohttp.ClientSession(connector=self._session_connector()) as session:
            self.session = session
            while not self.stopping:
                up_since = self.clock.monotonic()
                self.trust.reload()  # a next pin added meanwhile (`cdui agent pin --next`) counts now
                failure: policy.Failure | None = None
                try:
                    await self._connect_once(session)
                except Refused as exc:
                    failure = policy.Refusal(exc.code, str(exc), exc.update)
                except AiohttpPinMismatch as exc:
                    failure = policy.PinMismatch(str(exc.error))
                except aiohttp.ClientConnectorCertificateError as exc:
                    failure = policy.Untrusted(await self._untrusted(exc))
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    failure = policy.Unreachable(self.control, str(exc) or type(exc).__name__)
                finally:
                    if self.ws is not None:
                        down_since = self.clock.monotonic()
                    self.ws = None
                    self._acked.set()
                if failure is not None and self._may_update(failure) and await self._update(session):
                    return exit_codes.OK
                if failure is not None:
                    decision = policy.decide(failure, tunnel=bool(self.uds), one_shot_took_run=(
                        None if self.one_shot is None else self.one_shot.taken is not None))
                    if isinstance(decision, policy.Stop):
                        # One line, in the CLI's error shape, on stderr (where the log goes too, so never
                        # twice). Under systemd a version mismatch restarts the agent every 5 s until both
                        # sides match (docs/remote-workers.md#running-the-agent-under-systemd), and each try
                        # adds exactly this line to the journal; the SSH supervisor reads it too.
                        print(decision.line, file=sys.stderr, flush=True)
                        self._status("refused", decision.status)
                        await self._stop_all_runs()
                        if self.one_shot is not None:
                            self.one_shot.exit_code = decision.exit_code
                        return decision.exit_code
                    log.log(decision.level, "%s", decision.log)
                    self._status("connecting", decision.status)
                if self.stopping:
                    break
                if policy.tunnel_gone(bool(self.uds), self.clock.monotonic() - down_since, self.grace_s):
                    log.warning("no SSH tunnel for %.0f s (the resume grace); stopping", self.grace_s)
                    self.stopping = True
                    break
                if policy.reset_backoff(self.clock.monotonic() - up_since):
                    delays = backoff_delays()
                delay = next(delays)
                log.info("reconnecting in %.1f s", delay)
                await wait_event(self.clock, self._stop_event, delay)
            if self.one_shot is None or self.one_shot.exit_code is None:
                await self._drain_on_shutdown(session)
        await self.spares.close()
        if self.one_shot is not None and self.one_shot.exit_code is not None:
            return self.one_shot.exit_code
        return self.exit_code

    def _may_update(self, failure: policy.Failure) -> bool:
        return (isinstance(failure, policy.Refusal) and failure.code == "version_mismatch"
                and policy.follows_update(self.config["CODEFYUI_AGENT_AUTO_UPDATE"], failure.update)
                and self.one_shot is None)

    async def _update(self, session: aiohttp.ClientSession) -> bool:
        """Refused for its version: install the control plane's bundle, wait for this agent's runs to end,
        and leave :attr:`reexec` set. False (the running version untouched, or a stop asked for meanwhile)
        when it did not come to that; the refusal then ends the agent as usual."""
        self._status("updating", "refused for its version: installing the control plane's update bundle")
        try:
            python = await self_update.install_offered(session, self.control, self.credential, self.user_data,
                                                       self.install_root, __version__)
        except (CduiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.error("this agent could not update itself and keeps cdui %s: %s", __version__, exc)
            return False
        running = sorted(r.run_id for r in self.runs.values() if r.running)
        if running:
            log.info("waiting for %d runs to end before restarting on the new version: %s", len(running),
                     ", ".join(running))
        while any(r.running for r in self.runs.values()) and not self.stopping:
            await wait_event(self.clock, self._stop_event, 1.0)
        if self.stopping:
            return False  # installed and switched: the next start runs the new version
        await self._stop_all_runs()  # none is left; the warm spare goes
        self.reexec = python
        return True

    def become_updated(self) -> NoReturn:
        """After :meth:`run` returned with :attr:`reexec` set (and the process let go of its pidfile and spool):
        replace this process with the updated agent."""
        assert self.reexec is not None
        self_update.reexec(self.reexec, self.install_root)

    async def _untrusted(self, exc: aiohttp.ClientConnectorCertificateError) -> str:
        """What an untrusted certificate is reported as; the first report names the presented key."""
        reason = getattr(exc.certificate_error, "verify_message", None) or exc.certificate_error
        presented = None
        if not self._untrusted_seen:  # the first report names the key, so it can be compared and pinned
            self._untrusted_seen = True
            presented = await asyncio.to_thread(presented_fingerprint, exc.host, exc.port or 443)
        return untrusted_message(self.control, reason, presented)

    async def _probe_catalog(self) -> None:
        """The node catalog and fingerprint, once at start: a plugin installed later counts after a restart."""
        self.probe = await asyncio.to_thread(self._catalog_probe, self.config.custom_nodes_dir,
                                             self.config.plugins_dir)
        if self.probe.error:
            log.error("no node catalog is reported to the control plane: %s; it sends this worker no `any` runs "
                      "(fix the cause and restart the agent)", self.probe.error)
        else:
            assert self.probe.catalog is not None and self.probe.fingerprint is not None
            log.info("node catalog: %d types (%s); environment: %s", len(self.probe.catalog["types"]),
                     self.probe.catalog["hash"][:19], catalog.summary(self.probe.fingerprint))
            # Runs describe the devices as this agent sees them, before their own narrowing.
            os.environ[catalog.SEEN_ACCELERATOR_ENV] = str(self.probe.fingerprint.get("accelerator", ""))

    async def _connect_once(self, session: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.credential}"}
        # A connection that went silent (a dead route, not a closed socket) is noticed and replaced. Over TCP
        # on Linux the kernel notices it: the heartbeat this agent sends every interval must be acknowledged
        # within three intervals (TCP_USER_TIMEOUT), as the control plane drops an agent silent for three
        # heartbeats, and the control plane has nothing to answer. Elsewhere (the SSH tunnel's Unix socket,
        # other systems) a WebSocket ping goes every heartbeat interval and its answer is awaited: with
        # thousands of agents, answering those pings cost the control plane a quarter of its heartbeat CPU.
        kernel = self._kernel_watch
        async with session.ws_connect(ws_url(self.control), headers=headers,
                                      heartbeat=None if kernel else max(self.heartbeat_s, 1.0),
                                      max_msg_size=protocol.MAX_MESSAGE,
                                      timeout=aiohttp.ClientWSTimeout(ws_close=10)) as ws:
            if kernel and not watch_route(ws, 3 * self.heartbeat_s):
                self._kernel_watch = False
                raise aiohttp.ClientError("the connection's dead-route timeout (TCP_USER_TIMEOUT) could not be set; "
                                          "reconnecting with WebSocket pings instead")
            await ws.send_str(self._hello())
            first = await ws.receive(timeout=60)
            probe = self._probe(first.data) if first.type == aiohttp.WSMsgType.TEXT else None
            if probe is not None:
                # Before the welcome, when this agent named the control plane's machine id: show whether
                # it really shares the control plane's folders (cdui/wire/same_machine.py).
                found = await asyncio.to_thread(same_machine.answer, probe)
                if found.nonce is None or found.cannot_write:
                    log.info("runs move their files through the control plane: this agent does not share its "
                             "folders (%s)", found.cannot_read or
                             "; ".join(f"{k}: {v}" for k, v in found.cannot_write.items()))
                await ws.send_str(found.to_json())
                first = await ws.receive(timeout=60)
            if first.type != aiohttp.WSMsgType.TEXT:
                raise aiohttp.ClientError(f"connection closed before the welcome ({first.type.name})")
            welcome = self._welcome(first.data)
            if kernel and welcome.heartbeat_s != self.heartbeat_s:
                watch_route(ws, 3 * welcome.heartbeat_s)  # the control plane's interval, from now on
            self.heartbeat_s = welcome.heartbeat_s
            self.grace_s = welcome.resume_grace_s
            self.ws = ws
            if self.stopping:
                # SIGTERM came while connecting: the shutdown found no connection to close, so this
                # one must not be served (it would keep the agent alive with nothing to stop it).
                await ws.close()
                return
            log.info("connected to %s as worker %s (capabilities: %s)", self.control, welcome.worker,
                     ", ".join(agent_capabilities()) or "none")
            self._status("connected")
            if self.on_connected is not None:
                self.on_connected()
            await self._resume(welcome.runs)
            hb = asyncio.create_task(self._heartbeats(ws))
            try:
                async for m in ws:
                    if m.type != aiohttp.WSMsgType.TEXT:
                        break
                    try:
                        msg = protocol.parse_server_message(m.data)
                    except protocol.ProtocolError as exc:
                        log.warning("ignoring a malformed message from the control plane: %s", exc)
                        continue
                    try:
                        await self._handle(msg)
                    except Refused:
                        raise
                    except Exception:  # a message we fail on must not drop the connection
                        log.exception("handling a control-plane message failed")
            finally:
                hb.cancel()
            log.warning("connection to %s closed", self.control)

    def _reported_labels(self) -> dict[str, str]:
        """The mounts, and the folders this machine lets runs read by absolute path (CODEFYUI_READ_ROOTS),
        so that the control plane places a run reading /datasets/... only where it may be read."""
        return {**self.labels(), **read_roots_label(self.config.layout.read_roots)}

    def _tls(self) -> dict[str, str | None] | None:
        """Which pin this connection's certificate matched and the next pin held (shown in the
        workers list, to follow a key rotation); None when not pinned or not over TLS."""
        if self.uds or not self.trust.pinned or urlsplit(self.control).scheme != "https":
            return None
        return {"pin": self.trust.verified, "next": self.trust.next_pin}

    def _hello(self) -> str:
        held = [protocol.HeldRun(r.run_id, r.running, r.spool.last_seq) for r in self.runs.values()]
        o = self.one_shot
        # A one-shot agent names its run: the --run-id it waits for, or the run it took (on a reconnect).
        wanted = (o.taken or o.run_id) if o else None
        return protocol.Hello(__version__, self.name, self.devices, self._reported_labels(), self.machine_id, held,
                              o is not None, o.instance if o else None, agent_capabilities(), wanted,
                              catalog=self.probe.catalog, catalog_error=self.probe.error,
                              fingerprint=self.probe.fingerprint,
                              device_memory=devicesets.memory_report(self.devices, self.probe.cards),
                              agent_id=self.agent_id, tls=self._tls()).to_json()

    @staticmethod
    def _probe(raw: str) -> protocol.Probe | None:
        try:
            msg = protocol.parse_server_message(raw)
        except protocol.ProtocolError:
            return None  # reported as the welcome it should have been
        return msg if isinstance(msg, protocol.Probe) else None

    @staticmethod
    def _welcome(raw: str) -> protocol.Welcome:
        """The control plane's first answer: a welcome, or the refusal it raises."""
        try:
            msg = protocol.parse_server_message(raw)
        except protocol.ProtocolError as exc:
            raise aiohttp.ClientError(f"the control plane's first message does not fit the protocol: {exc}") from None
        if isinstance(msg, protocol.Refused):
            raise Refused(msg.code, msg.message, msg.update)
        if not isinstance(msg, protocol.Welcome):
            raise aiohttp.ClientError(f"expected a welcome, got {msg.type!r}")
        return msg

    async def _resume(self, answer: dict[str, protocol.RunAnswer]) -> None:
        for run_id, r in list(self.runs.items()):
            a = answer.get(run_id)
            if a is None:
                continue
            action = a.action
            async with r.lock:
                r.spool.ack(a.acked)
                if action == "drop":
                    if r.handle:
                        r.handle.stop()
                    if not r.running:
                        r.spool.remove()
                        self.runs.pop(run_id, None)
                    continue
                if action == "stop" and r.handle:
                    r.handle.stop()
                await self._replay(run_id, r.spool.unacked())
            self._maybe_forget(r)

    async def _replay(self, run_id: str, pending: list[Any]) -> None:
        """Send a run's unacknowledged events and lines again, in order, in bounded messages (a long outage
        can leave many behind)."""
        events: list[dict[str, Any]] = []
        for item in pending:
            if type(item) is protocol.Lines:
                if events:
                    await self._send(protocol.Events(run_id, events))
                    events = []
                await self._send_lines(item)
                continue
            events.append(item)
            if len(events) == REPLAY_CHUNK:
                await self._send(protocol.Events(run_id, events))
                events = []
        if events:
            await self._send(protocol.Events(run_id, events))

    def _beat_soon(self) -> None:
        self._beat_now.set()

    async def _heartbeats(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while not ws.closed:
            await wait_event(self.clock, self._beat_now, self.heartbeat_s)
            self._beat_now.clear()
            self.trust.reload()
            # The CUDA cards' use, at most once per GPU_REPORT_S (never on a machine without cards).
            gpu = (await asyncio.to_thread(gpu_usage.read, self.devices)
                   if self.gpu_sampler.due(self.clock.monotonic()) else None)
            try:
                await ws.send_str(protocol.Heartbeat([r.run_id for r in self.runs.values() if r.running],
                                                     self._reported_labels(), self._tls(), gpu,
                                                     self.apps.report()).to_json())
            except (ConnectionError, RuntimeError):
                return

    async def _send(self, msg: protocol.Events, encoded: list[str] | None = None) -> bool:
        """Send events (``encoded``: each one's JSON as the spool wrote it, sent as is)."""
        ws = self.ws
        if ws is None or ws.closed:
            return False
        try:
            # Within the control plane's message limit, however big the batch.
            for text in protocol.encode_events(msg.run_id, msg.events, encoded=encoded):
                await ws.send_str(text)
            return True
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            return False

    async def _send_lines(self, block: protocol.Lines) -> bool:
        """Send a block of a run's lines as written (one binary frame)."""
        ws = self.ws
        if ws is None or ws.closed:
            return False
        try:
            await ws.send_bytes(block.frame())
            return True
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            return False

    async def _handle(self, msg: protocol.ServerMessage) -> None:
        if isinstance(msg, protocol.Assign):
            if self.one_shot is not None and (self.stopping or not self.one_shot.accept(msg.run_id)):
                log.warning("run %s assigned, but this one-shot agent takes no other run; ignoring it", msg.run_id)
                return
            # In the background: fetching inputs can take long, and stops and acks must get through meanwhile.
            task = asyncio.create_task(self._start_run(msg.run_id, msg.job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(msg, protocol.Ack):
            r = self.runs.get(msg.run_id)
            if r is not None:
                r.spool.ack(msg.acked)
                self._maybe_forget(r)
            self._acked.set()
        elif isinstance(msg, protocol.Stop):
            r = self.runs.get(msg.run_id)
            if r is not None and r.handle is not None:
                log.info("run %s: stop requested by the control plane", r.run_id)
                r.handle.stop()
            else:  # its assignment is still being set up: stop it as soon as it exists
                self._early_stops.add(msg.run_id)
        elif isinstance(msg, protocol.S3CredentialsMessage):
            r = self.runs.get(msg.run_id)
            if r is not None and r.files is not None:
                r.files.new_credentials(msg.credentials)
        elif isinstance(msg, (protocol.OutputsRequest, protocol.RawRequest)):
            task = asyncio.create_task(self._answer_outputs(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(msg, protocol.LogRequest):
            # From memory, never a file: the control plane names no path, and the answer is bounded.
            lines, first, last = logfile.RING.since(msg.after, msg.lines, protocol.LOG_ANSWER_CHARS)
            await self._send_answer(protocol.LogAnswer(msg.request_id, lines, first, last))
        elif isinstance(msg, protocol.PluginPush):
            task = asyncio.create_task(self._install_pushed(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(msg, protocol.AppInvoke):
            self._spawn(self._serve_app(msg))
        elif isinstance(msg, protocol.AppRetire):
            self._spawn(self.apps.retire(msg))
        elif isinstance(msg, protocol.AppReleaseIdle):
            self._spawn(self.apps.release_idle(msg))
        elif isinstance(msg, protocol.Revoked):
            raise Refused("revoked", msg.message)
        elif isinstance(msg, protocol.Error):
            log.warning("the control plane reported: %s", msg.message)
        else:  # a welcome or refusal comes first or not at all
            log.warning("unexpected %r message from the control plane after the welcome", msg.type)

    async def _install_pushed(self, msg: protocol.PluginPush) -> None:
        """A pack the control plane pushed: installed only where CODEFYUI_AGENT_ACCEPT_PLUGINS=1 (it is new code
        running here); then the catalog is read again and the agent reconnects, so its hello reports it."""
        ok = False
        if not self.config["CODEFYUI_AGENT_ACCEPT_PLUGINS"]:
            text = ("this agent does not accept pushed plugin packs: start it with CODEFYUI_AGENT_ACCEPT_PLUGINS=1, "
                    f"or install the pack there with `cdui plugin install {msg.pack_id}`")
        else:
            try:
                data = base64.b64decode(msg.data, validate=True)
                done = await asyncio.to_thread(packs.install_pushed, msg.pack_id, msg.version, msg.pin,
                                               msg.tree_sha256, data, self.config.plugin_store)
                ok, text = True, f"installed {msg.pack_id} {done.entry['version']}; reconnecting with its new catalog"
                log.info("plugin pack %s %s pushed by the control plane: installed", msg.pack_id, msg.version)
            except (packs.PackError, ValueError, OSError) as exc:
                text = f"not installed: {exc}"
                log.warning("plugin pack %s pushed by the control plane: %s", msg.pack_id, text)
        ws = self.ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
                await ws.send_str(protocol.PluginPushAnswer(msg.request_id, msg.pack_id, ok, text).to_json())
        if ok:
            await self.reload_catalog()

    async def reload_catalog(self) -> None:
        """Read the node catalog again (a pack was installed: pushed over the connection, or over an SSH worker's
        ssh, whose script sends SIGUSR1) and reconnect, so that the next hello reports it; runs go on meanwhile."""
        await self._probe_catalog()
        ws = self.ws
        if ws is not None and not ws.closed:
            await ws.close()

    async def _serve_app(self, msg: protocol.AppInvoke) -> None:
        if self.stopping:
            answer = protocol.AppAnswer(msg.request_id, error={
                "code": "app_failed", "message": f"worker {self.name} is stopping", "hint": "call again",
                "details": None})
        else:
            answer = await self.apps.invoke(msg)
        await self._send_answer(answer)

    async def _answer_outputs(self, msg: protocol.OutputsRequest | protocol.RawRequest) -> None:
        root = outputs.store_dir(self.user_data)
        answer = await (raw_answer(root, msg) if isinstance(msg, protocol.RawRequest) else outputs_answer(root, msg))
        await self._send_answer(answer)

    async def _send_answer(self, answer: protocol.AgentMessage) -> None:
        ws = self.ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
                await ws.send_str(answer.to_json())

    async def _start_run(self, run_id: str, job: Job) -> None:
        if run_id in self.runs:
            log.warning("run %s assigned twice; ignoring the second assignment", run_id)
            return
        spool = RunSpool(self.spool_root, run_id)
        spool.write_state({"run_id": run_id, "finished": False, "started_at": self.clock.time()})
        r = AgentRun(run_id, spool)
        self.runs[run_id] = r
        files: FileBackend | None = None

        async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
            if "artifact" in map(_kind, events):  # one pass in C: a flood's batches hold none
                for i, ev in enumerate(events):
                    if ev["kind"] == "artifact" and "backend" not in ev["data"] and files is not None:
                        ev["data"] = await files.on_artifact(ev["data"])
                        if texts is not None:
                            texts[i] = None  # its data changed: encoded anew
            if self.one_shot is not None:
                self.one_shot.final_event(events)
            async with r.lock:
                lines = await asyncio.to_thread(r.spool.append, events, texts)
                await self._send(protocol.Events(run_id, events), lines)

        async def lines_sink(block: protocol.Lines) -> None:
            async with r.lock:
                await asyncio.to_thread(r.spool.append_lines, block)
                await self._send_lines(block)

        log_path = self.user_data / "agent-runs" / run_id / "run.log"
        # The events of the run's own lines come with those lines' text: spooled and sent as the run wrote
        # them, not encoded again (about a third of the agent's work per event in a flood). A chunk of lines
        # with nothing in it for the agent to act on, cut or mask is not even decoded: spooled and sent as
        # it is, for the control plane to read (lines_sink; the `lines` frame in docs/api.md).
        handle = runner.RunHandle(run_id, sink, log_path, job.secret_pairs(), on_texts=sink, on_lines=lines_sink)
        r.handle = handle
        if run_id in self._early_stops:
            self._early_stops.discard(run_id)
            handle.stop()
        files = run_files(run_id, job.files, self.user_data, self.labels(), getattr(self, "session", None),
                          self.control, self.credential, self.grace_s, handle.record, handle.stop_event)
        r.files = files
        handle.open()

        async def on_done() -> None:
            final = await handle.wait()
            log.info("run %s: %s", run_id, final["status"])
            r.finished = True
            r.spool.write_state({"run_id": run_id, "finished": True, "status": final["status"]})
            if self.one_shot is not None and run_id == self.one_shot.taken:
                self.one_shot.final = "interrupted" if self.one_shot.signalled and final["status"] == "cancelled" \
                    else final["status"]
                self._spawn(self._one_shot_deadline(r))
            self._maybe_forget(r)
        self._spawn(on_done())
        try:
            # This machine's folders: the job as assigned stays as it was.
            local = files.job_for_this_machine(job, self.config)
            local = outputs.for_this_machine(local, self.user_data, self.config)
            fetched = await files.fetch_inputs()
        except Exception as exc:  # a failed download or a missing mount fails this run only
            log.warning("run %s: preparing its files failed: %s", run_id, exc)
            await handle.finish_without_process({"status": "failed",
                                                 "error": f"preparing the run's files failed: {exc}"})
            return
        if not fetched:
            await handle.finish_without_process({"status": "cancelled",
                                                 "error": "stopped while its inputs were downloading"})
            return
        if handle.stop_requested:
            await handle.finish_without_process({"status": "cancelled", "error": "stopped before it started"})
            return
        files.start()
        handle.before_final = lambda final: files.finish(final, handle)
        log.info("run %s: starting on %s (files: %s)", run_id, local.slot_device, files.kind or "none")
        await handle.start(local, spares=self.spares)

    def _maybe_forget(self, r: AgentRun) -> None:
        if (r.finished or (r.handle is None)) and not r.running and r.spool.acked >= r.spool.last_seq:
            r.spool.remove()
            self.runs.pop(r.run_id, None)
            self._prune_run_folders()
            if self.one_shot is not None and r.run_id == self.one_shot.taken:
                self._one_shot_exit(self.one_shot.on_delivered())

    # -- one-shot: exit once the run's end is acknowledged, or after the grace without it ------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one_shot_deadline(self, r: AgentRun) -> None:
        await self.clock.sleep(self.grace_s)
        if self.one_shot is not None and self.one_shot.exit_code is None and r.run_id in self.runs:
            log.error("run %s: its end was not acknowledged within %g s (the resume grace); exiting with it left "
                      "in the spool %s", r.run_id, self.grace_s, r.spool.dir)
            self._one_shot_exit(1)

    def _one_shot_exit(self, code: int) -> None:
        assert self.one_shot is not None
        if self.one_shot.exit_code is not None:
            return
        log.info("one-shot agent done; exit code %d", code)
        self.one_shot.exit_code = code
        self.stopping = True
        self._stop_event.set()
        if self.ws is not None:
            self._spawn(self.ws.close())

    def _prune_run_folders(self) -> None:
        """The agent's own run retention (CODEFYUI_AGENT_RUN_RETENTION_KEEP_LAST): keep the newest run
        folders, never a live run's."""
        keep = int(self.config["CODEFYUI_AGENT_RUN_RETENTION_KEEP_LAST"])
        root = self.user_data / "agent-runs"
        if keep <= 0 or not root.is_dir():
            return
        # Another agent's runs may be here too (agents of several control planes share the folder):
        # a run still in any agent's spool is live.
        live = set(self.runs) | live_run_ids(self.user_data)
        done = [p for p in root.iterdir() if p.is_dir() and p.name not in live]
        done.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for p in done[keep:]:
            shutil.rmtree(p, ignore_errors=True)

    # -- shutdown ------------------------------------------------------------------
    def request_shutdown(self) -> None:
        if self.stopping:
            return
        log.info("SIGTERM: stopping runs (10 s grace each), then exiting")
        self.stopping = True
        if self.one_shot is not None:
            self.exit_code = self.one_shot.on_signal()
        self._spawn(self._shutdown_sequence())

    async def _shutdown_sequence(self) -> None:
        await self._stop_all_runs()
        # Let the last events reach the control plane over the live connection.
        deadline = self.clock.monotonic() + ACK_WAIT_S
        while self.ws is not None and any(r.spool.unacked() for r in self.runs.values()):
            left = deadline - self.clock.monotonic()
            if left <= 0:
                break
            self._acked.clear()
            await wait_event(self.clock, self._acked, left)
        self._stop_event.set()
        if self.ws is not None:
            await self.ws.close()

    async def _stop_all_runs(self) -> None:
        handles = [r.handle for r in self.runs.values() if r.handle is not None and not r.handle.done]
        for h in handles:
            h.stop(runner.STOP_GRACE_S)
        if handles:
            await asyncio.gather(*(h.wait() for h in handles), return_exceptions=True)
        await self.apps.close()
        await self.spares.close()  # every way out of the agent passes here

    async def _drain_on_shutdown(self, session: aiohttp.ClientSession) -> None:
        """After SIGTERM: wait for runs to end, then deliver their last events (best effort)."""
        await self._stop_all_runs()
        if not any(r.spool.unacked() for r in self.runs.values()):
            return
        deadline = self.clock.monotonic() + ACK_WAIT_S
        while self.clock.monotonic() < deadline and any(r.spool.unacked() for r in self.runs.values()):
            try:
                await asyncio.wait_for(self._deliver_once(session), max(1.0, deadline - self.clock.monotonic()))
            except (TimeoutError, aiohttp.ClientError, OSError, Refused):
                await self.clock.sleep(1)

    async def _deliver_once(self, session: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.credential}"}
        async with session.ws_connect(ws_url(self.control), headers=headers, heartbeat=None) as ws:
            await ws.send_str(self._hello())
            first = await ws.receive(timeout=30)
            if first.type != aiohttp.WSMsgType.TEXT:
                raise aiohttp.ClientError(f"connection closed before the welcome ({first.type.name})")
            welcome = self._welcome(first.data)
            self.ws = ws
            await self._resume(welcome.runs)
            while any(r.spool.unacked() for r in self.runs.values()):
                m = await ws.receive(timeout=10)
                if m.type != aiohttp.WSMsgType.TEXT:
                    return
                try:
                    msg = protocol.parse_server_message(m.data)
                except protocol.ProtocolError:
                    continue
                if isinstance(msg, protocol.Ack):
                    await self._handle(msg)
            self.ws = None


async def serve(agent: Agent) -> int:
    """``cdui agent start``: the agent, asked to stop by SIGTERM or Ctrl-C through its stop event."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop.set)
    # A pack installed beside it (`cdui plugin push` to an SSH worker): read the catalog again.
    loop.add_signal_handler(signal.SIGUSR1, lambda: agent._spawn(agent.reload_catalog()))
    # What the process has made by now (modules, the agent) lives as long as it does: the cycle
    # collector's full passes, which a run logging flat out sets off every few thousand events,
    # need not walk it again and again (each pass stalled the event forwarding for milliseconds).
    gc.freeze()
    # And a run's events, alive in batches until they are acknowledged, set off far fewer young collections.
    collect_young_less_often()
    return await agent.run()


def hostname() -> str:
    return socket.gethostname().split(".")[0] or "worker"

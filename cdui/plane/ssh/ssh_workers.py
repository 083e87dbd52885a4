"""SSH workers on the control plane: their saved rows, their routes, and one
:class:`~cdui.plane.ssh.ssh_supervisor.Supervisor` (plus one tunnel listener) each.

- ``POST /api/workers/ssh`` adds one (and connects it), ``GET /api/workers/ssh``
  lists them with their tunnel line;
- ``POST /api/workers/{name}/disable|enable|retry``; ``DELETE
  /api/workers/ssh/{name}`` deletes or removes one (``DELETE
  /api/workers/{name}`` of an SSH worker comes here too).

Disable stops new runs first (the worker's ``disabled`` flag, which admission
keeps even if an agent reconnects under the name), then tells the remote agent
to stop (over the ssh connection's stdin, or a short ssh when there is none),
waits at most 60 s for its runs to be reported, ends ssh, and ends what is
still unreported ``interrupted``. Delete/remove do the same, revoke the worker,
and clean the remote slot in the background. Server shutdown stops every SSH
agent alongside the server's own runs (a :class:`~cdui.plane.runs.RunListener`), 25 s
at most in all.

Rows live in the ``ssh_workers`` table (store migration 5, read and written
through :mod:`cdui.plane.store.ssh`): target, port, identity, remote cdui, slot,
enabled, the tunnel state and reason, the last attempt's output, the remote
agent's PID.

A pending remote cleanup is a row of ``ssh_cleanups`` (store migration 7), keyed
by the slot. The delete moves the worker's row there in one transaction, so at
no moment is the slot free while its old folder, agent or credential may still
be on the remote host; ``add`` never picks a slot of either table. Every stored
cleanup is resumed at start, and its row goes only when an attempt has ended
(cleaned, or what was left logged): a shutdown that cancels the attempt leaves
it for the next start.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.plane import enroll
from cdui.plane.appkeys import CLOCK, CONFIG
from cdui.plane.http.httpjson import DEFAULT_LIMIT, read_object
from cdui.plane.runs import RUNS, iso
from cdui.plane.ssh import ssh
from cdui.plane.ssh.ssh_supervisor import SHORT_SSH_S, Deps, Spec, Supervisor, TunnelState, run_short
from cdui.plane.ssh.tunnel import TunnelListener
from cdui.plane.store import SshCleanupRow, SshWorkerRow
from cdui.plane.workers import WORKERS, RemoteExecutor

log = logging.getLogger("cdui.plane.ssh.ssh")
SSH_WORKERS: web.AppKey[SshWorkers] = web.AppKey("ssh_workers")
DISABLE_WAIT_S = 60.0   # how long a stopping agent gets to report its runs
SHUTDOWN_BUDGET_S = 25.0
CLEANUP_WAIT_S = 60.0
TOKEN_TTL_S = 600.0
MAX_PATH = 1024
PLUGIN_PUSH_S = 300.0  # a pushed pack: copied over ssh, unpacked, checked and installed by the remote cdui


class SshWorkers:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.config = app[CONFIG]
        self.clock = app[CLOCK]
        self.runs = app[RUNS]
        self.store = self.runs.store
        self.sups: dict[str, Supervisor] = {}
        self.listeners: dict[str, TunnelListener] = {}
        self.iid = ""
        self.ssh_binary = "ssh"
        self._ended = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()

    # -- rows ---------------------------------------------------------------------------
    async def rows(self) -> list[SshWorkerRow]:
        return await self.store.ssh.all()

    async def row(self, name: str) -> SshWorkerRow | None:
        return await self.store.ssh.get(name)

    async def cleanups(self) -> list[SshCleanupRow]:
        return await self.store.ssh.cleanups()

    def view(self, r: SshWorkerRow) -> dict[str, Any]:
        sup = self.sups.get(r["name"])
        if sup is not None:
            tunnel = sup.tunnel.to_json()
        else:
            tunnel = {"state": r["state"], "reason": r["reason"], "remote_pid": r["remote_pid"], "retrying": False,
                      "next_attempt_s": None, "attempts": 0, "recent_output": json.loads(r["recent_output"] or "[]")}
        return {"name": r["name"], "target": r["target"], "port": r["port"], "identity": r["identity"],
                "remote_cdui": r["remote_cdui"], "slot": r["slot"], "enabled": bool(r["enabled"]),
                "control": ssh.control_url(self.iid, r["slot"]),
                "remote_dir": f"~/{ssh.remote_dir_rel(self.iid, r['slot'])}", "tunnel": tunnel}

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self.iid = ssh.instance_id(self.config.user_data)
        for r in await self.rows():
            if r["enabled"]:
                self._supervise(r)  # after a restart every enabled SSH worker reconnects
        for c in await self.cleanups():
            log.info("ssh worker %s: resuming the remote cleanup of slot %s on %s (deleted at %s)", c["name"],
                     c["slot"], c["target"], iso(c["started_at"]))
            self._start_cleanup(c)

    async def close(self) -> None:
        for name in list(self.sups):
            await self._end(name)
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _supervise(self, r: SshWorkerRow) -> Supervisor:
        name = r["name"]
        spec = Spec(name, self._target(r), int(r["slot"]), r["remote_cdui"])
        listener = self.listeners.get(name) or TunnelListener(self.app, name)
        self.listeners[name] = listener

        async def forgot() -> bool:
            row = await self.row(name)
            return bool(row and row["forgot"])

        async def set_forgot(v: bool) -> None:
            await self.store.ssh.set_forgot(name, v)

        async def changed(t: TunnelState) -> None:
            await self.store.ssh.set_tunnel(name, t.state, t.reason, t.remote_pid, list(t.output)[-50:])
        sup = Supervisor(spec, Deps(self.clock, self.iid, listener.start, lambda: self._launch_token(name),
                                    forgot, set_forgot, changed, self.ssh_binary))
        self.sups[name] = sup
        sup.start()
        return sup

    def _target(self, r: SshWorkerRow | SshCleanupRow) -> ssh.Target:
        return ssh.Target(r["target"], int(r["port"]), r["identity"] or None,
                          self.config["CODEFYUI_SSH_STRICT_HOST_KEY_CHECKING"])

    async def push_pack(self, name: str, pack_id: str, version: str, pin: str, tree: str,
                        data: bytes) -> tuple[bool, str] | None:
        """``cdui plugin push`` to SSH worker ``name`` over its own ssh (None: no SSH worker of that name): the
        archive follows the script on ssh's stdin, the remote cdui installs it if that side accepts pushed packs
        and its files hash to ``tree``, and the slot's agent reads its catalog again."""
        r = await self.row(name)
        if r is None:
            return None
        script = ssh.plugin_script(self.iid, r["slot"], r["remote_cdui"], pack_id, version, pin, tree, len(data))
        rc, lines = await run_short(ssh.short_command(self._target(r), script, self.ssh_binary, data),
                                    PLUGIN_PUSH_S, self.clock)
        ok, message = ssh.plugin_outcome(rc, lines, pack_id, PLUGIN_PUSH_S)
        log.log(logging.INFO if ok else logging.WARNING, "plugin pack %s pushed to SSH worker %s: %s", pack_id, name,
                message)
        return ok, message

    async def _launch_token(self, name: str) -> str:
        """A one-time 10-minute token for this start; bound to the worker once it has enrolled.
        The previous start's token is revoked: only one is ever outstanding."""
        now = self.clock.time()
        token, tid, h = enroll.new_token()
        await self.store.ssh.new_launch_token(name, tid, h, now + TOKEN_TTL_S, now)
        return token

    async def _end(self, name: str) -> None:
        sup = self.sups.pop(name, None)
        if sup is not None:
            await sup.close()
        listener = self.listeners.pop(name, None)
        if listener is not None:
            await listener.close()

    # -- stopping an agent (disable, remove, shutdown) ----------------------------------------
    async def on_terminal(self, run_id: str, status: str) -> None:
        self._ended.set()

    async def _runs_gone(self, name: str, seconds: float) -> bool:
        deadline = self.clock.monotonic() + seconds
        while self.runs.runs_on(name):
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return False
            self._ended.clear()
            ended = asyncio.ensure_future(self._ended.wait())
            timer = asyncio.ensure_future(self.clock.sleep(remaining))
            try:
                await asyncio.wait({ended, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                timer.cancel()
        return True

    async def stop_agent(self, name: str, why: str) -> None:
        """Ask the remote agent to stop, give its runs up to 60 s to be reported, end ssh,
        end the rest ``interrupted`` at once."""
        r = await self.row(name)
        sup = self.sups.get(name)
        told = sup is not None and await sup.ask_agent_to_stop()
        if not told and sup is not None:
            await sup.close()  # no attempt of its own may start an agent while the short ssh stops this one
        if not told and r is not None:
            rc, lines = await run_short(ssh.short_command(self._target(r), ssh.stop_script(self.iid, r["slot"]),
                                                          self.ssh_binary), SHORT_SSH_S + 10, self.clock)
            log.info("ssh worker %s: stop over a short ssh: exit %s: %s", name, rc, " | ".join(lines[-3:]))
        if not await self._runs_gone(name, DISABLE_WAIT_S):
            log.warning("ssh worker %s: runs not reported within %.0f s of the stop", name, DISABLE_WAIT_S)
            # Ended before ssh is, so that the reason is the wait and not the disconnect ending ssh causes.
            for run_id, _, _ in self.runs.runs_on(name):
                await self.runs.finish(run_id, "interrupted", f"worker {name} was {why} and the run was not "
                                                              f"reported as ended within {DISABLE_WAIT_S:.0f} s")
        if sup is not None:
            await sup.wait_exit(5.0)
        await self._end(name)

    async def on_shutdown(self) -> None:
        """Alongside the server's own runs: every SSH agent is told to stop (through its connection,
        or a short ssh when there is none), and the SSH workers get 25 s in all. A host that does not
        answer cannot hold the shutdown longer: its ssh is ended at the cap, and the runs its agent
        has not reported by then end ``interrupted`` (the agent was told to stop them)."""
        deadline = self.clock.monotonic() + SHUTDOWN_BUDGET_S
        names = list(self.sups)
        if self.app[WORKERS].handover:
            # A stop for a restart (`cdui update`): each ssh ends and its remote agent goes on with its runs; the
            # next start's ssh attaches to it, and the runs are adopted.
            for name in names:
                self.sups[name].stopping = True
                await self._end(name)
            return

        async def stop_one(name: str) -> None:
            sup = self.sups[name]
            sup.stopping = True
            if not await sup.ask_agent_to_stop():
                await sup.close()  # no attempt of its own may start an agent while the short ssh stops this one
                r = await self.row(name)
                if r is not None:
                    rc, lines = await run_short(ssh.short_command(self._target(r), ssh.stop_script(self.iid, r["slot"]),
                                                                  self.ssh_binary),
                                                max(0.0, deadline - self.clock.monotonic()), self.clock)
                    log.info("ssh worker %s: stop over a short ssh at shutdown: exit %s: %s", name, rc,
                             " | ".join(lines[-3:]))
            if not await self._runs_gone(name, deadline - self.clock.monotonic()):
                log.warning("ssh worker %s: runs not reported within %.0f s of the shutdown's stop notice; "
                            "ending ssh", name, SHUTDOWN_BUDGET_S)
                # Ended here, before ssh is, so that the reason is the cap and not the disconnect it causes.
                for run_id, _, _ in self.runs.runs_on(name):
                    await self.runs.finish(run_id, "interrupted", f"the server stopped and SSH worker {name} did "
                                                                  f"not report the run within "
                                                                  f"{SHUTDOWN_BUDGET_S:.0f} s")
            await sup.wait_exit(max(0.0, deadline - self.clock.monotonic()))
            await self._end(name)
        if names:
            await asyncio.gather(*(stop_one(n) for n in names))

    async def before_dispatch(self) -> None:
        return None

    async def check_target(self, target: Any, graph: Any, files: Any) -> None:
        return None

    async def on_disk_recovered(self) -> None:
        return None

    # -- routes ---------------------------------------------------------------------------
    async def add(self, request: web.Request) -> web.Response:
        body = await read_object(request, DEFAULT_LIMIT)
        target = ssh.check_target(body.get("target"))
        port = body.get("port", 22)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise CduiError("bad_request", f"port={port!r} is not a TCP port", hint="give a number from 1 to 65535")
        name = enroll.check_name(body.get("name") or ssh.default_name(target))
        identity = self._path(body.get("identity"), "identity")
        remote = self._path(body.get("remote_cdui"), "remote_cdui") or ssh.DEFAULT_REMOTE_CDUI
        slots = ssh.parse_slot_range(self.config["CODEFYUI_SSH_REMOTE_PORT_RANGE"])
        # A slot whose remote cleanup has not ended may still hold the old worker's folder, agent and
        # credential there: a new worker on it would attach to that agent or have its folder deleted,
        # so the store offers only slots neither table holds.
        slot = await self.store.ssh.add(name, target, port, identity, remote, lambda taken: ssh.pick_slot(slots, taken),
                                        self.clock.time())
        if slot is None:
            raise CduiError("name_taken", f"worker name {name!r} is already used by another worker",
                            hint="give another name (--name), or remove that worker first", status=409)
        r = await self.row(name)
        assert r is not None
        self._supervise(r)
        log.info("ssh worker %s added: %s (slot %s)", name, target, r["slot"])
        return web.json_response(self.view(r), status=201)

    @staticmethod
    def _path(v: Any, field: str) -> str | None:
        if v in (None, ""):
            return None
        if not isinstance(v, str) or len(v) > MAX_PATH or any(ch in v for ch in "\0\n\r") or v.startswith("-"):
            raise CduiError("bad_request", f"{field}={str(v)[:80]!r} is not a usable path",
                            hint=f"a file path of at most {MAX_PATH} characters")
        return v

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response({"ssh_workers": [self.view(r) for r in await self.rows()],
                                  "cleaning_slots": [int(c["slot"]) for c in await self.cleanups()]})

    async def _row_or_404(self, name: str) -> SshWorkerRow:
        r = await self.row(name)
        if r is None:
            raise NotFound("SSH worker", name, hint="list them with GET /api/workers/ssh")
        return r

    async def disable(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        r = await self.row(name)
        await self._set_disabled(name, True, r is None)
        if r is not None:
            await self.store.ssh.set_enabled(name, False)
            await self.stop_agent(name, "disabled")
            await self.store.ssh.set_state(name, "stopped", None)
        return web.json_response({"name": name, "disabled": True})

    async def enable(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        r = await self.row(name)
        await self._set_disabled(name, False, r is None)
        if r is not None:
            await self.store.ssh.set_enabled(name, True)
            if name not in self.sups:
                self._supervise({**r, "enabled": 1})
        return web.json_response({"name": name, "disabled": False})

    async def _set_disabled(self, name: str, disabled: bool, must_exist: bool) -> None:
        """The worker's own flag: a disabled worker takes no new runs whoever connects under its name;
        disabling and enabling again also cancels a drain."""
        if not await self.store.workers.set_disabled(name, disabled) and must_exist:
            raise NotFound("worker", name, hint="list workers with `cdui workers list`")
        if not disabled:
            self.app[WORKERS].drain_flags[name] = False  # a session attaching meanwhile takes it too
        ex = self.runs.executor(name)
        if isinstance(ex, RemoteExecutor):
            ex.disabled = disabled
            if not disabled:
                ex.drained = False
        self.runs.wake()

    async def retry(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        r = await self._row_or_404(name)
        if not r["enabled"]:
            raise CduiError("disabled", f"SSH worker {name} is disabled", hint=f"enable it: `cdui workers enable "
                                                                              f"{name}`", status=409)
        sup = self.sups.get(name) or self._supervise(r)
        sup.retry()  # the drain flag is left as it is
        return web.json_response({"name": name, "retrying": True})

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        r = await self._row_or_404(name)
        await self._set_disabled(name, True, False)
        await self.stop_agent(name, "removed")
        cleanup = SshCleanupRow(slot=int(r["slot"]), name=name, target=r["target"], port=r["port"],
                                identity=r["identity"], remote_cdui=r["remote_cdui"], started_at=self.clock.time())
        # Its launch token and its row here, the row handed to a pending cleanup in the same transaction
        # (so the slot is never free while the remote host may still hold its folder); the rest of
        # forgetting a worker is the manager's one way.
        await self.store.ssh.delete(name, cleanup)
        await self.app[WORKERS].remove_worker(name)
        self._start_cleanup(cleanup)
        return web.json_response({"removed": name, "cleanup": "started"})

    def _start_cleanup(self, c: SshCleanupRow) -> None:
        task = asyncio.ensure_future(self._cleanup(c))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cleanup(self, c: SshCleanupRow) -> None:
        """One attempt at the remote cleanup of a deleted worker's slot. Its stored row (and so the
        slot's reservation) ends only with the attempt: a cancel (the server stopping) propagates
        before that, so the next start runs it again."""
        name, slot = c["name"], int(c["slot"])
        left = f"~/{ssh.remote_dir_rel(self.iid, slot)} and the credential for {ssh.control_url(self.iid, slot)}"
        by_hand = f"cdui agent forget {ssh.control_url(self.iid, slot)}; rm -r ~/{ssh.remote_dir_rel(self.iid, slot)}"
        cmd = ssh.short_command(self._target(c), ssh.cleanup_script(self.iid, slot, c["remote_cdui"]),
                                self.ssh_binary)
        try:
            rc, lines = await run_short(cmd, CLEANUP_WAIT_S + 15, self.clock)
        except OSError as exc:  # no ssh on PATH: retrying at every start would not change that
            rc, lines = -1, [f"could not start ssh: {exc}"]
        if rc == 0:
            log.info("ssh worker %s: remote cleanup done: %s", name, " | ".join(lines[-2:]))
        else:
            why = (f"did not answer within {CLEANUP_WAIT_S + 15:.0f} s" if rc is None
                   else f"did not finish (exit {rc})")
            log.warning("ssh worker %s: remote cleanup on %s %s: left %s; to clean by hand run on that host: %s. "
                        "Output: %s", name, c["target"], why, left, by_hand, " | ".join(lines[-3:]))
        try:
            await self.store.ssh.cleanup_done(slot)
        except Exception:  # the row stays: the next start runs the cleanup again, which is harmless
            log.exception("ssh worker %s: could not record the end of the remote cleanup of slot %s; it runs "
                          "again at the next start", name, slot)


def setup(app: web.Application) -> None:
    """Add the SSH worker service, its routes and its start/stop to ``app``."""
    service = SshWorkers(app)
    app[SSH_WORKERS] = service
    app[RUNS].add_listener(service)
    r = app.router
    r.add_post("/api/workers/ssh", service.add)
    r.add_get("/api/workers/ssh", service.list)
    r.add_delete("/api/workers/ssh/{name}", service.delete)
    r.add_post("/api/workers/{name}/disable", service.disable)
    r.add_post("/api/workers/{name}/enable", service.enable)
    r.add_post("/api/workers/{name}/retry", service.retry)
    app.cleanup_ctx.append(_ctx)


async def _ctx(app: web.Application) -> AsyncIterator[None]:
    service = app[SSH_WORKERS]
    await service.start()
    yield
    await service.close()


async def owns(app: web.Application, name: str) -> bool:
    """Is ``name`` an SSH worker (its removal then also ends ssh and cleans the remote host)?"""
    service = app.get(SSH_WORKERS)
    return service is not None and await service.row(name) is not None


async def annotate(app: web.Application, workers: list[dict[str, Any]]) -> None:
    """Add the SSH tunnel line to the workers list, and the SSH workers that never enrolled."""
    service = app.get(SSH_WORKERS)
    if service is None:
        return
    by_name = {w["name"]: w for w in workers}
    for r in await service.rows():
        view = service.view(r)
        w = by_name.get(r["name"])
        if w is None:
            w = {"name": r["name"], "status": "disabled" if not r["enabled"] else "offline", "online": False,
                 "version": None, "drained": False, "disabled": not r["enabled"], "devices": [], "runs": [],
                 "last_seen": None, "address": None, "labels": {}, "unencrypted": False, "same_machine": False,
                 "same_machine_note": None, "tls_pin": None, "tls_next_pin": None, "connected_at": None,
                 "never_connected": True}
            workers.append(w)
        w["ssh"] = view
    workers.sort(key=lambda w: w["name"])

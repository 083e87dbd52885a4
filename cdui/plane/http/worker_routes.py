"""The worker routes over plain HTTP: enrollment, tokens, list, drain, reissue, remove.

They act through the :class:`~cdui.plane.workers.WorkerManager` (``app[WORKERS]``),
which owns the connections and the runs on them; ``/ws/worker`` itself is the
manager's (one :class:`~cdui.plane.worker_session.WorkerSession` per connection).
"""
from __future__ import annotations

import json
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from cdui import __version__
from cdui.core import trust
from cdui.core.errors import CduiError, NotFound
from cdui.nodes import packs
from cdui.plane import enroll
from cdui.plane.http import proxies
from cdui.plane.http.httpjson import DEFAULT_LIMIT, PUBLIC_LIMIT, read_object
from cdui.plane.runs import iso
from cdui.plane.ssh import ssh_workers
from cdui.plane.store import WorkerRow
from cdui.plane.workers import WORKERS, WorkerManager
from cdui.run import catalog
from cdui.wire import protocol
from cdui.wire.same_machine import Verdict

NOT_PROVEN = Verdict(False)

log = logging.getLogger("cdui.plane.workers")  # the same logger as before the split, so log filters keep working


def update_state(version: str | None, updating: dict[str, Any] | None) -> dict[str, Any]:
    """A worker's update state for GET /api/workers: ``updating`` (its agent fetched the update bundle and
    has not come back on this version), ``current`` (it runs this control plane's version) or ``behind``
    (it last connected with another version: it is refused until it runs this one)."""
    if updating is not None:
        return {"state": "updating", **updating}
    if version == __version__:
        return {"state": "current"}
    return {"state": "behind", "to": __version__}


class WorkerRoutes:
    def __init__(self, manager: WorkerManager) -> None:
        self.m = manager
        self.cert = trust.ServerCert(manager.config["CODEFYUI_TLS_CERT_FILE"])

    async def list_workers(self, request: web.Request) -> web.Response:
        rows = await self.m.worker_rows()
        out = []
        for r in rows:
            conn = self.m.conns.get(r["name"])
            if conn is not None and conn.ws.closed:
                conn = None  # its socket closed: offline, even before its handler has removed it
            online = conn is not None
            devices = conn.hello.devices if conn is not None else json.loads(r["devices"] or "[]")
            here = self.m.runs.runs_on(r["name"])
            runs_here = [rid for rid, _, _ in here]
            used: dict[str, int] = {}
            for _, _, dev in here:
                used[dev] = used.get(dev, 0) + 1
            status = "disabled" if r["disabled"] else ("draining" if r["drained"] and online else
                                                        ("online" if online else "offline"))
            out.append({
                "name": r["name"], "status": status, "online": online, "version": r["version"],
                "drained": bool(r["drained"]), "disabled": bool(r["disabled"]),
                "devices": [{"device": d, "slots": self.m.runs.caps.slots(r["name"], d), "in_use": used.get(d, 0)}
                            for d in devices],
                "runs": runs_here, "last_seen": iso(conn.last_seen if conn is not None else r["last_seen"]),
                "address": conn.address if conn is not None else r["address"],
                "labels": conn.labels if conn is not None else json.loads(r["labels"] or "{}"),
                "unencrypted": bool(conn.unencrypted) if conn is not None else False,
                # A pinned worker's key check, as its agent reports it: the pin its connection matched
                # and the next pin it holds (a proxy key rotation, docs/deploy-behind-proxy.md).
                "tls_pin": (conn.tls or {}).get("pin") if conn is not None else None,
                "tls_next_pin": (conn.tls or {}).get("next") if conn is not None else None,
                # Each CUDA card's utilisation and memory, as its agent last reported them (none: a machine
                # without CUDA cards, or offline).
                "gpu": conn.gpu if conn is not None else None,
                "gpu_at": iso(conn.gpu_at) if conn is not None and conn.gpu_at is not None else None,
                # The published apps' serving processes it holds (each holds a slot of its device), as its agent
                # last reported them.
                "serving": (conn.serving or []) if conn is not None else [],
                # Proven by the agent's answer to the same-machine probe, never by the id it claims.
                "same_machine": self.m.same_machine.get(r["name"], NOT_PROVEN).same,
                "same_machine_note": self.m.same_machine.get(r["name"], NOT_PROVEN).note,
                "connected_at": iso(conn.connected_at) if conn is not None else None,
                "update": update_state(r["version"], self.m.updating.get(r["name"])),
                # The owner lets its agent follow `cdui update` (the Workers panel; POST .../follow-updates).
                "follow_updates": bool(r.get("auto_update")),
                **self.m.runs.oneshot.card(r["name"], r, self.m, iso),
                **self._sync_card(r["name"], conn),
                # Published apps' warm processes there hold slots as runs do: counted in each device's in_use.
                **self.m.runs.devicebook.card(r["name"], devices, here + self.m.runs.app_holders(r["name"]),
                                              conn.hello.device_memory or {} if conn is not None else {},
                                              self.m.runs.caps),
            })
        await ssh_workers.annotate(request.app, out)
        # The control plane's own devices too: `cdui run --device` checks a device exists somewhere before it queues.
        local = self.m.runs.executors.get("local")
        return web.json_response({"workers": out, "rejected": sorted(self.m.rejected.values(), key=lambda x: x["at"]),
                                  "local": {"devices": local.devices() if local is not None else []}})

    def _sync_card(self, name: str, conn: Any) -> dict[str, Any]:
        """The sync fields of a worker's card: none while it is not connected."""
        state = self.m.catalog_state(name) if conn is not None else None
        if state is None:
            return {"degraded": False, "catalog": None, "fingerprint": None}
        return {"degraded": state.degraded, "catalog": state.to_api(),
                "fingerprint": catalog.summary(conn.hello.fingerprint),
                **pack_card(conn.hello.fingerprint, packs.pins(self.m.runs.config.plugin_store))}

    async def create_token(self, request: web.Request) -> web.Response:
        body = await read_object(request, DEFAULT_LIMIT)
        ttl, uses = enroll.check_token_request(body.get("ttl_s", 86400), body.get("uses", 1))
        control = self._control(request, body)
        worker = body.get("worker")
        if worker is not None:
            enroll.check_name(worker)
            if not await self.m.store.workers.exists(worker):
                raise NotFound("worker", worker, hint="a reissue token is for an enrolled worker; list them with "
                                                      "`cdui workers list`")
        now = self.m.clock.time()
        tok = await enroll.issue_token(self.m.store.tokens, ttl, uses, worker, now)
        return web.json_response(self._token_answer(request, tok, control), status=201)

    def _control(self, request: web.Request, body: dict[str, Any]) -> str:
        """The address generated commands name (checked before anything is stored)."""
        # Behind a trusted proxy its X-Forwarded-Proto says which scheme the client used.
        scheme = "https" if proxies.client_of(request).encrypted else "http"
        return trust.advertised_control(scheme, request.host, body.get("control"), self.cert.path is not None,
                                        self.m.config["CODEFYUI_PUBLIC_URL"],
                                        self.m.config["CODEFYUI_EXTRA_ALLOWED_HOSTS"])

    def _token_answer(self, request: web.Request, tok: dict[str, Any], control: str) -> dict[str, Any]:
        pins = trust.token_trust_fields(control, self.cert)
        cmd = f"cdui agent start --control {control} --token {tok['token']}"
        if tok.get("worker"):
            cmd += f" --name {tok['worker']}"
        if "ca_fingerprint" in pins:
            cmd += f" --ca-fingerprint {pins['ca_fingerprint']}"
        out: dict[str, Any] = {"token": tok["token"], "id": tok["id"], "expires_at": iso(tok["expires_at"]),
                               "uses": tok["uses"], "worker": tok.get("worker"), "command": cmd, **pins}
        host = (urlsplit(control).hostname or "").strip("[]")
        if host in ("127.0.0.1", "localhost", "::1"):
            # A loopback address reaches this machine only, so it is no address to give a worker.
            others = _own_addresses()
            if self.cert.path is not None:
                # Behind the TLS proxy the server stays on loopback (docs/deploy-behind-proxy.md): the
                # address to give is the proxy's, never --host 0.0.0.0.
                out["note"] = ("this command uses a loopback address, which works only on this machine; for "
                               "another machine give the TLS proxy's address: `cdui workers token --public-url "
                               "https://NAME` (or set CODEFYUI_PUBLIC_URL)")
            else:
                out["note"] = ("this command uses a loopback address, which works only on this machine; for another "
                               "machine start the server with --host 0.0.0.0 and give the agent an address it can "
                               "reach" + (f", e.g. {', '.join(others)}" if others else "")
                               + "; behind a TLS proxy, give its address with --public-url instead")
            out["other_addresses"] = others
        return out

    async def list_tokens(self, request: web.Request) -> web.Response:
        now = self.m.clock.time()
        rows = [{**r, "expired": r["expires_at"] <= now, "used_up": r["uses_left"] <= 0,
                 "expires_at": iso(r["expires_at"]), "created_at": iso(r["created_at"])}
                for r in await self.m.store.tokens.active()]
        return web.json_response(rows)

    async def delete_token(self, request: web.Request) -> web.Response:
        tid = request.match_info["token_id"]
        if not await self.m.store.tokens.revoke(tid):
            raise NotFound("enrollment token", tid)
        return web.json_response({"revoked": tid})

    async def enroll_route(self, request: web.Request) -> web.Response:
        # Behind a trusted proxy every client shares the proxy's address: count the real one.
        address = proxies.client_of(request).address
        # Anyone on the network reaches this route: a small body, bounded fields.
        unreadable: CduiError | None = None
        body: dict[str, Any] = {}
        try:
            body = await read_object(request, PUBLIC_LIMIT)
        except CduiError as exc:
            unreadable = exc
        # Failures count per token and address (cdui/plane/enroll.py), so read the token before deciding.
        token = body.get("token")
        wait = self.m.limiter.blocked(address, token)
        if wait is not None:
            self.m.runs.counts.refused("rate_limited")
            raise CduiError("rate_limited", f"too many failed enrollment attempts from {address}",
                            hint=f"try again in {max(wait, 1):.0f} s", status=429)
        try:
            if unreadable is not None:
                raise unreadable
            res = await self._enroll(body)
        except CduiError as exc:
            # Only failures count: agents sharing an address must not lock each other out.
            self.m.limiter.failure(address, token)
            self.m.runs.counts.refused(exc.code)
            raise
        log.info("worker %s enrolled from %s", res["worker"], address)
        return web.json_response({"worker": res["worker"], "credential": res["credential"],
                                  "version": __version__}, status=201)

    async def _enroll(self, body: dict[str, Any]) -> dict[str, Any]:
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
        now = self.m.clock.time()
        return await enroll.enroll(self.m.store.tokens, str(body.get("token", "")), body.get("name"), devices,
                                   machine, now)

    async def _worker_or_404(self, name: str) -> WorkerRow:
        row = await self.m.store.workers.get(name)
        if row is None:
            raise NotFound("worker", name, hint="list workers with `cdui workers list`")
        return row

    async def set_drain(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._worker_or_404(name)
        drain = request.path.endswith("/drain")
        await self.m.store.workers.set_drained(name, drain)
        self.m.set_drained(name, drain)
        return web.json_response({"name": name, "drained": drain})

    async def reissue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        await self._worker_or_404(name)
        body = await read_object(request, DEFAULT_LIMIT)
        ttl, _ = enroll.check_token_request(body.get("ttl_s", 86400), 1)
        control = self._control(request, body)
        now = self.m.clock.time()
        tok = await enroll.issue_token(self.m.store.tokens, ttl, 1, name, now)
        return web.json_response(self._token_answer(request, tok, control), status=201)

    async def remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if await ssh_workers.owns(request.app, name):
            return await request.app[ssh_workers.SSH_WORKERS].delete(request)  # also ends ssh, cleans the host
        instance = await self.m.runs.oneshot.remove_instance(name, self.m)
        if instance is not None:
            return web.json_response(instance)
        await self._worker_or_404(name)
        await self.m.remove_worker(name)
        return web.json_response({"removed": name})


def _own_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses, as far as its host name tells."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    addresses = {str(i[4][0]) for i in infos}  # AF_INET: each sockaddr is (address, port)
    return sorted(a for a in addresses if not a.startswith("127."))


def setup(app: web.Application) -> None:
    """Add the worker routes; the manager is ``app[WORKERS]`` (made by ``build_app``)."""
    m = app[WORKERS]
    h = WorkerRoutes(m)
    r = app.router
    r.add_get("/api/workers", h.list_workers)
    r.add_post("/api/workers/tokens", h.create_token)
    r.add_get("/api/workers/tokens", h.list_tokens)
    r.add_delete("/api/workers/tokens/{token_id}", h.delete_token)
    r.add_post("/api/workers/enroll", h.enroll_route)
    r.add_get("/ws/worker", m.ws_handler)
    r.add_delete("/api/workers/{name}", h.remove)
    r.add_post("/api/workers/{name}/drain", h.set_drain)
    r.add_post("/api/workers/{name}/undrain", h.set_drain)
    r.add_post("/api/workers/{name}/reissue", h.reissue)


def pack_card(fingerprint: dict[str, Any] | None, here: dict[str, dict[str, str]]) -> dict[str, Any]:
    """A worker's installed plugin packs (id -> version, sha256) as its agent reported them, and the control
    plane's packs it lacks or has at another sha256, each with the command that installs it there."""
    theirs = (fingerprint or {}).get("packs")
    theirs = {str(k): v for k, v in theirs.items() if isinstance(v, dict)} if isinstance(theirs, dict) else {}
    lacking = [{"id": pid, "version": p["version"], "sha256": p["sha256"],
                "have": str(theirs[pid].get("sha256", "")) if pid in theirs else None,
                "install": f"cdui plugin install {pid}"}
               for pid, p in sorted(here.items()) if str(theirs.get(pid, {}).get("sha256", "")) != p["sha256"]]
    return {"packs": theirs, "packs_lacking": lacking}

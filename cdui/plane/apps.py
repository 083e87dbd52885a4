"""Published apps (docs/apps.md): a saved graph frozen as numbered versions behind a slug, called with
an API key, served by a warm process on the control plane or on a worker.

- **Versions** are immutable snapshots (the graph as :meth:`RunService.admit` stores a run's: its
  installed presets embedded), made by ``publish``, which checks the graph as ``/api/graph/run``
  does (its contract, then every graph error) and activates the new version at once. ``activate``
  names any version (rollback), ``unpublish`` leaves none active (invokes are refused, nothing is
  lost), ``delete`` removes the app, its versions and its invoke records.
- **API keys** (``cdui_`` and 43 random characters) are shown once; the store keeps their first
  :data:`PREFIX_CHARS` characters and the sha256 of the whole key. A revoked key is refused from the
  next request on; its row stays.
- **Warm serving**: each active app version an invoke asks for gets a process (a canvas process,
  :mod:`cdui.run.canvas_proc`: forked from the zygote, torch imported) that runs one invoke's graph
  after another and keeps between them what does not depend on the inputs (its execution cache), so a
  model is built once and only what the inputs change runs. No run is stored for an invoke: its record
  is a row of ``app_invokes``. One invoke runs at a time per process; a version has up to
  ``CODEFYUI_APP_PROCESSES`` of them on a device (one more starts when every one is busy), and
  ``CODEFYUI_APP_MAX_WAITING`` invokes of an app may be in flight or waiting (429 ``app_busy``
  beyond). A process ends after ``CODEFYUI_APP_IDLE_TIMEOUT_S`` idle, when it holds more than
  ``CODEFYUI_APP_MAX_RSS_MB`` after an invoke, and once its version is no longer the active one and
  its last invoke has answered: activating another version never drops an invoke in flight. A crash
  fails only the invoke in flight (503 ``app_process_lost``); the next invoke starts a fresh process.
  The processes are a :class:`cdui.run.serving.ServingPool`'s, the same on a worker's agent.
- **Placement**: the app's ``serve_on`` (``local``, ``any`` or a worker) and ``serve_device`` say where an
  invoke runs (:func:`cdui.plane.sched.app_placement.place_app`). An invoke on a worker is an
  ``app_invoke`` over that worker's connection, answered by ``app_answer`` (waited for by request id, as
  recorded outputs are); a worker not connected is a 503 ``app_worker_offline`` naming it. A worker on
  another machine fetches the version's weights by sha256 from the download route, which lets it have
  only the files of versions it was sent (:meth:`AppService.may_download`).
- **Slots**: each warm process holds a slot of its device (``RunService.app_slots``), so runs queue for it;
  an idle one gives it back to a queued run that may use the device.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.core.paths import sha256_file
from cdui.graph.contract import Contract, contract_of, input_values
from cdui.plane.runs import RunService
from cdui.plane.sched import catalog_check
from cdui.plane.sched.app_placement import ANY, LOCAL, Refuse, check_serve_on, place_app
from cdui.plane.worker_session import Conn, RemoteExecutor
from cdui.run import canvas_proc, runner
from cdui.run.serving import STOP_WAIT_S, PoolLimits, ServingPool, no_slot
from cdui.wire import protocol
from cdui.wire.job import Job, JobFiles

log = logging.getLogger(__name__)

SLUG = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
KEY_PREFIX = "cdui_"
PREFIX_CHARS = 12  # of a key, kept and listed so that its owner can tell keys apart
KEY_NAME_MAX = 100
NOTE_MAX = 2000
GIT_COMMIT = re.compile(r"^[0-9a-fA-F]{4,64}$")
# A version's weights files are copied at publish into this folder of the models folder, by content
# (WEIGHTS_FOLDER/<sha256>/<name>), and its graph names the copies: saving new weights over the original
# never changes a published version. At most SNAPSHOT_MAX_BYTES of them per publish.
WEIGHTS_FOLDER = "app-weights"
SNAPSHOT_MAX_BYTES = 8 * 1024 ** 3
SNAPSHOTS_KEPT = 32  # versions' graphs kept in memory for invokes (each up to CODEFYUI_MAX_GRAPH_BYTES)
JOBS_KEPT = 4 * SNAPSHOTS_KEPT  # versions' jobs by device (each names its version's graph, kept above)
DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S = 60.0, 3600.0
INVOKES_LISTED_MAX = 500
# An invoke on a worker is answered by the worker within its timeout (and the stop's wait); past this much
# more the control plane stops waiting (the link may be slow, the answer large) and answers 504 itself.
REMOTE_MARGIN_S = 30.0
# The HTTP status of each way a worker says an invoke did not run to a result (protocol.APP_ERROR_CODES): the
# worker names the code, never the status.
REMOTE_STATUS = {"app_process_lost": 503, "timeout": 504, "app_prepare_failed": 503, "app_failed": 500,
                 "app_not_prepared": 503}
DEVICE_MAX = 128
# While runs are queued, a serving process idle this long gives its slot back (checked every YIELD_EVERY_S).
YIELD_IDLE_S = 2.0
YIELD_EVERY_S = 1.0


@dataclass(frozen=True)
class Ended:
    """How one invoke's graph ended, wherever it ran: the run's result line and its GraphOutputs."""
    result: dict[str, Any]
    outputs: dict[str, Any]
    output_error: dict[str, Any] | None


@dataclass
class WorkerVersion:
    """What a version needs to be served by another machine: the files its graph reads (its weights), sent as
    a transfer run's inputs are."""
    files: JobFiles
    reason: str | None  # why it cannot be served by a worker that has not this server's folders, or None


def check_slug(slug: str) -> str:
    if not SLUG.match(slug):
        raise CduiError("invalid_slug", f"app slug {slug[:100]!r} is not valid",
                        hint="use 1 to 64 lower-case letters, digits and '-', starting with a letter "
                             "(^[a-z][a-z0-9-]{0,63}$)", status=422)
    return slug


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _optional_str(body: dict[str, Any], name: str, limit: int) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise CduiError("bad_request", f"{name} must be a string of at most {limit} characters",
                        hint=f'give "{name}": "..." or leave it out')
    return v


def _optional_bool(body: dict[str, Any], name: str) -> bool | None:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise CduiError("bad_request", f"{name}={v!r} is not true or false", hint=f'give "{name}": true or false')
    return v


def bounded_json(value: Any, limit: int) -> str:
    """``value`` as JSON text for an invoke record, or only its size when it is longer than ``limit``."""
    text = json.dumps(value, default=str)
    if len(text) > limit:
        return json.dumps({"__omitted__": "larger than CODEFYUI_APP_RECORD_MAX_BYTES", "bytes": len(text)})
    return text


class LocalSlots:
    """This server's device slots, as its serving pool takes them (:class:`cdui.run.serving.SlotGate`)."""

    def __init__(self, service: RunService) -> None:
        self.service = service

    def try_take(self, slot: str) -> bool:
        return self.service.try_app_slot(LOCAL, slot)

    async def take(self, slot: str, timeout: float) -> None:
        await self.service.take_app_slot(LOCAL, slot, timeout)

    def release(self, slot: str) -> None:
        self.service.release_app_slot(LOCAL, slot)


class AppService:
    def __init__(self, service: RunService) -> None:
        self.service = service
        self.store = service.store
        cfg = service.config
        self.max_waiting = int(cfg["CODEFYUI_APP_MAX_WAITING"])
        self.record_max = int(cfg["CODEFYUI_APP_RECORD_MAX_BYTES"])
        self.records_kept = int(cfg["CODEFYUI_APP_INVOKES_KEPT"])
        # This server's serving processes; each holds a slot of its device, as a run does.
        self.pool = ServingPool(service.spares, PoolLimits.from_config(cfg),
                                lambda: service.hold_app_slots(LOCAL, self.pool.slots()), LocalSlots(service))
        self._yielder: asyncio.Task[None] | None = None
        # Each version served by a worker: the files it reads; and each worker's files it may download for the
        # versions it was sent (a worker credential downloads nothing else: cdui/plane/http/api_files.py).
        self._worker_versions: dict[tuple[str, int], WorkerVersion] = {}
        self._granted: dict[str, set[tuple[str, str]]] = {}
        # Which apps each worker was sent invokes of (told of each activation).
        self._sent: dict[str, set[str]] = {}
        # (worker, app, version, device) -> held by the one invoke starting the version's process there.
        self._cold: dict[tuple[str, str, int, str], asyncio.Lock] = {}
        # The versions each worker's connection was sent the job of and prepared: their invokes carry only
        # the inputs. A new connection (the agent restarted, or reconnected) starts empty.
        self._prepared: dict[str, tuple[Conn, set[tuple[str, int]]]] = {}
        # Each version's job on each device here, built once (versions never change): sent once to each of its
        # serving processes, which then get only each invoke's inputs.
        self._jobs: dict[tuple[str, int, str], Job] = {}
        self.waiting: dict[str, int] = {}  # invokes of each app in flight or waiting
        # Each active version's snapshot and contract, read once from the store (versions never change).
        self._snapshots: dict[tuple[str, int], tuple[dict[str, Any], Contract]] = {}
        # Each app's row and each live key's id, as last read: every change of either is made through this
        # service (or the routes that call it), which drops what it changed, so an invoke reads the store only
        # to record itself. Unknown keys are never kept: made-up keys cannot grow it.
        # A read under way while a change is made must not keep what it read: each change moves its
        # generation, and a read keeps its row only if the generation did not move meanwhile.
        self._apps: dict[str, dict[str, Any]] = {}
        self._keys: dict[str, int] = {}
        self._apps_gen = 0
        self._keys_gen = 0
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.pool.start()
        self._yielder = asyncio.ensure_future(self._yield_slots())

    async def close(self) -> None:
        self._closing = True
        if self._yielder is not None:
            self._yielder.cancel()
            await asyncio.gather(self._yielder, return_exceptions=True)
        await self.pool.close()

    async def _yield_slots(self) -> None:
        """Invokes and runs share the devices' slots fairly: a warm process holds its slot while it serves, and
        gives it back once it has been idle YIELD_IDLE_S while a queued run may use that device (the next
        invoke starts a new process). Here, and on each worker that reports an idle one."""
        wants = self.service.wants_slot
        while True:
            await asyncio.sleep(YIELD_EVERY_S)
            if not self.service.queue.lanes and not self.service.slot_waiters:
                continue
            await self.pool.end_idle(YIELD_IDLE_S, lambda device: wants(LOCAL, device))
            for name, ex in list(self.service.executors.items()):
                if not isinstance(ex, RemoteExecutor):
                    continue
                devices = sorted({p["device"] for p in ex.conn.serving or () if p["state"] == "idle"
                                  and wants(name, p["device"])})
                if devices:
                    await ex.conn.send(protocol.AppReleaseIdle(YIELD_IDLE_S, devices))

    async def retire(self, slug: str, keep: int | None) -> None:
        """Every serving process of ``slug`` but version ``keep``'s ends, each once its invokes have answered:
        this server's, and those of each connected worker it was ever sent to."""
        await self.pool.retire(slug, keep)
        for key in [k for k, lock in self._cold.items() if k[1] == slug and k[2] != keep and not lock.locked()]:
            del self._cold[key]
        for worker, slugs in self._sent.items():
            conn = self._conn(worker)
            if slug in slugs and conn is not None:
                # The worker forgets the versions it retires: their next invokes carry the job again.
                _conn, prepared = self._prepared.get(worker, (None, set()))
                prepared.difference_update({k for k in prepared if k[0] == slug and k[1] != keep})
                await conn.send(protocol.AppRetire(slug, keep))

    # -- publish and versions ----------------------------------------------------------
    async def publish(self, slug: str, body: dict[str, Any], source: str, graph: dict[str, Any]) -> dict[str, Any]:
        """Check the graph as a call of it is checked, store it as the next version and activate it."""
        check_slug(slug)
        create = _optional_bool(body, "create") or False
        record_io = _optional_bool(body, "record_io")
        git_dirty = _optional_bool(body, "git_dirty")
        note = _optional_str(body, "note", NOTE_MAX)
        git_commit = _optional_str(body, "git_commit", 64)
        if git_commit is not None and not GIT_COMMIT.match(git_commit):
            raise CduiError("bad_request", f"git_commit {git_commit[:70]!r} is not a commit id",
                            hint="give the commit's hexadecimal id (4 to 64 digits), e.g. from `git rev-parse HEAD`")
        serving = check_serving(body["serve_on"], body.get("serve_device")) if "serve_on" in body else None
        contract = contract_of(graph)  # 409 with the reason, as /api/graph/run answers
        try:
            admitted = await self.service.admit(graph, {"target": "local"})
        except CduiError as exc:
            if exc.code == "invalid_graph":
                exc.status = 409
            raise
        if admitted.secrets:
            raise CduiError("secret_in_graph", f"the graph holds {len(admitted.secrets)} saved secret value(s); a "
                            "published version is stored for good and must not keep one",
                            hint="blank the secret params (save the graph again: PUT /api/graphs/{name} blanks "
                                 "them) and publish again", status=409)
        snapshot, copied = await asyncio.to_thread(self._keep_weights, admitted.stored_graph)
        got = await self.store.apps.publish(slug, create, source, snapshot, contract.to_json(), note,
                                            record_io, git_commit, git_dirty, self.service.clock.time(), serving)
        if got is None:
            raise CduiError("app_not_found", f"app {slug!r} does not exist",
                            hint='pass "create": true to create it (cdui apps publish does on its first publish)',
                            status=404)
        version, created = got
        self._forget_app(slug)
        await self.retire(slug, version)
        return {"slug": slug, "version": version, "active": True, "created": created, "graph_name": source,
                "note": note, "git_commit": git_commit, "git_dirty": git_dirty, "weights": copied}

    def _keep_weights(self, graph: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The graph with each of its top-level nodes' weights files (``model_file`` params naming a file of
        the models folder) replaced by a copy kept for the app; and what was copied. (A preset's own nodes
        keep their paths.)"""
        layout, registry = self.service.layout, self.service.registry
        out = json.loads(json.dumps(graph))
        copied: list[dict[str, Any]] = []
        total = 0
        for node in out.get("nodes") or []:
            kind = node.get("type") if isinstance(node, dict) else None
            cls = registry.get(kind) if isinstance(kind, str) else None
            data = node.get("data") if cls is not None else None
            params = data.get("params") if isinstance(data, dict) else None
            if cls is None or not isinstance(params, dict):
                continue
            for p in cls.define_params():
                value = params.get(p.name)
                if p.param_type != "model_file" or not isinstance(value, str) or not value.strip() \
                        or value.strip().startswith(WEIGHTS_FOLDER + "/"):
                    continue
                try:
                    src = layout.resolve_upload("models", value)
                except CduiError:
                    continue  # the node says why when it runs, as in any run
                if not src.is_file():
                    continue
                size, digest = sha256_file(src)
                total += size
                if total > SNAPSHOT_MAX_BYTES:
                    raise CduiError("snapshot_too_large", f"the graph's weights files are more than "
                                    f"{SNAPSHOT_MAX_BYTES // 1024 ** 3} GiB together; a version keeps a copy of each",
                                    hint="publish a graph that loads smaller weights", status=413)
                name = f"{WEIGHTS_FOLDER}/{digest}/{src.name}"
                dest = layout.resolve_upload("models", name)
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    part = dest.with_name(dest.name + ".part")
                    shutil.copyfile(src, part)
                    os.replace(part, dest)
                params[p.name] = name
                copied.append({"node_id": node.get("id"), "param": p.name, "from": value, "to": name, "bytes": size})
        return out, copied

    def _forget_app(self, slug: str) -> None:
        """After a change of the app's row: a read under way when it was made keeps nothing."""
        self._apps_gen += 1
        self._apps.pop(slug, None)

    async def app(self, slug: str) -> dict[str, Any]:
        row = self._apps.get(slug)
        if row is None:
            gen = self._apps_gen
            row = await self.store.apps.get(check_slug(slug))
            if row is None:
                raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps",
                                status=404)
            if gen == self._apps_gen:
                self._apps[slug] = row
        return dict(row)

    async def set_record_io(self, slug: str, record: bool) -> None:
        changed = await self.store.apps.set_record_io(check_slug(slug), record, self.service.clock.time())
        self._forget_app(slug)
        if not changed:
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)

    async def activate(self, slug: str, version: int | None) -> dict[str, Any]:
        check_slug(slug)
        missing = await self.store.apps.activate(slug, version, self.service.clock.time())
        self._forget_app(slug)
        if missing == "app":
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)
        if missing == "version":
            raise CduiError("version_not_found", f"app {slug!r} has no version {version}",
                            hint=f"list them: GET /api/apps/{slug}/versions", status=404)
        await self.retire(slug, version)
        return {"slug": slug, "active_version": version}

    async def delete(self, slug: str) -> dict[str, Any]:
        check_slug(slug)
        deleted = await self.store.apps.delete(slug)
        self._forget_app(slug)
        if not deleted:
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)
        await self.retire(slug, None)
        for key in [k for k in self._snapshots if k[0] == slug]:
            del self._snapshots[key]
        for job_key in [k for k in self._jobs if k[0] == slug]:
            del self._jobs[job_key]
        for wv in [k for k in self._worker_versions if k[0] == slug]:
            del self._worker_versions[wv]
        self.pool.forget_app(slug)
        return {"slug": slug, "deleted": True}

    async def snapshot(self, slug: str, version: int) -> tuple[dict[str, Any], Contract]:
        got = self._snapshots.get((slug, version))
        if got is None:
            row = await self.store.apps.version(slug, version)
            if row is None:
                raise NotFound("app version", f"{slug} v{version}")
            got = (row["graph"], contract_of(row["graph"]))
            self._snapshots[(slug, version)] = got
            while len(self._snapshots) > SNAPSHOTS_KEPT:  # the least recently read first
                del self._snapshots[next(iter(self._snapshots))]
        else:
            self._snapshots[(slug, version)] = self._snapshots.pop((slug, version))
        return got

    # -- keys ------------------------------------------------------------------------
    async def create_key(self, name: Any) -> dict[str, Any]:
        if not isinstance(name, str) or not name.strip() or len(name) > KEY_NAME_MAX:
            raise CduiError("bad_request", f"name={str(name)[:120]!r} is not a key name",
                            hint=f'give "name": 1 to {KEY_NAME_MAX} characters saying who uses the key')
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        prefix = key[:PREFIX_CHARS]
        key_id = await self.store.apps.add_key(name, prefix, hash_key(key), self.service.clock.time())
        return {"id": key_id, "name": name, "prefix": prefix, "key": key, "token": key}

    async def key_auth(self, request: web.Request) -> int | None:
        """The id of the live API key in ``Authorization: Bearer``, or None."""
        given = request.headers.get("Authorization", "")[7:].strip()
        if not given.startswith(KEY_PREFIX):
            return None
        h = hash_key(given)
        known = self._keys.get(h)
        if known is not None:
            return known
        gen = self._keys_gen
        row = await self.store.apps.key_by_hash(h)
        if row is None or row["revoked_at"] is not None:
            return None
        if gen == self._keys_gen:
            self._keys[h] = int(row["id"])
        return int(row["id"])

    async def revoke_key(self, key_id: int) -> dict[str, Any] | None:
        """Refused from the next request on: the kept ids are dropped before the store is changed, and a
        read that was under way meanwhile finds the key revoked."""
        self._keys_gen += 1
        self._keys.clear()
        row = await self.store.apps.revoke_key(key_id, self.service.clock.time())
        self._keys_gen += 1
        self._keys.clear()
        return row

    # -- where an app is served ----------------------------------------------------------
    async def set_serving(self, slug: str, serve_on: Any, device: Any) -> dict[str, Any]:
        """Serve ``slug`` on ``serve_on`` (``local``, ``any`` or a worker's name), on ``device`` there (None: a
        card if it has one). Invokes from the next on go there; processes already warm elsewhere end once
        their invokes have answered."""
        check_slug(slug)
        serve_on, device = check_serving(serve_on, device)
        changed = await self.store.apps.set_serving(slug, serve_on, device, self.service.clock.time())
        self._forget_app(slug)
        if not changed:
            raise CduiError("app_not_found", f"app {slug!r} not found", hint="list them: GET /api/apps", status=404)
        await self.retire(slug, None)  # the next invoke starts a process where the app is served now
        return {"slug": slug, "serve_on": serve_on, "serve_device": device}

    def _conn(self, worker: str) -> Conn | None:
        ex = self.service.executors.get(worker)
        return ex.conn if isinstance(ex, RemoteExecutor) and not ex.conn.ws.closed else None

    def _workers(self, graph: dict[str, Any] | None = None) -> dict[str, list[str]]:
        """The connected workers that may serve apps (not one-shot agents: they take one run and leave); with
        ``graph``, only those whose node catalog has every type it uses."""
        return {name: ex.devices() for name, ex in self.service.executors.items()
                if isinstance(ex, RemoteExecutor) and not ex.one_shot and not ex.conn.ws.closed
                and (graph is None or not self._missing(ex, graph))}

    def _missing(self, ex: RemoteExecutor, graph: dict[str, Any]) -> list[str]:
        """The node types ``graph`` uses that the worker lacks (it reported a catalog unlike this server's)."""
        return catalog_check.missing_types(ex.catalog, graph, {}, self.service.registry.preset_params)

    def _place(self, app: dict[str, Any], version: int, wanted: Any, graph: dict[str, Any]) -> tuple[str, str]:
        if wanted is not None and (not isinstance(wanted, str) or len(wanted) > DEVICE_MAX):
            raise CduiError("bad_request", f"device={str(wanted)[:DEVICE_MAX]!r} is not a device name",
                            hint='leave it out, or give e.g. "cpu" or "cuda:0"')
        local = self.service.executors.get("local")
        slug = app["slug"]
        # Where the version is warm: a worker with a serving process of it is preferred by serve_on "any".
        warm = {name: 1 for name, ex in self.service.executors.items() if isinstance(ex, RemoteExecutor)
                and any((p["slug"], p["version"]) == (slug, version) for p in ex.conn.serving or ())}
        if self.pool.warm(slug, version):
            warm[LOCAL] = 1
        got = place_app(app["serve_on"], wanted if wanted is not None else app["serve_device"],
                        local.devices() if local is not None else ["cpu"],
                        # "any" passes over a worker that lacks a node type of the version; a named worker is
                        # refused naming them (_on_worker).
                        self._workers(graph if app["serve_on"] == ANY else None), warm)
        if isinstance(got, Refuse):
            raise CduiError(got.code, got.message, hint=got.hint.replace("{slug}", slug), status=got.status,
                            details={"worker": app["serve_on"]} if got.code == "app_worker_offline" else None)
        return got.executor, got.device

    # -- downloads a worker may make ---------------------------------------------------
    def may_download(self, worker: str, folder: str, name: str) -> bool:
        """Whether ``worker`` was sent a version whose graph reads upload ``folder``/``name`` (its weights)."""
        return (folder, name) in self._granted.get(worker, ())

    async def _worker_version(self, slug: str, version: int, graph: dict[str, Any]) -> WorkerVersion:
        got = self._worker_versions.get((slug, version))
        if got is None:
            plan = await asyncio.to_thread(self.service.file_plan, graph, {})
            got = WorkerVersion(JobFiles("transfer", tuple(plan.inputs), self.service.config["CODEFYUI_MOUNT_LABEL"]),
                                None if plan.transfer_ok else plan.reason)
            self._worker_versions[(slug, version)] = got
        return got

    # -- invoke ------------------------------------------------------------------------
    def _job(self, slug: str, version: int, graph: dict[str, Any], slot: str) -> Job:
        """The version's job on ``slot``: its graph as published (the callers' values go separately)."""
        got = self._jobs.get((slug, version, slot))
        if got is None:
            svc = self.service
            _env, proc_device = runner.run_env(slot)
            got = Job(run_id=f"app-{slug}-v{version}", graph=graph,
                      options={"graph_max_nodes": svc.config["CODEFYUI_GRAPH_MAX_NODES"], canvas_proc.SERVING: True},
                      slot_device=slot,
                      process_device=proc_device, layout=svc.layout.to_json(),
                      custom_nodes_dir=str(svc.config.custom_nodes_dir), plugins_dir=str(svc.config.plugins_dir),
                      files=JobFiles(None, (), svc.config["CODEFYUI_MOUNT_LABEL"]))
            self._jobs[(slug, version, slot)] = got
            while len(self._jobs) > JOBS_KEPT:  # the oldest first: it is built again if asked for
                del self._jobs[next(iter(self._jobs))]
        return got

    async def invoke(self, slug: str, body: Any, key_id: int | None) -> tuple[int, dict[str, Any]]:
        """Run the active version on ``inputs``; the HTTP status and CodefyUI's envelope. Recorded
        whatever its end, once the app and its active version are known."""
        started = time.monotonic()
        if not isinstance(body, dict):
            raise CduiError("bad_request", "the body must be an object: {inputs, timeout_s, device}")
        app = await self.app(slug)
        version = app["active_version"]
        if version is None:
            raise CduiError("app_unpublished", f"app {slug!r} is unpublished: no version is active",
                            hint=f"activate one: POST /api/apps/{slug}/activate {{\"version\": N}}", status=409)
        envelope: dict[str, Any] = {"status": None, "run_id": None, "invoke_id": None, "graph": app["graph_name"],
                                    "app": slug, "version": version, "device": None, "worker": None, "outputs": {},
                                    "error": None, "timing": {}}
        status = 200
        try:
            raw = body.get("timeout_s", DEFAULT_TIMEOUT_S)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= MAX_TIMEOUT_S:
                raise CduiError("bad_timeout", f"timeout_s={raw!r} is not a number of seconds in "
                                f"(0, {MAX_TIMEOUT_S:.0f}]", hint="give timeout_s in seconds, or leave it out")
            graph, contract = await self.snapshot(slug, version)
            values = input_values(contract, body.get("inputs"))
            where, slot = self._place(app, version, body.get("device"), graph)
            envelope["device"] = slot
            envelope["worker"] = None if where == LOCAL else where
            if self.waiting.get(slug, 0) >= self.max_waiting:
                raise CduiError("app_busy", f"app {slug!r} has {self.max_waiting} invokes in flight or waiting, "
                                "the most CODEFYUI_APP_MAX_WAITING allows", hint="retry shortly", status=429)
            if self._closing:
                raise CduiError("shutting_down", "the server is stopping", hint="call again once it is back",
                                status=503)
            self.waiting[slug] = self.waiting.get(slug, 0) + 1
            try:
                if where == LOCAL:
                    result, call = await self.pool.run(slug, version, slot, self._job(slug, version, graph, slot),
                                                       values, float(raw))
                    ended = Ended(result, call.outputs, call.output_error)
                else:
                    ended = await self._on_worker(where, slug, version, slot, graph, values, float(raw))
            finally:
                self.waiting[slug] -= 1
                if not self.waiting[slug]:
                    del self.waiting[slug]
            envelope["outputs"] = ended.outputs
            envelope["status"] = str(ended.result.get("status") or "failed")
            if envelope["status"] != "succeeded":
                envelope["error"] = ended.output_error or {
                    "code": f"run_{envelope['status']}", "message": ended.result.get("error") or envelope["status"],
                    "node_id": ended.result.get("node_id"), "details": None}
                envelope["error"].setdefault("details", None)
            else:
                missing = sorted(set(contract.outputs) - set(ended.outputs))
                if missing:
                    envelope["status"] = "failed"
                    envelope["error"] = {"code": "missing_outputs", "message": f"the invoke ended without "
                                         f"output(s) {missing}", "node_id": None, "details": None}
        except CduiError as exc:
            status = exc.status
            envelope["status"] = "timeout" if exc.code == "timeout" else "failed"
            envelope["error"] = {"code": exc.code, "message": exc.message, "node_id": None, "details": exc.details}
            if exc.hint:
                envelope["error"]["hint"] = exc.hint
        took = time.monotonic() - started
        envelope["timing"] = {"total_s": round(took, 4)}
        record = app["record_io"]
        inputs_text = bounded_json(body.get("inputs"), self.record_max) if record else None
        outputs_text = bounded_json(envelope["outputs"], self.record_max) if record else None
        err = envelope["error"]
        error_text = f"{err['code']}: {err['message']}"[:2000] if err else None
        envelope["invoke_id"] = await self.store.apps.record_invoke(
            slug, version, key_id, str(envelope["status"]), error_text, round(took * 1000, 3), inputs_text,
            outputs_text, self.service.clock.time(), self.records_kept)
        return status, envelope

    async def _on_worker(self, worker: str, slug: str, version: int, slot: str, graph: dict[str, Any],
                         values: dict[str, Any], timeout: float) -> Ended:
        """An invoke on ``worker``: when it has no process of the version on ``slot`` (as its heartbeats tell),
        this invoke starts one there, and first takes a slot of that device as the control plane's own
        serving pool does (waiting its turn with the runs queued before it). One such invoke at a time per
        version and device; the others find the process it started."""
        conn = self._conn(worker)
        if conn is None:
            raise _offline(worker, "is not connected")
        ex = self.service.executors.get(worker)
        missing = self._missing(ex, graph) if isinstance(ex, RemoteExecutor) else []
        if missing:
            refused = catalog_check.refuse_missing(worker, missing)
            refused.status = 409
            raise refused

        def warm() -> bool:
            return any((p.get("slug"), p.get("version"), p.get("device")) == (slug, version, slot)
                       for p in conn.serving or ())
        if warm():
            return await self._run_remote(worker, slug, version, slot, graph, values, timeout)
        async with self._cold.setdefault((worker, slug, version, slot), asyncio.Lock()):
            if warm():
                return await self._run_remote(worker, slug, version, slot, graph, values, timeout)
            try:
                await self.service.take_app_slot(worker, slot, timeout)
            except TimeoutError:
                raise no_slot(f"{slot} on worker {worker}", slug, version, timeout) from None
            try:
                return await self._run_remote(worker, slug, version, slot, graph, values, timeout)
            finally:
                self.service.release_app_slot(worker, slot)  # the worker's heartbeat reports the process's own

    async def _run_remote(self, worker: str, slug: str, version: int, slot: str, graph: dict[str, Any],
                          values: dict[str, Any], timeout: float) -> Ended:
        """One invoke on ``worker``'s serving process, sent over its connection; its answer as an :class:`Ended`."""
        conn = self._conn(worker)
        if conn is None:
            raise _offline(worker, "is not connected")
        held = self._prepared.get(worker)
        if held is None or held[0] is not conn:
            held = self._prepared[worker] = (conn, set())
        prepared = held[1]
        self._sent.setdefault(worker, set()).add(slug)
        job = None if (slug, version) in prepared else await self._worker_job(conn, worker, slug, version, slot, graph)
        answer = await self._send_invoke(conn, worker, slug, version, slot, values, timeout, job)
        if answer.error is not None and answer.error.get("code") == "app_not_prepared" and job is None:
            # The worker no longer has the version (it retired it meanwhile): once more, with its job.
            prepared.discard((slug, version))
            job = await self._worker_job(conn, worker, slug, version, slot, graph)
            answer = await self._send_invoke(conn, worker, slug, version, slot, values, timeout, job)
        if answer.error is None or answer.error.get("code") not in ("app_prepare_failed", "app_not_prepared"):
            prepared.add((slug, version))
        if answer.error is not None:
            code = str(answer.error["code"])
            raise CduiError(code, f"worker {worker}: {answer.error.get('message') or code}",
                            hint=answer.error.get("hint"), status=REMOTE_STATUS.get(code, 500),
                            details=answer.error.get("details"))
        assert answer.result is not None  # the protocol gives exactly one of result and error
        return Ended(answer.result, answer.outputs, answer.output_error)

    async def _worker_job(self, conn: Conn, worker: str, slug: str, version: int, slot: str,
                          graph: dict[str, Any]) -> Job:
        """The version's job as ``worker`` gets it to prepare the version."""
        job = self._job(slug, version, graph, slot)
        if not conn.same_machine:
            # Another machine: its own folders, and the version's weights fetched by sha256 from here.
            wv = await self._worker_version(slug, version, graph)
            if wv.reason is not None:
                raise CduiError("app_not_servable", f"app {slug!r} version {version} cannot be served on worker "
                                f"{worker}: {wv.reason}", hint="serve it here (serve_on \"local\") or on a worker "
                                "that mounts this server's data folder", status=409)
            job = replace(job.without_local_paths(), files=wv.files)
            self._granted.setdefault(worker, set()).update((i["folder"], i["name"]) for i in wv.files.inputs)
        return job

    async def _send_invoke(self, conn: Conn, worker: str, slug: str, version: int, slot: str, values: dict[str, Any],
                           timeout: float, job: Job | None) -> protocol.AppAnswer:
        request_id = secrets.token_hex(8)
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.outputs.waiting[request_id] = answered
        try:
            if not await conn.send(protocol.AppInvoke(request_id, slug, version, slot, values, timeout, job)):
                raise _offline(worker, "disconnected before the invoke could be sent")
            await asyncio.wait({answered}, timeout=timeout + STOP_WAIT_S + REMOTE_MARGIN_S)
        finally:
            conn.outputs.waiting.pop(request_id, None)
        if answered.cancelled():  # the connection ended (PendingOutputs.gone)
            raise _offline(worker, "disconnected during the invoke")
        if not answered.done():
            raise CduiError("timeout", f"worker {worker} did not answer the invoke within {timeout:g} s and "
                            f"{STOP_WAIT_S + REMOTE_MARGIN_S:g} s more", hint="raise timeout_s, or check the worker",
                            status=504)
        answer = answered.result()
        if not isinstance(answer, protocol.AppAnswer):
            raise CduiError("app_failed", f"worker {worker} answered the invoke with a {answer.type} message",
                            status=502)
        return answer

    def describe(self) -> list[dict[str, Any]]:
        """Every serving process: this server's, and each connected worker's as its agent last reported them."""
        out = [{**p, "worker": None} for p in self.pool.describe()]
        for name, ex in sorted(self.service.executors.items()):
            if isinstance(ex, RemoteExecutor) and ex.conn.serving:
                out.extend({**p, "worker": name} for p in ex.conn.serving)
        return out


def check_serving(serve_on: Any, device: Any) -> tuple[str, str | None]:
    why = check_serve_on(serve_on)
    if why is not None:
        raise CduiError("bad_serve_on", why, hint="cdui workers lists the workers' names", status=422)
    if device is not None and (not isinstance(device, str) or not device or len(device) > DEVICE_MAX):
        raise CduiError("bad_request", f"device={str(device)[:DEVICE_MAX]!r} is not a device name",
                        hint='leave it out, or give e.g. "cpu", "cuda" or "cuda:0"')
    return serve_on, device


def _offline(worker: str, what: str) -> CduiError:
    return CduiError("app_worker_offline", f"the app is served on worker {worker!r}, which {what}",
                     hint=f"call again once worker {worker} is back, or serve the app elsewhere "
                          "(cdui apps serve-on SLUG local)", status=503, details={"worker": worker})


APPS: web.AppKey[AppService] = web.AppKey("apps")
# The id of the API key a request was let in with (the auth middleware sets it on invokes).
API_KEY_ID: web.RequestKey[int] = web.RequestKey("api_key_id")

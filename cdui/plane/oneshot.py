"""One-shot workers on the control plane: who gets them, how long pool runs wait, instances.

A one-shot agent (``cdui agent start --one-shot``) takes exactly one run and
exits. It is never given a run for ``any``: only runs that name it
(``{"worker": NAME}``, or ``NAME.<ID>`` for an instance) and runs of the
one-shot pool (``{"pool": "one-shot"}`` with ``options.device``). Pool runs
wait per device kind, oldest first, and fail after
``CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S`` (0: they wait forever); so do
runs that name an instance, and runs that name a worker whose own last agent
was one-shot (remembered in its ``workers`` row, so a restarted control plane
starts their countdown at once).

Instances share one credential: ``<credential>.<ID>`` is the name a run sees,
the credential's row is never changed by them, and drain and removal of the
credential apply to every instance. The control plane keeps the last
:data:`MAX_DEPARTED` departed instances of each credential in memory, for the
Workers list.

The pure rules come first (flags, names, deadlines; placing pool runs is queue policy,
:func:`cdui.plane.sched.queue.place_pool`); then
:class:`OneShotBook`, the in-memory state, whose methods the run service and
the worker manager call from one-line hooks.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from cdui.core.clock import Clock
from cdui.core.errors import CduiError
from cdui.plane.sched import worker_admission as admission
from cdui.plane.sched.queue import is_one_shot
from cdui.plane.store import ACTIVE, Run, Store
from cdui.wire import protocol
from cdui.wire.devicesets import device_matches
from cdui.wire.target import Pool, Target, Worker, target_json, worker_name

log = logging.getLogger("cdui.plane.oneshot")

MAX_DEPARTED = 50  # departed instances kept per credential, until the control plane restarts
# An instance ID becomes part of a worker name and of a folder name on the agent: no dots, no slashes.
INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


# -- pure rules ------------------------------------------------------------------------
def flag_problem(hello: protocol.Hello) -> str | None:
    """Why this hello's one-shot flags cannot be served, or None."""
    if hello.instance is not None and not hello.one_shot:
        return "--instance is only for one-shot agents; add --one-shot"
    if hello.run_id is not None and not hello.one_shot:
        return "--run-id is only for one-shot agents; add --one-shot"
    if hello.instance is not None and not INSTANCE_RE.match(hello.instance):
        return (f"instance ID {hello.instance[:80]!r} is not valid: use 1-64 letters, digits, '_' or '-', "
                f"starting with a letter or digit")
    return None


def conn_name(credential: str, hello: protocol.Hello) -> str:
    """The name the agent works under: the credential's, or ``<credential>.<ID>`` for an instance."""
    return f"{credential}.{hello.instance}" if hello.instance is not None else credential


def peek_conn_name(credential: str, first: object) -> str:
    """:func:`conn_name` from the raw first message, before admission parsed it (the
    open connection of that name is looked up first); the credential's name if it is no hello."""
    if not isinstance(first, str):
        return credential
    try:
        hello = protocol.parse_agent_message(first)
    except protocol.ProtocolError:
        return credential
    if isinstance(hello, protocol.Hello) and hello.instance is not None and INSTANCE_RE.match(hello.instance):
        return conn_name(credential, hello)
    return credential


def busy_reason(ex: object) -> str | None:
    """Why a one-shot executor takes no (other) run: it has its one run, or waits for its --run-id."""
    if not is_one_shot(ex):
        return None
    name = getattr(ex, "name", "?")
    taken, reserved = getattr(ex, "taken", None), getattr(ex, "reserved", None)
    if taken is not None:
        return f"one-shot worker {name} has taken its one run ({taken})"
    if reserved is not None:
        return f"one-shot worker {name} takes only run {reserved} (--run-id)"
    return None


def queue_deadline(target: Target, created_at: float, timeout: float, one_shot_since: float | None,
                   names_instance: bool) -> float | None:
    """When a queued run stops waiting for a one-shot worker (None: no one-shot timeout applies)."""
    if timeout <= 0:
        return None
    match target:
        case Pool():
            return created_at + timeout
        case Worker() if names_instance:
            return created_at + timeout
        case Worker() if one_shot_since is not None:
            return max(created_at, one_shot_since) + timeout
    return None


def run_id_problem(run: Run | None, name: str, devices: list[str], held: set[str]) -> str | None:
    """Why ``--run-id`` cannot take ``run`` on the agent ``name`` offering ``devices`` and holding
    ``held`` runs, or None. A one-shot agent that reconnects after taking its run names that run."""
    if run is None:
        return "no run with that id exists on this control plane"
    if run.id in held and run.worker_id == name:
        return None  # its own run, on a reconnect
    if run.status == "queued":
        match run.target:
            case Pool():
                wanted = run.options.get("device")
                if any(device_matches(wanted, d) for d in devices):
                    return None
                return (f"it waits in the one-shot pool for {wanted}, which this agent does not offer "
                        f"({', '.join(devices)})")
            case Worker(name=named) if named == name:
                return None
        return f"it waits for {json.dumps(target_json(run.target))}, not for the one-shot pool or worker {name}"
    if run.status in ACTIVE and run.worker_id == name:
        return None  # this agent's own run, on a reconnect
    return f"it is {run.status}" + (f" on worker {run.worker_id}" if run.worker_id else "")


# -- what the book uses of its owners ------------------------------------------------
# The run service owns the book and the worker manager and its sessions call it, so this module
# names them by these ports instead of importing their modules (which import this one).
class RunPort(Protocol):
    """The run service (:class:`cdui.plane.runs.RunService`)."""

    @property
    def store(self) -> Store: ...
    @property
    def executors(self) -> Mapping[str, Any]: ...

    def spawn(self, coro: Any) -> asyncio.Task[Any]: ...

    async def finish(self, run_id: str, status: str, error: str | None) -> None: ...

    def runs_on(self, executor: str | None = None) -> list[tuple[str, str, str]]: ...

    def instances_of(self, credential: str) -> list[Any]: ...

    def detach_executor(self, name: str) -> None: ...

    async def start_on(self, run: Run, executor: Any, device: str) -> None: ...


class ManagerPort(Protocol):
    """The worker manager (:class:`cdui.plane.workers.WorkerManager`); ``conns`` holds its
    :class:`cdui.plane.worker_session.Conn` objects."""

    @property
    def store(self) -> Store: ...
    @property
    def runs(self) -> RunPort: ...
    @property
    def conns(self) -> dict[str, Any]: ...


class ExecutorPort(Protocol):
    """A connected worker (:class:`cdui.plane.worker_session.RemoteExecutor`); ``conn`` is its Conn."""

    name: str
    credential: str
    one_shot: bool
    taken: str | None
    reserved: str | None

    @property
    def conn(self) -> Any: ...

    def devices(self) -> list[str]: ...


@dataclass
class Departed:
    name: str
    instance: str
    run: str | None
    left_at: float

    def to_api(self, iso: Callable[[float | None], str | None]) -> dict[str, Any]:
        return {"name": self.name, "instance": self.instance, "run": self.run, "left_at": iso(self.left_at),
                "note": None if self.run else "it exited without taking a run"}


@dataclass
class OneShotBook:
    """The control plane's in-memory view of one-shot workers (see the module's docstring)."""

    clock: Clock
    timeout: float
    one_shot_since: dict[str, float] = field(default_factory=dict)
    instance_names: dict[str, bool] = field(default_factory=dict)  # worker name -> names an instance?
    departed: dict[str, deque[Departed]] = field(default_factory=dict)
    _timer: asyncio.Task[None] | None = None
    _timer_at: float | None = None

    # -- the run service's hooks -------------------------------------------------------
    async def load(self, service: RunPort) -> None:
        """At start: the workers whose own last agent was one-shot; their runs' countdown starts now."""
        now = self.clock.time()
        for name in await service.store.workers.one_shot_names():
            self.one_shot_since.setdefault(name, now)

    async def names_instance(self, service: RunPort, name: str) -> bool:
        """Whether ``name`` is ``<credential>.<ID>`` of an enrolled credential (not a credential itself)."""
        if name not in self.instance_names:
            base, dot, inst = name.rpartition(".")
            found = False
            if dot and INSTANCE_RE.match(inst):
                found = await service.store.workers.names_instance(name, base)
            self.instance_names[name] = found
        return self.instance_names[name]

    async def expire(self, service: RunPort, run: Run, wake: Callable[[], None]) -> bool:
        """End a queued run whose one-shot wait is over (True), or arm the timer for it."""
        named = worker_name(run.target)
        inst = await self.names_instance(service, named) if named is not None else False
        since = self.one_shot_since.get(named) if named is not None else None
        deadline = queue_deadline(run.target, run.created_at, self.timeout, since, inst)
        if deadline is None:
            return False
        now = self.clock.time()
        if now >= deadline:
            what = "the one-shot pool" if named is None else f"one-shot worker {named}"
            await service.finish(run.id, "failed", f"no one-shot worker took the run within {self.timeout:g} s "
                                                   f"(waiting for {what}; CODEFYUI_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S)")
            return True
        self._arm(deadline, service, wake)
        return False

    def _arm(self, deadline: float, service: RunPort, wake: Callable[[], None]) -> None:
        if self._timer is not None and not self._timer.done() and self._timer_at is not None \
                and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline

        async def fire() -> None:
            await self.clock.sleep(deadline - self.clock.time())
            self._timer_at = None
            wake()
        self._timer = service.spawn(fire())

    async def refuse_record_outputs(self, service: RunPort, target: Target, record_outputs: bool) -> None:
        if not record_outputs:
            return
        named = worker_name(target)
        pool = isinstance(target, Pool)
        if pool or (named is not None and (named in self.one_shot_since
                                           or await self.names_instance(service, named))):
            where = "the one-shot pool" if pool else f"one-shot worker {named}"
            raise CduiError("record_outputs_one_shot",
                            f"a run with record_outputs on cannot go to {where}: a one-shot agent exits when the "
                            f"run ends, so its recorded outputs could never be read",
                            hint="turn record_outputs off, or queue the run on a long-running worker or local")

    # -- the worker manager's hooks ------------------------------------------------------
    async def admit(self, accept: admission.Accept, manager: ManagerPort) -> admission.Decision:
        """Admission, one-shot part: flags, the instance's name, one agent per name, ``--run-id``."""
        hello = accept.hello
        problem = flag_problem(hello)
        if problem is not None:
            return admission.Refuse("bad_flags", problem, accept.name, f"bad flags: {problem}")
        name = conn_name(accept.name, hello)
        if not hello.one_shot and accept.name not in self.one_shot_since:
            return accept
        held = {r.run_id for r in hello.runs}
        busy = [r for r in await asyncio.to_thread(manager.store.runs_in_status_sync, ACTIVE)
                if r.worker_id == name and r.id not in held]
        if busy and not hello.one_shot:
            # Its last agent was one-shot and that run is not over: admitted, this agent would hold
            # none of it and the welcome would end it `interrupted` (a reconnect without the run).
            msg = (f"worker {name}'s run {busy[0].id} is still in progress with a one-shot agent; an agent "
                   f"that is not that one cannot use the name until the run has ended")
            return admission.Refuse("name_in_use", msg, name, msg)
        if not hello.one_shot:
            return accept
        if busy:
            msg = (f"worker {name}'s run {busy[0].id} is still in progress with another agent; one agent per name "
                   f"at a time (run several jobs at once with --instance)")
            return admission.Refuse("name_in_use", msg, name, msg)
        if hello.run_id is not None:
            why = run_id_problem(await manager.store.get_run(hello.run_id), name, hello.devices, held)
            if why is not None:
                msg = f"--run-id {hello.run_id}: this agent cannot take that run: {why}"
                return admission.Refuse("bad_run_id", msg, name, msg)
        return replace(accept, name=name)

    async def connected(self, manager: ManagerPort, executor: ExecutorPort, credential: str) -> None:
        """A one-shot agent (or a normal one, which clears the mark) came: mark its executor
        and remember, on the credential's own row only, what kind its last agent was."""
        hello = executor.conn.hello
        executor.credential = credential
        executor.one_shot = hello.one_shot
        if not hello.one_shot:
            if credential in self.one_shot_since:
                self.one_shot_since.pop(credential, None)
                await manager.store.workers.clear_one_shot(credential)
            return
        # The agent names its run in run_id: the --run-id it waits for (still queued), or, on a
        # reconnect, the one it took (then it takes no other, whatever that run became).
        wanted = await manager.store.get_run(hello.run_id) if hello.run_id is not None else None
        executor.taken = hello.run_id if wanted is not None and wanted.status != "queued" else None
        executor.reserved = hello.run_id if wanted is not None and wanted.status == "queued" else None
        if hello.instance is not None:
            self.instance_names[executor.name] = True
            return
        self.one_shot_since.setdefault(credential, self.clock.time())
        await manager.store.workers.set_one_shot(credential, executor.taken)

    async def start_wanted(self, manager: ManagerPort, executor: ExecutorPort) -> None:
        """``--run-id``: start exactly that run on the agent now, wherever it is in the queue."""
        run_id = executor.reserved
        if run_id is None or executor.taken is not None:
            return
        run = await manager.store.get_run(run_id, with_graph=True)
        if run is None or run.status != "queued":
            return
        wanted = run.options.get("device")
        dev = next((d for d in executor.devices() if device_matches(wanted, d)), None)
        if dev is not None:
            await manager.runs.start_on(run, executor, dev)

    async def took(self, manager: ManagerPort, executor: ExecutorPort, run_id: str) -> None:
        """A one-shot worker was given its run: it takes no other one."""
        if not executor.one_shot:
            return
        executor.taken = run_id
        executor.reserved = None
        if executor.conn.hello.instance is None:
            await manager.store.workers.set_one_shot_run(executor.credential, run_id)

    def gone(self, executor: ExecutorPort) -> None:
        """An instance's agent left: one line in its credential's list of departed instances."""
        hello = executor.conn.hello
        if not executor.one_shot or hello.instance is None:
            return
        rows = self.departed.setdefault(executor.credential, deque(maxlen=MAX_DEPARTED))
        rows.append(Departed(executor.name, hello.instance, executor.taken, self.clock.time()))

    def card(self, credential: str, row: Mapping[str, Any], manager: ManagerPort,
             iso: Callable[[float | None], str | None]) -> dict[str, Any]:
        """What the Workers list adds to a credential's card: its one-shot mark and its instances."""
        live = [c for c in manager.conns.values() if not c.ws.closed and c.hello.instance is not None
                and c.name == f"{credential}.{c.hello.instance}"]
        running = [c for c in live if manager.runs.runs_on(c.name)]
        out: dict[str, Any] = {"one_shot": bool(row["one_shot"]), "one_shot_run": row["one_shot_run"]}
        if row["one_shot"]:
            out["one_shot_note"] = (f"took run {row['one_shot_run']}" if row["one_shot_run"]
                                    else "its last agent took no run")
        out["instances"] = {
            "connected": len(live), "running": len(running),
            "live": [{"name": c.name, "instance": c.hello.instance, "devices": list(c.hello.devices),
                      "runs": [rid for rid, _, _ in manager.runs.runs_on(c.name)], "address": c.address,
                      "connected_at": iso(c.connected_at)} for c in sorted(live, key=lambda c: c.name)],
            "departed": [d.to_api(iso) for d in reversed(self.departed.get(credential, ()))],
        }
        return out

    async def remove_instance(self, name: str, manager: ManagerPort) -> dict[str, Any] | None:
        """``DELETE /api/workers/<credential>.<ID>``: a departed instance's row goes; a live one
        cannot go alone (its agent would reconnect with the credential). None: not an instance."""
        base, dot, inst = name.rpartition(".")
        if not dot:
            return None
        conn = manager.conns.get(name)
        live = conn is not None and not conn.ws.closed and conn.hello.instance == inst
        if live or (self.instance_names.get(name) and manager.runs.runs_on(name)):
            raise CduiError("instance_connected", f"instance {name} is connected or its run is in progress; it "
                                                  f"cannot be removed on its own",
                            hint=f"wait until it has left, or remove the credential {base} (which revokes every "
                                 f"instance)", status=409)
        rows = self.departed.get(base)
        if rows is None or not any(d.name == name for d in rows):
            return None
        self.departed[base] = deque((d for d in rows if d.name != name), maxlen=MAX_DEPARTED)
        return {"removed": name, "instance": True}

    async def revoke_instances(self, credential: str, manager: ManagerPort) -> None:
        """The credential was removed: every instance is disconnected, its run ends ``interrupted``,
        and runs waiting for any instance fail."""
        prefix = f"{credential}."
        for name, conn in list(manager.conns.items()):
            if conn.hello.instance is None or name != prefix + conn.hello.instance:
                continue
            manager.conns.pop(name, None)
            manager.runs.detach_executor(name)
            await conn.send(protocol.Revoked(f"worker {credential} was removed from the control plane; its "
                                             f"credential (shared by its instances) is revoked"))
            await conn.ws.close()
            for run_id, _, _ in manager.runs.runs_on(name):
                await manager.runs.finish(run_id, "interrupted", f"worker {credential} was removed (instance {name})")
        for r in await asyncio.to_thread(manager.store.runs_in_status_sync, {"queued"} | ACTIVE):
            named = worker_name(r.target)
            if r.status == "queued" and named is not None and named.startswith(prefix):
                await manager.runs.finish(r.id, "failed", f"worker {credential} was removed before the run started")
            elif r.status in ACTIVE and r.worker_id and r.worker_id.startswith(prefix):
                await manager.runs.finish(r.id, "interrupted", f"worker {credential} was removed")
        self.departed.pop(credential, None)
        self.one_shot_since.pop(credential, None)
        self.instance_names = {k: v for k, v in self.instance_names.items() if not k.startswith(prefix)}

    def set_drain(self, credential: str, drain: bool, manager: ManagerPort) -> None:
        """Drain is the credential's: it applies to every instance."""
        # The credential's own executor (a one-shot agent without an instance ID) and its instances'.
        own = manager.runs.executors.get(credential)
        for ex in ([own] if own is not None else []) + manager.runs.instances_of(credential):
            if getattr(ex, "credential", None) == credential and getattr(ex, "one_shot", False):
                ex.drained = drain


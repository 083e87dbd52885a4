"""Published apps served on this worker (docs/apps.md): the agent's side of ``app_invoke`` and ``app_retire``.

The control plane sends each invoke of an app placed here (``serve_on``) over the agent's own connection
(the worker opens no port) as the caller's inputs, with the version's job (its graph, its files) until this
agent has prepared the version. The agent runs it on the version's warm process
(:class:`cdui.run.serving.ServingPool`, the same as the control plane's own) and answers ``app_answer`` with
the run's result and what its GraphOutputs gave; an invoke without a job for a version not prepared here is
answered ``app_not_prepared`` (the control plane sends it again with the job).

A version is **prepared** once, at its first invoke here: its job's files (the weights the version keeps,
``models/app-weights/<sha256>/<name>``) are fetched as a transfer run's inputs are, by the control plane's
download route, each checked against its sha256 and kept in the agent's cache; the job is then laid out
for this machine (its own folders, its own recorded-outputs rules), and only the inputs change between
invokes. The control plane names which file to fetch; nothing here opens a path it names outside the
version's own data folder. A version that is retired (``app_retire``) is forgotten with its processes.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cdui.agent.run_files import run_files
from cdui.core.errors import CduiError
from cdui.run import outputs, runner
from cdui.run.serving import PoolLimits, ServingPool
from cdui.run.spare import SparePool
from cdui.wire import protocol
from cdui.wire.job import Job

log = logging.getLogger("cdui.agent.apps")

FOLDER = "agent-apps"  # under the agent's user data: one data folder per app version served here


@dataclass
class Prepared:
    """A version ready to serve here: its job laid out for this machine, and that job for each device."""
    job: Job
    folder: str
    jobs: dict[str, Job] = field(default_factory=dict)


class AgentApps:
    """This agent's serving processes and prepared versions. ``agent`` is the :class:`cdui.agent.agent.Agent`
    (its config, user data, session, credential and spare pool); ``on_change`` is told when a process starts
    or ends, so that the next heartbeat reports it."""

    def __init__(self, agent: Any, spares: SparePool, on_change: Callable[[], None] | None = None) -> None:
        self.agent = agent
        self.pool = ServingPool(spares, PoolLimits.from_config(agent.config), on_change)
        self.prepared: dict[tuple[str, int], Prepared] = {}
        self._preparing: dict[tuple[str, int], asyncio.Lock] = {}
        self._started = False

    async def close(self) -> None:
        await self.pool.close("the agent stopped")

    def report(self) -> list[dict[str, Any]] | None:
        """The heartbeat's ``serving``: None until this agent first served an app, then every process."""
        if not self._started:
            return None
        return [{k: p[k] for k in ("slug", "version", "device", "pid", "state")} for p in self.pool.describe()]

    async def invoke(self, msg: protocol.AppInvoke) -> protocol.AppAnswer:
        if not self._started:
            self.pool.start()
            self._started = True
        try:
            job = await self._job(msg)
            if job is None:
                return protocol.AppAnswer(msg.request_id, error={
                    "code": "app_not_prepared", "message": f"worker {self.agent.name} has not prepared app "
                    f"{msg.slug!r} version {msg.version}: send the invoke with the version's job",
                    "hint": None, "details": None})
            result, call = await self.pool.run(msg.slug, msg.version, msg.device, job, msg.inputs, msg.timeout_s)
        except CduiError as exc:
            code = exc.code if exc.code in protocol.APP_ERROR_CODES else "app_failed"
            return protocol.AppAnswer(msg.request_id, error={"code": code, "message": exc.message[:protocol.MAX_TEXT],
                                                             "hint": exc.hint, "details": exc.details})
        except Exception as exc:  # noqa: BLE001 - one invoke's failure is its answer, never the agent's end
            log.exception("app %s v%d: invoke failed", msg.slug, msg.version)
            return protocol.AppAnswer(msg.request_id, error={
                "code": "app_failed", "message": f"the worker could not serve the invoke: {type(exc).__name__}: "
                                                 f"{str(exc)[:2000]}", "hint": None, "details": None})
        res = {"status": str(result.get("status") or "failed"), "error": _text(result.get("error")),
               "node_id": _text(result.get("node_id"))}
        return protocol.AppAnswer(msg.request_id, result=res, outputs=call.outputs, output_error=call.output_error)

    async def _job(self, msg: protocol.AppInvoke) -> Job | None:
        """The version's job laid out here for the invoke's device; None: the version is not prepared here and
        the invoke does not carry its job."""
        key = (msg.slug, msg.version)
        ready = self.prepared.get(key)
        if ready is None:
            if msg.job is None:
                return None
            async with self._preparing.setdefault(key, asyncio.Lock()):
                ready = self.prepared.get(key)
                if ready is None:
                    ready = await self._prepare(msg, msg.job)
                    self.prepared[key] = ready
        got = ready.jobs.get(msg.device)
        if got is None:
            _env, device = runner.run_env(msg.device)
            got = ready.jobs[msg.device] = replace(ready.job, slot_device=msg.device, process_device=device)
        return got

    async def _prepare(self, msg: protocol.AppInvoke, job: Job) -> Prepared:
        a = self.agent
        folder = f"app-{msg.slug}-v{msg.version}"
        log.info("app %s v%d: preparing to serve it here (%d weights file(s))", msg.slug, msg.version,
                 len(job.files.inputs))
        stop = asyncio.Event()

        def record(kind: str, data: dict[str, Any]) -> None:
            log.info("app %s v%d: %s", msg.slug, msg.version, data.get("message", kind))

        files = run_files(folder, job.files, a.user_data / FOLDER, a.labels(), getattr(a, "session", None),
                          a.control, a.credential, a.grace_s, record, stop)
        try:
            local = files.job_for_this_machine(job, a.config)
            local = outputs.for_this_machine(local, a.user_data, a.config)
            await files.fetch_inputs()
        except Exception as exc:
            raise CduiError("app_prepare_failed", f"worker {a.name} could not prepare app {msg.slug!r} version "
                            f"{msg.version}: {exc}", hint="see the worker's log (cdui logs --worker NAME)",
                            status=503) from None
        return Prepared(local, folder)

    async def release_idle(self, msg: protocol.AppReleaseIdle) -> None:
        await self.pool.end_idle(msg.idle_s, lambda device: device in msg.devices)

    async def retire(self, msg: protocol.AppRetire) -> None:
        await self.pool.retire(msg.slug, msg.keep)
        live = {(p["slug"], p["version"]) for p in self.pool.describe()}
        for key in [k for k in self.prepared if k[0] == msg.slug and k[1] != msg.keep]:
            gone = self.prepared.pop(key)
            self._preparing.pop(key, None)
            # Its weights stay in the agent's cache (by sha256); the copies laid out for it go, unless a process
            # of it still answers an invoke (it may not have read them yet): those stay, laid out again over
            # themselves if the version is served here again.
            if key not in live:
                await asyncio.to_thread(shutil.rmtree, self.agent.user_data / FOLDER / "agent-runs" / gone.folder,
                                        True)
        if msg.keep is None:
            self.pool.forget_app(msg.slug)


def _text(v: Any) -> str | None:
    return None if v is None else str(v)[:protocol.MAX_TEXT]

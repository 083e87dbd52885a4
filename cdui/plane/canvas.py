"""The canvas's per-tab processes, on the control plane (docs/canvas.md).

A canvas Run (``POST /api/canvas/run``) is an ordinary stored run (target local, ``options.canvas``
naming its tab) whose graph runs in its tab's **canvas process** (:mod:`cdui.run.canvas_proc`): a
run process forked from the zygote (or started fresh) that stays alive between the tab's Runs and
keeps their execution cache and kept weights. This module owns those processes:

- one per tab, started at the tab's first Run (or when its Run asks another device), with at most
  ``CODEFYUI_CANVAS_MAX_PROCESSES`` alive: starting one more ends the least recently used idle one;
- it ends after ``CODEFYUI_CANVAS_IDLE_TIMEOUT_S`` idle, when its resident memory is above
  ``CODEFYUI_CANVAS_MAX_RSS_MB`` as a run ends, on ``DELETE /api/canvas/{tab}``, and with the server;
  its end (or its crash) loses only its cache and weights, never a stored run: the tab's next Run
  starts a new one;
- a run on it keeps the run-process rules: its events, log, outputs and end are those of any local
  run (the same recorder, :class:`cdui.run.runner.RunHandle`); its job and secrets go down the
  process's stdin; Stop asks the graph to stop and kills the process after the stop grace (the run
  then ends ``interrupted``, and says the cache and weights went with it).

Slots: a canvas run never waits in the run queue (a 10,000-run backlog must not hold up the tab's
Run): it starts at once, and holds a slot of its local device while it runs, so queued local runs
wait for it as for any local run.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from cdui.core.diskfull import DiskFull
from cdui.core.errors import CduiError
from cdui.core.private import open_private_append
from cdui.core.project import env_secrets
from cdui.graph.secrets import redact_text
from cdui.plane.runs import CP, LocalExecutor, RunService
from cdui.plane.sched.placement import FilePlan
from cdui.plane.sched.queue import Placement
from cdui.plane.store import Run
from cdui.run import canvas_proc, outputs, runner
from cdui.run.spare import RunProcess, exit_text
from cdui.wire.devicesets import device_matches
from cdui.wire.event import Event

log = logging.getLogger(__name__)

TAB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
RESET_TIMEOUT_S = 30.0
SWEEP_EVERY_S = 5.0
LOST = "its execution cache and kept weights are gone; the tab's next Run starts a new canvas process"


def check_tab(tab: Any) -> str:
    if not isinstance(tab, str) or not TAB_ID.match(tab):
        raise CduiError("bad_tab", f"tab id {tab!r} is not valid: it must be 1 to 64 letters, digits, '-' or '_'",
                        hint='give the editor tab\'s id, e.g. {"tab": "tab-1", ...}')
    return tab


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class CanvasRun(runner.RunHandle):
    """One run on a canvas process: the run recorder of a local run, on a process that outlives it."""

    def __init__(self, run_id: str, on_events: runner.EventSink, log_path: Path, secrets: list[Any],
                 process: CanvasProcess) -> None:
        super().__init__(run_id, on_events, log_path, secrets)
        self.process = process
        self._log: Any = None

    async def begin(self, job: Any, device: str) -> None:
        self.outputs_write_timeout = runner._write_timeout(job)
        self.open()
        self.proc = self.process.proc
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open_private_append(self.log_path)
        self.record("status", {"status": "running", "pid": self.proc.pid, "device": job.slot_device})
        self.record("log", {"message": f"on the tab's canvas process {self.proc.pid} "
                                       f"({'kept from an earlier Run' if self.process.runs else 'new'})",
                            "level": "info"})
        self.process.runs += 1
        assert self.proc.stdin
        try:
            # The job goes down the process's own pipe, secrets included, as to any run process.
            # The open project's .env too, as a run process gets it (cdui/run/runner.py).
            sent = replace(job, process_device=device, env_secrets=env_secrets())
            self.proc.stdin.write((canvas_proc.JOB + sent.to_json() + "\n").encode())
            await self.proc.stdin.drain()
            if self.stop_requested:
                self.proc.stdin.write(b"stop\n")
                await self.proc.stdin.drain()
                self._stop_task = asyncio.create_task(self._kill_after(self.stop_grace))
        except (ConnectionError, RuntimeError):
            pass  # the process is gone: its watch ends this run

    def stderr_line(self, text: str) -> None:
        text = redact_text(text, self.secrets)
        if self._log is not None:
            self._log.write((text + "\n").encode())
            self._log.flush()
        if text.strip():
            self.record("log", {"message": text[:runner.MAX_LOG_LINE], "level": "info", "stream": "stderr"})

    async def end(self, final: dict[str, Any]) -> None:
        if self.done or self._closed:
            return
        if self._stop_task is not None:
            self._stop_task.cancel()  # the process lives on: the kill was for this run only
        if self._log is not None:
            self._log.close()
            self._log = None
        await self._close(final)


class CanvasProcess:
    """A tab's canvas process, seen from the control plane."""

    def __init__(self, tab: str, slot: str, proc: RunProcess) -> None:
        self.tab = tab
        self.slot = slot
        self.proc = proc
        self.current: CanvasRun | None = None
        self.last_used = time.monotonic()
        self.stats: dict[str, Any] = {"cache_entries": 0, "cache_bytes": 0, "weights": 0, "weights_bytes": 0}
        self.runs = 0
        self.ending: str | None = None  # why the control plane ended it, when it did
        self._resets: list[asyncio.Future[dict[str, Any]]] = []
        self.exited = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.exited.is_set()

    @property
    def busy(self) -> bool:
        return self.current is not None and not self.current.done

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr())]
        self.tasks.append(asyncio.ensure_future(self._watch()))

    async def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue  # longer than any event may be: dropped
            if not line:
                return
            try:
                ev = json.loads(line)
                kind = str(ev["kind"])
            except (ValueError, KeyError, TypeError):
                ev, kind = None, ""
            if kind == "canvas_stats":
                self.stats = dict(ev["data"])
                continue
            if kind == "canvas_reset":
                data = dict(ev["data"])
                self.stats = {k: data[k] for k in self.stats if k in data}
                for fut in self._resets:
                    if not fut.done():
                        fut.set_result(data)
                self._resets.clear()
                continue
            run = self.current
            if run is None or run.done:
                if ev is None or kind == "log":
                    log.info("canvas process %s (tab %s): %s", self.proc.pid, self.tab, line[:500])
                continue
            run._event_line(line.rstrip(b"\n"), ev if ev is not None else runner._NOT_DECODED)
            if run.result is not None:
                self.current = None
                self.last_used = time.monotonic()
                await run.end({"status": run.result.get("status", "failed"), "error": run.result.get("error")})

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode(errors="replace").rstrip("\n")
            run = self.current
            if run is not None and not run.done:
                run.stderr_line(text)
            elif text.strip():
                log.info("canvas process %s (tab %s): %s", self.proc.pid, self.tab, text[:1000])

    async def _watch(self) -> None:
        rc = await self.proc.wait()
        await asyncio.gather(*self.tasks[:2], return_exceptions=True)
        self.exited.set()
        for fut in self._resets:
            if not fut.done():
                fut.set_exception(CduiError("canvas_gone", f"the canvas process of tab {self.tab!r} ended "
                                            "before it answered", hint="Run again: the tab gets a new process"))
        run, self.current = self.current, None
        if run is None or run.done:
            return
        final: dict[str, Any]
        if run.killed:
            final = {"status": "interrupted",
                     "error": f"the run did not stop within {run.stop_grace:.0f} s and was killed with the tab's "
                              f"canvas process; {LOST}"}
        elif self.ending:
            final = {"status": "interrupted", "error": f"{self.ending}; {LOST}"}
        elif run.result is not None:
            final = {"status": str(run.result.get("status", "failed")), "error": run.result.get("error")}
        else:
            final = {"status": "failed", "error": f"the canvas {exit_text(self.proc, rc)}; {LOST}"}
        if final["status"] != "succeeded":
            run.record("run_warning", {"kind": "canvas_process_lost",
                                       "message": f"the tab's canvas process ended during this run; {LOST}"})
        await run.end(final)

    def kill(self, why: str) -> None:
        self.ending = self.ending or why
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def reset_weights(self) -> int:
        assert self.proc.stdin is not None
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._resets.append(fut)
        try:
            self.proc.stdin.write((canvas_proc.RESET + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            self._resets.remove(fut)
            return 0
        try:
            data = await asyncio.wait_for(fut, RESET_TIMEOUT_S)
        except TimeoutError:
            raise CduiError("canvas_timeout", f"the canvas process of tab {self.tab!r} did not answer the reset "
                            f"within {RESET_TIMEOUT_S:.0f} s", hint=f"end it with DELETE /api/canvas/{self.tab}",
                            status=504) from None
        return int(data.get("reset", 0))

    def describe(self) -> dict[str, Any]:
        return {"tab": self.tab, "pid": self.proc.pid, "device": self.slot,
                "state": "running" if self.busy else "idle",
                "idle_s": 0.0 if self.busy else round(time.monotonic() - self.last_used, 1),
                "rss_bytes": _rss_bytes(self.proc.pid), "cache_entries": self.stats.get("cache_entries", 0),
                "cache_bytes": self.stats.get("cache_bytes", 0), "weights": self.stats.get("weights", 0),
                "run_id": self.current.run_id if self.busy and self.current is not None else None}


class CanvasManager:
    def __init__(self, service: RunService) -> None:
        self.service = service
        cfg = service.config
        self.max_processes = max(1, int(cfg["CODEFYUI_CANVAS_MAX_PROCESSES"]))
        self.idle_timeout = float(cfg["CODEFYUI_CANVAS_IDLE_TIMEOUT_S"])
        self.max_rss = int(cfg["CODEFYUI_CANVAS_MAX_RSS_MB"]) * 1024 * 1024
        self.cache_max = int(cfg["CODEFYUI_CANVAS_CACHE_MAX_MB"]) * 1024 * 1024
        self.procs: dict[str, CanvasProcess] = {}
        self.starting: set[str] = set()  # tabs whose Run is being set up
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def close(self) -> None:
        """Stop the running canvas runs (the stop grace), then end every canvas process."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        grace = float(self.service.config["CODEFYUI_SHUTDOWN_GRACE_S"])
        waits = []
        for p in list(self.procs.values()):
            if p.busy and p.current is not None:
                p.current.stop(grace)
                waits.append(p.current.wait())
        if waits:
            await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=grace + 5)
        for p in list(self.procs.values()):
            await self._end(p, "the server stopped")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(SWEEP_EVERY_S, max(0.5, self.idle_timeout / 4)))
            now = time.monotonic()
            for p in list(self.procs.values()):
                if not p.alive:
                    self._forget(p)
                elif not p.busy and p.tab not in self.starting and now - p.last_used > self.idle_timeout:
                    log.info("canvas process %s of tab %s was idle %.0f s: ended", p.proc.pid, p.tab,
                             now - p.last_used)
                    await self._end(p, "idle")

    def _forget(self, p: CanvasProcess) -> None:
        if self.procs.get(p.tab) is p:
            del self.procs[p.tab]

    async def _end(self, p: CanvasProcess, why: str) -> None:
        self._forget(p)
        if p.proc.stdin is not None:
            with contextlib.suppress(Exception):
                p.proc.stdin.close()
        p.kill(why)
        await p.exited.wait()

    async def _process(self, tab: str, slot: str) -> CanvasProcess:
        p = self.procs.get(tab)
        if p is not None and p.alive and p.slot == slot:
            return p
        if p is not None:
            await self._end(p, f"the tab's Run asked device {slot}, its process ran on {p.slot}")
        while len(self.procs) >= self.max_processes:
            idle = [q for q in self.procs.values() if not q.busy and q.tab not in self.starting]
            if not idle:
                raise CduiError("canvas_limit", f"{len(self.procs)} canvas processes are running a Run each, the "
                                f"most CODEFYUI_CANVAS_MAX_PROCESSES allows",
                                hint="wait for one of those Runs to end, stop one, or raise "
                                     "CODEFYUI_CANVAS_MAX_PROCESSES", status=409)
            oldest = min(idle, key=lambda q: q.last_used)
            log.info("canvas process %s of tab %s ended: %d processes is the limit and it was the least "
                     "recently used", oldest.proc.pid, oldest.tab, self.max_processes)
            await self._end(oldest, "the least recently used of too many canvas processes")
        env, _device = runner.run_env(slot)
        proc = await self.service.spares.process(*runner.process_shape(), env)
        hello = {"tab": tab, "cache_max_bytes": self.cache_max}
        assert proc.stdin is not None
        proc.stdin.write((canvas_proc.HELLO + json.dumps(hello) + "\n").encode())
        await proc.stdin.drain()
        p = CanvasProcess(tab, slot, proc)
        p.start()
        self.procs[tab] = p
        return p

    # -- the routes' calls ------------------------------------------------------
    def _slot(self, wanted: str | None) -> str:
        local = self.service.executors.get("local")
        devices = local.devices() if local is not None else ["cpu"]
        fits = [d for d in devices if device_matches(wanted, d)]
        if wanted in (None, "", "auto"):
            fits.sort(key=lambda d: (d == "cpu", d))
        if not fits:
            raise CduiError("bad_device", f"device {wanted!r} is not one of the control plane's: "
                            f"{', '.join(devices)}", hint="leave device out, or name one of those")
        return fits[0]

    async def run(self, tab: Any, graph: Any, persist_weights: Any, record_outputs: Any,
                  device: Any = None) -> dict[str, Any]:
        check_tab(tab)
        for name, value in (("persist_weights", persist_weights), ("record_outputs", record_outputs)):
            if not isinstance(value, bool):
                raise CduiError("bad_request", f"{name}={value!r} is not true or false",
                                hint=f'give "{name}": true or false')
        if device is not None and not isinstance(device, str):
            raise CduiError("bad_request", f"device={device!r} is not a device name",
                            hint='leave it out, or give e.g. "cpu" or "cuda:0"')
        self._check_free(tab)
        self.starting.add(tab)
        try:
            return await self._run(tab, graph, persist_weights, record_outputs, device)
        finally:
            self.starting.discard(tab)

    def _check_free(self, tab: str) -> None:
        p = self.procs.get(tab)
        if tab in self.starting or (p is not None and p.busy):
            going = p.current.run_id if p is not None and p.busy and p.current is not None else None
            raise CduiError("canvas_busy", f"tab {tab!r} has a Run going{f' (run {going})' if going else ''}",
                            hint=f"wait for it to end, or stop it: POST /api/canvas/{tab}/stop", status=409)

    async def _run(self, tab: str, graph: Any, persist: bool, record: bool, device: str | None) -> dict[str, Any]:
        svc = self.service
        if self._closing:
            raise CduiError("shutting_down", "the server is stopping", hint="Run again once it is back", status=503)
        if svc.store.full:
            err = svc.store.disk_full_error()
            raise CduiError("disk_full", f"run refused: {err.message}", hint=err.hint, status=507)
        options: dict[str, Any] = {"target": "local", "record_outputs": record}
        if device:
            options["device"] = device
        a = await svc.admit(graph, options)
        slot = self._slot(a.options.device)
        now = svc.clock.time()
        run_id = uuid.uuid4().hex[:12]
        opts = a.options.stored(a.files.to_json(), bool(a.secrets), svc.config["CODEFYUI_GRAPH_MAX_NODES"])
        opts["canvas"] = tab
        opts["persist_weights"] = persist
        run = Run(id=run_id, name=(graph.get("name") if isinstance(graph, dict) else None), status="queued",
                  target=a.options.target, options=opts, graph=a.stored_graph, created_at=now,
                  queue_reason="starting on its tab's canvas process")
        await svc.store.create_run(run)
        if a.secrets:
            svc.secrets[run_id] = a.secrets
        await svc.record_events(run_id, CP, [Event("status", {"status": "queued"}, now)])
        try:
            stored = await svc.store.claim_queued_graph(run_id, "local", slot, svc.clock.time())
            if stored is None:
                await svc.finish(run_id, "cancelled", "stopped before it started")
                return {"run_id": run_id, "tab": tab}
            svc.adopt(run_id, "local", slot, opts)  # it holds its slot while it runs: queued local runs wait
            backend = "mount" if FilePlan.from_json(opts.get("files")).uses_files else None
            job = svc.build_job(replace(run, graph=stored), Placement("local", slot, backend))
            job = outputs.for_this_machine(job, svc.config.user_data, svc.config)
            p = await self._process(tab, slot)
            handle = CanvasRun(run_id, self._sink(run_id), svc.config.user_data / "logs" / "runs" / f"{run_id}.log",
                               job.secret_pairs(), p)
            local = svc.executors.get("local")
            if isinstance(local, LocalExecutor):
                local.handles[run_id] = handle  # POST /api/runs/{id}/stop and the server's stop find it there
            p.current = handle
            _env, proc_device = runner.run_env(slot)
            await handle.begin(job, proc_device)
            if run_id in svc.stop_pending:
                handle.stop(svc.stop_grace)
            svc.spawn(self._after(p, handle))
        except Exception as exc:
            if not isinstance(exc, CduiError):
                log.exception("could not start canvas run %s", run_id)
            await svc.finish(run_id, "failed", f"could not start the run on its tab's canvas process: {exc}")
            raise
        return {"run_id": run_id, "tab": tab}

    def _sink(self, run_id: str) -> runner.EventSink:
        svc = self.service

        async def sink(events: list[dict[str, Any]]) -> None:
            if run_id in svc.abandoned:
                return
            try:
                await svc.record_events(run_id, "local", [Event.from_wire(e) for e in events])
            except DiskFull as err:
                await svc.fail_for_full_disk(run_id, err)
        return sink

    async def _after(self, p: CanvasProcess, handle: CanvasRun) -> None:
        await handle.wait()
        local = self.service.executors.get("local")
        if isinstance(local, LocalExecutor):
            local.handles.pop(handle.run_id, None)
        self.service.abandoned.discard(handle.run_id)
        p.last_used = time.monotonic()
        rss = _rss_bytes(p.proc.pid) if p.alive else None
        if self.max_rss > 0 and rss is not None and rss > self.max_rss and not p.busy:
            log.warning("canvas process %s of tab %s holds %d MB after run %s, over CODEFYUI_CANVAS_MAX_RSS_MB=%d: "
                        "ended", p.proc.pid, p.tab, rss // 2**20, handle.run_id, self.max_rss // 2**20)
            await self._end(p, "over its memory bound")

    async def stop(self, tab: str) -> dict[str, Any]:
        check_tab(tab)
        p = self.procs.get(tab)
        if p is None or not p.busy or p.current is None:
            raise CduiError("not_found", f"tab {tab!r} has no Run going", hint="nothing to stop", status=404)
        run_id = p.current.run_id
        await self.service.stop(run_id)
        return {"run_id": run_id}

    async def reset_weights(self, tab: str) -> dict[str, Any]:
        check_tab(tab)
        p = self.procs.get(tab)
        if p is None or not p.alive:
            return {"tab": tab, "reset": 0}  # no process: nothing is kept
        if p.busy:
            self._check_free(tab)
        return {"tab": tab, "reset": await p.reset_weights()}

    async def delete(self, tab: str) -> dict[str, Any]:
        check_tab(tab)
        p = self.procs.get(tab)
        if p is None:
            raise CduiError("not_found", f"tab {tab!r} has no canvas process", hint="list them: GET /api/canvas",
                            status=404)
        pid = p.proc.pid
        await self._end(p, f"its canvas process was ended (DELETE /api/canvas/{tab})")
        return {"tab": tab, "ended": pid}

    def describe(self) -> dict[str, Any]:
        return {"tabs": [p.describe() for p in sorted(self.procs.values(), key=lambda q: q.tab) if p.alive]}


CANVAS: web.AppKey[CanvasManager] = web.AppKey("canvas")

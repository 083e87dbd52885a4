"""The run subprocess: ``python -m cdui.run.runproc``.

Protocol with its parent (:mod:`cdui.run.runner`):

- stdin, first line: the job as JSON (:class:`cdui.wire.job.Job`, read back by
  ``Job.from_json``). Secrets arrive only here, on the pipe.
  ``process_device`` is the device nodes use in this process (``cuda:0``
  for any CUDA slot, see :func:`cdui.run.runner.map_slot_device`); ``slot_device``
  is the slot's name, used in messages.
  Later lines: ``stop`` asks the run to stop (nodes see ``ctx.should_stop()``).
- end of stdin (the launcher is gone) asks the same, and after
  :data:`ORPHAN_GRACE_S` the process kills its own process group: no one else
  is left to end a node that ignores the stop.
- SIGTERM asks the same as ``stop``: a batch system (SLURM at a job's time
  limit, ``scancel``) signals every process of the job, this one included,
  and the run must still end through its nodes (the interrupt checkpoint).
- fd 1 (stdout): one JSON event per line ``{"kind", "data", "at"}``; the last
  one has kind ``result`` (``{"status", "error"}``). Anything a node or library
  prints is moved to stderr so it cannot corrupt the event stream. While a run
  logs flat out, lines are written in batches, none held more than a few ms
  (:class:`_EventPipe`); otherwise each at once, the ``result`` line always.
- stderr: free text, kept in the run's log.

``python -m cdui.run.runproc --zygote`` is a zygote (:mod:`cdui.run.zygote`, owned
by :mod:`cdui.run.spare`): it imports torch and the built-in node modules, none
of which initialises CUDA, then forks one child per run; the child sets its
own ``CUDA_VISIBLE_DEVICES`` (CUDA reads it only when it first initialises)
and then runs the job exactly as a fresh process. Plugin and custom-node
folders are loaded after the job, as in a fresh process.

A run process ends with :func:`cdui.run.zygote.exit_now` once its result is
out, without the interpreter's teardown.

Every event has secret values replaced by ``***`` in its decoded data (keys
included) before it is encoded, so escaping cannot hide a secret from the mask.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdui.core.layout import Layout
from cdui.graph.context import RunContext, RunStopped
from cdui.graph.executor import Executor, NodeFailed
from cdui.graph.model import DEFAULT_MAX_NODES
from cdui.graph.secrets import environment_secrets, fill_secrets, project_secrets, redact_text, redact_value
from cdui.graph.validate import Plan, preflight_errors, validate_graph
from cdui.nodes.base import forget_package_lookups
from cdui.nodes.builtin.graph_io import GRAPH_OUTPUT_EVENT
from cdui.nodes.registry import Registry, build_registry
from cdui.run import canvas_proc, outputs, served, zygote
from cdui.run.catalog import installation_commit, node_catalog, run_facts
from cdui.wire.devicesets import process_devices
from cdui.wire.devicesets import run_facts as device_facts
from cdui.wire.event import encode_basestring_ascii as _escape
from cdui.wire.event import event_json, event_json_strict
from cdui.wire.job import Job, JobError

# Event lines are written in batches while a run logs flat out (see _EventPipe).
EVENTS_BUFFER = 1 << 16  # bytes of events held before a write to the pipe
FLUSH_EVERY_S = 0.005  # the longest a line waits in the buffer while the run keeps logging
BURST = 16  # lines written one by one in each such window before the rest wait for its end
# A run whose launcher is gone gets the launcher's own stop grace (cdui.run.runner.STOP_GRACE_S) to end
# through its nodes before it kills itself.
ORPHAN_GRACE_S = 10.0


def main(argv: list[str] | None = None) -> int:
    # torch warns at import when numpy is absent; numpy is not a dependency of ours.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    if "--zygote" in (sys.argv[1:] if argv is None else argv):
        return zygote.serve(_warm, _run_forked)
    return _run()


def _run() -> int:
    events_fd = os.dup(1)
    os.dup2(2, 1)  # print() from nodes goes to stderr from now on
    sys.stdout = sys.stderr
    out = _EventPipe(os.fdopen(events_fd, "w", buffering=EVENTS_BUFFER, encoding="utf-8"))
    atexit.register(out.flush)  # the process ends by os._exit (zygote.exit_now): nothing unflushed stays behind
    secrets: list[Any] = []

    emit = _Emitter(out, secrets)
    emit_held = emit.held

    first = sys.stdin.readline()
    if not first:
        return 2
    if first.startswith(canvas_proc.HELLO):
        # A canvas process: one job after another, keeping its execution cache and weights between them.
        return canvas_proc.serve(first, emit, secrets, _run_job, _kill_own_group,
                                 lambda vid, vjob: _Served(vid, vjob, emit_held))
    try:
        job = Job.from_json(first)
    except JobError as exc:
        emit("result", {"status": "failed", "error": f"the run process could not read its job: {exc}"})
        return 0
    # The machine's own API keys too: a node may send one (LLMChat) and a server may echo it back.
    secrets.extend([*job.secret_pairs(), *environment_secrets(os.environ), *project_secrets(job.env_secrets)])
    # The project's .env, as CodefyUI gives it to nodes: in the environment, a value the machine's own
    # environment already sets winning. Only this run's process ever holds it there.
    for key, value in job.env_secrets.items():
        os.environ.setdefault(key, value)
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                stop.set()
        # The parent closed the pipe: it is gone (killed, say, by `cdui stop` after its 2 s), so
        # stop too. Nobody is left to kill a node that ignores the stop after the grace, and an
        # orphan must not keep a GPU or its data loaders: the process ends its own group then.
        stop.set()
        time.sleep(ORPHAN_GRACE_S)
        _kill_own_group()

    threading.Thread(target=watch_stdin, daemon=True, name="stdin-watch").start()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    emit("result", _run_job(job, emit, stop))
    return 0


def _run_job(job: Job, emit: Any, stop: threading.Event,
             make_cache: canvas_proc.MakeCache | None = None) -> dict[str, Any]:
    """Run one job's graph, emitting its events; its result (``{"status", "error"}``, and the failed
    node's ``node_id``). ``make_cache``: a canvas process's cache for this run (cdui/run/canvas_proc.py)."""
    def run() -> dict[str, Any]:
        planned = _plan(job, emit)
        if isinstance(planned, dict):
            return planned
        return _execute(job, planned, planned.plan, emit, stop, make_cache)
    return _ended(run, job, emit, stop)


@dataclass(frozen=True)
class _Planned:
    """A job's graph checked and planned on this machine, with what running it needs."""
    layout: Layout
    registry: Any
    plan: Plan
    slot: str
    device: str


def _plan(job: Job, emit: Any) -> _Planned | dict[str, Any]:
    """The job's plan, or the failed result of a graph that is not valid here."""
    # The parent narrowed CUDA_VISIBLE_DEVICES to this run's card, so the slot's
    # own number (cuda:1) may not exist here; process_device is what does.
    slot = job.slot_device or "cpu"
    device = job.process_device or slot
    if job.layout is None:
        raise ValueError("the job names no layout: the launcher must fill in this machine's folders")
    layout = Layout.from_json(job.layout)
    if job.options.get(canvas_proc.SERVING):
        # An app's serving process (cdui/plane/apps.py): its nodes as they were at its first invoke, and
        # no fingerprint (an invoke is no stored run): both cost more than a small model's forward pass.
        registry = _serving_registry(job.custom_nodes_dir, job.plugins_dir, job.plugin_store)
    else:
        registry = build_registry(Path(job.custom_nodes_dir) if job.custom_nodes_dir else None,
                                  Path(job.plugins_dir) if job.plugins_dir else None,
                                  Path(job.plugin_store) if job.plugin_store else None)
        _report_facts(emit, registry, job.custom_nodes_dir, job.plugins_dir,
                      device_facts(slot, job.process_device), job.plugin_store)
    # The job was read from its own line: without secrets to put in, its graph needs no copy.
    graph = fill_secrets(job.graph, job.secret_pairs()) if job.secrets else job.graph
    # The limit the control plane checked the graph against, so a raised limit holds here too.
    plan, errors = validate_graph(graph, registry, max_nodes=job.graph_max_nodes or DEFAULT_MAX_NODES,
                                  layout=layout)
    if plan is None:
        return _invalid(errors)
    return _Planned(layout, registry, plan, slot, device)


def _invalid(errors: list[dict[str, Any]]) -> dict[str, Any]:
    msg = "; ".join(e["message"] for e in errors[:5])
    return {"status": "failed", "error": f"graph is not valid on this machine: {msg}"}


def _execute(job: Job, planned: _Planned, plan: Plan, emit: Any, stop: threading.Event,
             make_cache: canvas_proc.MakeCache | None, statuses: bool = True) -> dict[str, Any]:
    """Run ``plan`` (``planned``'s, or it with an invoke's inputs); the succeeded result, or it raises."""
    slot, device = planned.slot, planned.device
    ctx = RunContext(job.run_id, planned.layout, emit, device=device, stop_event=stop)
    ctx.device_set = process_devices(slot, job.process_device)  # ddp's world size
    if statuses:
        where = slot if device == slot else f"{slot} ({device} in the run's process)"
        emit("log", {"message": f"running {len(plan.order)} nodes on {where}", "level": "info"})
    cache = make_cache(job, planned.layout, device, emit) if make_cache is not None else None
    with outputs.recording(job, emit) as on_outputs:
        Executor(planned.registry, ctx, on_outputs, cache, statuses=statuses).run(plan)
    return {"status": "succeeded", "error": None}


def _ended(run: Callable[[], dict[str, Any]], job: Job, emit: Any, stop: threading.Event) -> dict[str, Any]:
    """``run()``'s result, or the result of what it raised."""
    secrets = job.secret_pairs()
    try:
        return run()
    except RunStopped:
        return {"status": "cancelled", "error": "stopped on request"}
    except NodeFailed as exc:
        emit("log", {"message": redact_text(exc.tb, secrets), "level": "error", "node_id": exc.node_id})
        return {**_failed(stop, str(exc)), "node_id": exc.node_id}
    except Exception as exc:  # anything else is a bug of ours; keep the traceback in the log
        emit("log", {"message": redact_text(traceback.format_exc(), secrets), "level": "error"})
        return _failed(stop, f"{type(exc).__name__}: {exc}")


class _Served:
    """A serving process's version (cdui/run/served.py): planned at its ``version`` line, run with each
    invoke's inputs. Only its ``graph_output`` events are written: the pool reads nothing else of an invoke,
    and each line it is sent costs both processes."""

    def __init__(self, version_id: str, job: Job, emit: Any) -> None:
        self.version_id, self.job = version_id, job
        self.emit = _outputs_only(emit)
        got: list[_Planned] = []

        def plan() -> dict[str, Any]:
            planned = _plan(job, self.emit)
            if isinstance(planned, dict):
                return planned
            got.append(planned)
            return {}
        # A version that cannot be planned here fails each of its invokes as a run of it would fail.
        failure = _ended(plan, job, self.emit, threading.Event())
        self.planned: _Planned | dict[str, Any] = got[0] if got else failure
        self.inputs = served.input_ids(got[0].plan) if got else frozenset()

    def run(self, invoke: served.Invoke, stop: threading.Event,
            make_cache: canvas_proc.MakeCache | None) -> dict[str, Any]:
        if invoke.version_id != self.version_id:
            return {"status": "failed", "error": f"this serving process serves {self.version_id!r}, not "
                                                 f"{invoke.version_id!r}: it was not given that version"}
        planned = self.planned
        if not isinstance(planned, _Planned):
            return planned

        def run() -> dict[str, Any]:
            plan = served.with_inputs(planned.plan, invoke.inputs, self.inputs)
            # What a node needs on this machine may have gone since the plan was made (a dataset's files).
            errors = preflight_errors(plan, planned.layout)
            if errors:
                return _invalid(errors)
            return _execute(self.job, planned, plan, self.emit, stop, make_cache, statuses=False)
        return _ended(run, self.job, self.emit, stop)


def _outputs_only(emit: Any) -> Callable[[str, dict[str, Any]], None]:
    def outputs_only(kind: str, data: dict[str, Any]) -> None:
        if kind == GRAPH_OUTPUT_EVENT:
            emit(kind, data)
    return outputs_only


class _Emitter:
    """``emit(kind, data)``: one event on the pipe, its secrets masked (``secrets`` is filled once the job
    is read). ``log`` writes a log event as ``emit`` would, with one format instead of the encoder."""

    def __init__(self, out: _EventPipe, secrets: list[Any]) -> None:
        self.out, self.secrets = out, secrets

    def encode(self, kind: str, data: dict[str, Any]) -> str:
        # Mask the decoded values first (escaping changes how a secret looks in
        # the line), then the line too, for what default=str turned into text.
        if self.secrets:
            return redact_text(_encode_event(kind, redact_value(data, self.secrets)), self.secrets)
        return _encode_event(kind, data)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        # The result is the last word: on the pipe before anything can end the process.
        self.out.write(self.encode(kind, data), now=(kind == "result"))

    def held(self, kind: str, data: dict[str, Any]) -> None:
        # An invoke's outputs go out with its result (one write, one wake of the pool): a process that dies
        # before its result fails the invoke whatever it had given.
        self.out.write(self.encode(kind, data), hold=True)

    def log(self, node_id: str | None, message: str, level: Any) -> None:
        """``RunContext.log``'s event: ``{"node_id"?, "message", "level"}``, written by ``emit`` where a
        secret is to be masked or a value is not the usual string."""
        if self.secrets or not node_id or type(node_id) is not str or type(level) is not str:
            data: dict[str, Any] = {"message": message, "level": level}
            self("log", {"node_id": node_id, **data} if node_id else data)
            return
        self.out.write(_log_line(node_id, message, level, time.time()))


def _log_line(node_id: str, message: str, level: str, at: float) -> str:
    """The line ``_encode_event("log", {"node_id", "message", "level"})`` writes, made by one format: the
    strings escaped by the function the encoder uses, the time written as its ``repr``, as the encoder does."""
    return _LOG_LINE % (_escape(node_id), _escape(message), _escape(level), at)


_LOG_LINE = '{"kind": "log", "data": {"node_id": %s, "message": %s, "level": %s}, "at": %r}\n'


class _EventPipe:
    """The event lines on their way to the launcher, written in batches while a run logs flat out.

    A line goes to the pipe at once unless this window of FLUSH_EVERY_S already had BURST such
    writes, or follows at once a window that had: a run that logs now and then (a node that logs,
    then crashes the process) leaves every line on the pipe as it is written. In a flood the rest
    of each window's lines wait in the buffer for the window's end, or for the flusher thread,
    which gets the interpreter at once when the run goes quiet and within the switch interval (a
    few ms) while it does not."""

    def __init__(self, out: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self.lock = threading.Lock()
        self.window = 0.0  # when this window began (monotonic)
        self.writes = 0  # lines flushed one by one in this window
        self.unflushed = threading.Event()
        threading.Thread(target=self._flush_batches, daemon=True, name="events-flush").start()

    def write(self, line: str, now: bool = False, hold: bool = False) -> None:
        """``now``: flushed at once; ``hold``: left in the buffer for the next line written ``now``."""
        with self.lock:
            self.out.write(line)
            if hold:
                return
            t = self.clock()
            if t - self.window >= FLUSH_EVERY_S:
                # A window that follows a full one at once is part of a flood: its lines wait in the
                # buffer from the first (written one by one, each was a read and a store job of its own
                # for the launcher). The first line after a quiet window is written at once again.
                flood = self.writes >= BURST and t - self.window < 2 * FLUSH_EVERY_S
                self.window, self.writes = t, BURST if flood else 0
            if now or self.writes < BURST:
                self.writes += 1
                self.out.flush()
                return
        if not self.unflushed.is_set():
            self.unflushed.set()

    def flush(self) -> None:
        with self.lock:
            self.out.flush()

    def _flush_batches(self) -> None:
        # At most one write a window: flushed at once, the flusher and the logging thread took turns for
        # the lock and the interpreter, so that a flood went to the pipe in a few dozen lines at a time,
        # each a read, a store job (and on an agent a spool write and a frame) of its own.
        flushed = 0.0
        while True:
            self.unflushed.wait()
            wait = flushed + FLUSH_EVERY_S - self.clock()
            if wait > 0:
                time.sleep(wait)
            self.unflushed.clear()
            with self.lock:
                self.out.flush()
            flushed = self.clock()


def _failed(stop: threading.Event, error: str) -> dict[str, str]:
    """The ending of a run that raised. Asked to stop (Stop, a disabled worker, SIGTERM), a run that then
    fails on its way out (an interrupt checkpoint it cannot write) ends ``cancelled`` as the stop asked;
    the failure stays in its error and its log."""
    if stop.is_set():
        return {"status": "cancelled", "error": f"stopped on request; while stopping: {error}"}
    return {"status": "failed", "error": error}


def _kill_own_group() -> None:
    """SIGKILL this process and what it started: its whole process group when it leads one
    (its launcher starts it in a session of its own), else just itself."""
    pid = os.getpid()
    try:
        if os.getpgrp() == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except OSError:
        os._exit(1)


def _warm() -> None:
    """What every run imports anyway, done in the zygote before any job arrives. None of it initialises CUDA."""
    import torch  # noqa: F401

    registry = Registry()
    registry.load_builtin()  # imports the built-in node modules; the run's registry is built after its job
    installation_commit()  # the fingerprint's commit is the imported code's
    # Describing the nodes looks each optional package up on sys.path: a first time costs tens of
    # milliseconds of path scanning, which every forked run would pay again.
    node_catalog(registry)


def _run_forked() -> int:
    """A run forked by the zygote: as a fresh process, but for what the zygote already did."""
    forget_package_lookups()
    return _run()


_REGISTRIES: dict[tuple[str | None, str | None, str | None], Any] = {}


def _serving_registry(custom_dir: str | None, plugins_dir: str | None, plugin_store: str | None) -> Any:
    """The node registry of a serving process, built at its first job and kept."""
    key = (custom_dir, plugins_dir, plugin_store)
    if key not in _REGISTRIES:
        _REGISTRIES[key] = build_registry(Path(custom_dir) if custom_dir else None,
                                          Path(plugins_dir) if plugins_dir else None,
                                          Path(plugin_store) if plugin_store else None)
    return _REGISTRIES[key]


def _report_facts(emit: Any, registry: Any, custom_dir: str | None, plugins_dir: str | None,
                  devices: dict[str, Any], plugin_store: str | None = None) -> None:
    """This process's own fingerprint and torch numerics, which replace the worker's for the run."""
    try:
        facts = run_facts(registry, Path(custom_dir) if custom_dir else None,
                          Path(plugins_dir) if plugins_dir else None, Path(plugin_store) if plugin_store else None)
    except Exception as exc:  # the facts describe the run; failing to gather them must not fail it
        emit("log", {"message": f"could not collect the run's fingerprint: {type(exc).__name__}: {exc}",
                     "level": "warning"})
        facts = {}
    emit("execution_facts", {**facts, "devices": devices})


def _encode_event(kind: str, data: dict[str, Any]) -> str:
    """One event line. NaN and infinities are not JSON: they travel as strings ("nan", "inf")."""
    event = {"kind": kind, "data": data, "at": time.time()}
    try:
        return _encode_strict(event) + "\n"
    except ValueError:  # a NaN or infinity somewhere (rare): walk the data once to replace them
        event["data"] = _json_safe(data)
        return _encode(event) + "\n"


# One C encoder each, made once (cdui/wire/event.py): json.dumps(default=...) builds a new encoder per
# call, which cost more than encoding a small event.
_encode_strict = event_json_strict
_encode = event_json


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


if __name__ == "__main__":
    zygote.exit_now(main())

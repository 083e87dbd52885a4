"""The studies' sampler process: Optuna's asking, telling, pruning and importances, in a child process of
the control plane (cdui/plane/studies.py, docs/sweeps.md "Studies").

Why a process: a TPE ask is milliseconds of Python and numpy; in a thread of the control plane it holds the
GIL that the event loop needs, so each trial's ask was added in full to a study's wall time. Here it runs
beside the loop, on another core where there is one.

Two ends in this module:

- :class:`SamplerProcess`, the control plane's end: one child, ``python -m cdui.plane.sampler_proc`` (a fresh
  interpreter: the control plane, which has an event loop and threads, is never forked without an exec),
  started at the first study call, never at start, so the control plane starts and runs sweeps without
  Optuna. Calls go over the child's stdin and stdout as length-prefixed pickles, read and written by the
  event loop itself (no thread: a ProcessPoolExecutor's feeder and manager threads cost the loop's GIL
  several times a pickle's own work per call). The child answers in the order it was asked, one call at a
  time, so the calls of all studies take turns and no Optuna object is used by two at once. When the child
  dies (a crash, a ``kill -9``) its stdout ends: every call waiting for it raises :class:`SamplerDied`, and the
  next call starts a fresh child with a new :attr:`SamplerProcess.generation`, where the caller rebuilds its
  study from the stored trials (:func:`load`). The child ends when its stdin closes: at the control plane's
  shutdown, or when the control plane died.
- The functions the child runs (:data:`CALLS`), on plain values only (a :class:`StudySpec`, numbers, dicts
  and :class:`StoredTrial`): no Optuna object crosses the pipe, and the control plane imports no Optuna. The
  child's only state is ``_STUDIES``, sweep id -> the in-memory Optuna study and its distributions; a call for
  a study this process has not loaded raises :class:`NotLoaded`. Each call returns its answer with the wall and
  CPU seconds it took here (:class:`Timed`), which the control plane adds up as ``sampler_s`` and
  ``sampler_cpu_s``.

Optuna is imported at the child's first call that needs it, so a missing Optuna (or a missing ``cmaes``)
reaches the caller as :class:`Unavailable`. The child imports nothing of the control plane beyond this module
and the study spec's shapes (:mod:`cdui.wire.studyspec`), and never torch.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import logging
import os
import pickle
import signal
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

from cdui.wire.studyspec import Dim, StudySpec

log = logging.getLogger(__name__)
T = TypeVar("T")
CLOSE_WAIT_S = 5.0   # a call in progress at shutdown (an importance fit) may finish; then the child is killed
STATES = ("running", "complete", "pruned", "fail")
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_HEAD = struct.Struct("!Q")   # each message: its length, then the pickle


# -- the values that cross the pipe ---------------------------------------------------------------
@dataclass(frozen=True)
class StoredTrial:
    """A trial as the store holds it: its state (one of :data:`STATES`), its value (complete ones), its params
    and the intermediate values its run streamed (step -> value)."""
    state: str
    value: float | None
    params: dict[str, Any]
    curve: dict[int, float]


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A call's answer, with the wall and CPU seconds it took in the sampler's process."""
    result: T
    wall_s: float
    cpu_s: float


class Unavailable(Exception):
    """Optuna, or a sampler's package, cannot be imported: (code, message, hint), an error for the API."""

    def __init__(self, code: str, message: str, hint: str) -> None:
        super().__init__(code, message, hint)
        self.code, self.message, self.hint = code, message, hint


class NotLoaded(Exception):
    """The study is not loaded in this process (it is a fresh one): load it from the stored trials first."""


class SamplerDied(Exception):
    """The sampler's process ended before it answered (the next call starts a fresh one)."""


class SamplerClosed(Exception):
    """The control plane is stopping: its sampler's process was stopped and no other is started."""


# -- the control plane's end ----------------------------------------------------------------------
@dataclass
class _Child:
    proc: asyncio.subprocess.Process
    generation: int
    waiting: collections.deque[asyncio.Future[tuple[str, Any]]] = field(default_factory=collections.deque)
    reader: asyncio.Task[None] | None = None
    closing: bool = False   # stopped by close(), not dead
    ended: bool = False     # its stdout ended: no call is sent to it any more


class SamplerProcess:
    """One child process for every study's Optuna calls, started at the first :meth:`call`, replaced at the
    first call after it died. Its :attr:`generation` counts the children started: a study loaded in another
    generation than the current one is loaded again before it is used."""

    def __init__(self) -> None:
        self._child: _Child | None = None
        self._starting = asyncio.Lock()
        self._closed = False
        self.generation = 0

    async def call(self, fn: Callable[..., Timed[T]], *args: Any) -> tuple[Timed[T], int]:
        """``fn(*args)`` (one of :data:`CALLS`) in the child, and the generation it ran in. Raises
        :class:`SamplerDied` when the child ended before answering, :class:`SamplerClosed` once :meth:`close`
        was called, or what ``fn`` raised."""
        child = self._child or await self._start()
        body = pickle.dumps((fn.__name__, args), pickle.HIGHEST_PROTOCOL)
        answer: asyncio.Future[tuple[str, Any]] = asyncio.get_running_loop().create_future()
        stdin = child.proc.stdin
        assert stdin is not None
        if child.ended or stdin.is_closing():
            raise SamplerDied(f"the sampler's process (pid {child.proc.pid}) is gone")
        child.waiting.append(answer)  # answers come in the order of the calls
        stdin.write(_HEAD.pack(len(body)) + body)
        try:
            await stdin.drain()
        except ConnectionError:
            pass  # it died: the reader fails the answer
        status, value = await answer
        if status == "err":
            raise value
        return value, child.generation

    async def _start(self) -> _Child:
        async with self._starting:
            if self._child is not None:
                return self._child
            if self._closed:
                raise SamplerClosed("the control plane is stopping; no study call is made")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cdui.plane.sampler_proc", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, cwd=PACKAGE_PARENT)
            if self._closed:  # closed while it started
                proc.kill()
                await proc.wait()
                raise SamplerClosed("the control plane is stopping; no study call is made")
            self.generation += 1
            child = _Child(proc, self.generation)
            child.reader = asyncio.ensure_future(self._read(child))
            self._child = child
            log.info("the studies' sampler process started (pid %d)", proc.pid)
            return child

    async def _read(self, child: _Child) -> None:
        """Hand each answer to the call waiting for it; when the child's stdout ends, fail the rest."""
        out = child.proc.stdout
        assert out is not None
        try:
            while True:
                (size,) = _HEAD.unpack(await out.readexactly(_HEAD.size))
                answer = pickle.loads(await out.readexactly(size))
                waiting = child.waiting.popleft()
                if not waiting.done():
                    waiting.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # The loop ends without close() (a test's, an error's): the child would wait on its stdin for as
            # long as this process holds it, and the wait below with it.
            child.closing = True
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            raise
        finally:
            child.ended = True
            if self._child is child:
                self._child = None
            while child.waiting:
                waiting = child.waiting.popleft()
                if not waiting.done():
                    waiting.set_exception(SamplerDied(f"the sampler's process (pid {child.proc.pid}) ended before "
                                                      "it answered"))
            code = await child.proc.wait()
            if not child.closing:
                log.warning("the studies' sampler process (pid %d, generation %d) ended with code %s; the next "
                            "study call starts a fresh one and rebuilds each study there from its stored trials",
                            child.proc.pid, child.generation, code)

    async def close(self) -> None:
        """Stop the child: it finishes the call in progress (at most :data:`CLOSE_WAIT_S`), else it is killed.
        No child is started after this."""
        self._closed = True
        child, self._child = self._child, None
        if child is None:
            return
        child.closing = True
        assert child.proc.stdin is not None
        child.proc.stdin.close()  # its next read ends, and so does it
        try:
            await asyncio.wait_for(asyncio.shield(child.proc.wait()), CLOSE_WAIT_S)
        except TimeoutError:
            log.warning("the studies' sampler process (pid %d) did not stop within %.0f s; killing it",
                        child.proc.pid, CLOSE_WAIT_S)
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
        if child.reader is not None:
            await child.reader


# -- the child's side -----------------------------------------------------------------------------
_STUDIES: dict[str, tuple[Any, dict[str, Any]]] = {}   # sweep id -> its optuna.Study, its params' distributions


def _timed(fn: Callable[[], T]) -> Timed[T]:
    t, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return Timed(result, time.perf_counter() - t, time.process_time() - cpu)


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise Unavailable("studies_unavailable", f"studies need Optuna, which this control plane's Python cannot "
                          f"import ({exc}); sweeps work without it",
                          "install it with `bin/cdui start --extras studies` (or pip install 'cdui[studies]'), "
                          "then try again") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _study(sweep_id: str) -> tuple[Any, dict[str, Any]]:
    got = _STUDIES.get(sweep_id)
    if got is None:
        raise NotLoaded(sweep_id)
    return got


def _distribution(optuna: Any, d: Dim) -> Any:
    dist = optuna.distributions
    if d.kind == "choice":
        return dist.CategoricalDistribution(d.choices)
    if d.kind == "int":
        return dist.IntDistribution(int(d.low), int(d.high), step=int(d.step or 1))
    return dist.FloatDistribution(d.low, d.high, step=d.step, log=d.log)


def _sampler(optuna: Any, spec: StudySpec, seed: int) -> Any:
    s = spec.sampler
    startup = s.get("startup_trials")
    if s["name"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s["name"] == "grid":
        return optuna.samplers.GridSampler({d.key: list(d.choices) for d in spec.dims}, seed=seed)
    if s["name"] == "cmaes":
        if importlib.util.find_spec("cmaes") is None:
            raise Unavailable("sampler_unavailable", "the cmaes sampler needs the cmaes package, which this "
                              "control plane's Python cannot import", "pip install cmaes into the control "
                              "plane's .venv, or use \"sampler\": \"tpe\"")
        return optuna.samplers.CmaEsSampler(seed=seed, **({"n_startup_trials": startup} if startup else {}))
    return optuna.samplers.TPESampler(seed=seed, **({"n_startup_trials": startup} if startup is not None else {}))


def _pruner(optuna: Any, spec: StudySpec) -> Any:
    p = spec.pruner
    if p["name"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.get("startup_trials", 5),
                                           n_warmup_steps=p.get("warmup_steps", 0))
    if p["name"] == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, p.get("warmup_steps", 0)) if
                                                      "warmup_steps" in p else "auto")
    return optuna.pruners.NopPruner()


def grid_attrs(study: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The grid sampler finds the points already visited by each trial's grid id: a rebuilt trial gets its own."""
    sampler = study.sampler
    names, grids = getattr(sampler, "_param_names", None), getattr(sampler, "_all_grids", None)
    if names is None or grids is None:
        return {}
    point = tuple(params.get(n) for n in names)
    for i, g in enumerate(grids):
        if tuple(g) == point:
            return {"grid_id": i, "search_space": getattr(sampler, "_search_space", {})}
    return {}


def check(spec: StudySpec) -> Timed[None]:
    """Raises :class:`Unavailable` when Optuna or the spec's sampler cannot be had here."""
    def fn() -> None:
        _sampler(_optuna(), spec, spec.seed)
    return _timed(fn)


def load(sweep_id: str, spec: StudySpec, trials: list[StoredTrial]) -> Timed[None]:
    """The study rebuilt from its stored trials (trial i is the i-th), replacing any loaded before.

    A rebuilt sampler continues from a seed of its own (the seed and the trials so far): the first seed
    again would draw the first trials' params again. Not the grid sampler: it gives trial N the N-th point
    of its seeded order, so it needs the first order back, and each rebuilt trial is matched to its point
    (:func:`grid_attrs`)."""
    def fn() -> None:
        optuna = _optuna()
        distributions = {d.key: _distribution(optuna, d) for d in spec.dims}
        grid = spec.sampler["name"] == "grid"
        study = optuna.create_study(direction="minimize" if spec.objective["goal"] == "min" else "maximize",
                                    sampler=_sampler(optuna, spec, spec.seed + (0 if grid else len(trials))),
                                    pruner=_pruner(optuna, spec))
        states = {"running": optuna.trial.TrialState.RUNNING, "complete": optuna.trial.TrialState.COMPLETE,
                  "pruned": optuna.trial.TrialState.PRUNED, "fail": optuna.trial.TrialState.FAIL}
        for t in trials:
            params = {k: t.params[k] for k in distributions if k in t.params}
            study.add_trial(optuna.trial.create_trial(
                state=states[t.state], value=t.value if t.state == "complete" else None, params=params,
                distributions=distributions, intermediate_values=t.curve,
                system_attrs=grid_attrs(study, params) if grid else {}))
        _STUDIES[sweep_id] = (study, distributions)
    return _timed(fn)


def ask(sweep_id: str) -> Timed[tuple[int, dict[str, Any]]]:
    """A new trial: (its number, its params). It stays running until told."""
    def fn() -> tuple[int, dict[str, Any]]:
        study, distributions = _study(sweep_id)
        trial = study.ask(distributions)
        return trial.number, dict(trial.params)
    return _timed(fn)


def tell(sweep_id: str, number: int, value: float | None, state: str) -> Timed[bool]:
    """Tell trial ``number`` how it ended (``complete`` with its value, ``pruned`` or ``fail``), only while it
    is running; whether it was told."""
    def fn() -> bool:
        optuna = _optuna()
        study, _ = _study(sweep_id)
        trials = study.get_trials(deepcopy=False)
        if number >= len(trials) or trials[number].state != optuna.trial.TrialState.RUNNING:
            return False
        if state == "complete" and value is not None:
            study.tell(number, value)
        else:
            study.tell(number, state=optuna.trial.TrialState.PRUNED if state == "pruned"
                       else optuna.trial.TrialState.FAIL)
        return True
    return _timed(fn)


def report(sweep_id: str, number: int, step: int, value: float) -> Timed[str]:
    """Report an intermediate value of trial ``number`` (once per step) and ask the pruner: ``prune``, ``keep``,
    ``pruned`` (it was pruned before) or ``not_running`` (ended, or no such trial)."""
    def fn() -> str:
        optuna = _optuna()
        study, _ = _study(sweep_id)
        trials = study.get_trials(deepcopy=False)
        frozen = trials[number] if number < len(trials) else None
        if frozen is None or frozen.state != optuna.trial.TrialState.RUNNING:
            return "pruned" if frozen is not None and frozen.state == optuna.trial.TrialState.PRUNED \
                else "not_running"
        trial = optuna.trial.Trial(study, frozen._trial_id)
        if step not in frozen.intermediate_values:
            trial.report(value, step)
        return "prune" if trial.should_prune() else "keep"
    return _timed(fn)


def importances(sweep_id: str) -> Timed[dict[str, float] | None]:
    """Each param's importance (fANOVA with a fixed seed: the same trials give the same answer at every read),
    or None where it cannot be had (e.g. every finished trial has the same params)."""
    def fn() -> dict[str, float] | None:
        optuna = _optuna()
        try:
            got = optuna.importance.get_param_importances(
                _study(sweep_id)[0], evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
        except (ValueError, RuntimeError):
            return None
        return {k: round(float(v), 6) for k, v in got.items()}
    return _timed(fn)


CALLS: dict[str, Callable[..., Timed[Any]]] = {
    f.__name__: f for f in (check, load, ask, tell, report, importances)}


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def main() -> int:
    """The child: answer each call read from stdin on stdout, in order, until stdin ends."""
    # A Ctrl-C in the control plane's terminal is the control plane's to handle (it closes this process's stdin
    # at its shutdown), not a traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    calls, answers = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever prints goes to the log, never into the answers
    while True:
        head = _read_exact(calls, _HEAD.size)
        body = _read_exact(calls, _HEAD.unpack(head)[0]) if head is not None else None
        if body is None:
            return 0
        name, args = pickle.loads(body)
        try:
            answer: tuple[str, Any] = ("ok", CALLS[name](*args))
        except Exception as exc:  # the caller's to judge: a missing package, a study not loaded, a bug
            answer = ("err", exc)
        try:
            out = pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            out = pickle.dumps(("err", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]} (unpicklable: {exc})")))
        answers.write(_HEAD.pack(len(out)) + out)
        answers.flush()


if __name__ == "__main__":
    # Run as the module's own name, not __main__: the answers' classes are unpickled by that name.
    from cdui.plane import sampler_proc
    raise SystemExit(sampler_proc.main())

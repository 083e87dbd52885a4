"""Studies: a sweep whose next variants Optuna chooses from the results so far (docs/sweeps.md, "Studies").

A study is stored as a sweep of kind ``study`` (:mod:`cdui.plane.store.sweeps`); each trial is one of its
variants, added when the sampler asks for it (:meth:`StudyRows.add_trial`, its index is the trial's number)
and released into an ordinary run by the sweep service, which marks the variant as its run in the
transaction that stores the run. So the control plane's own database is the study's storage, not a second
Optuna database beside it: the trial-to-run link is written with the run, a kill -9 at any moment leaves
each trial either waiting (released at the next start) or with its one run (adopted as any run is), and
Optuna itself needs no SQLAlchemy database.

Optuna runs in one child process, not here (:mod:`cdui.plane.sampler_proc`): its asks, tells, pruning
decisions and importance fits use that process's CPU and GIL, not the event loop's. The process is started
at the first study use (never at start: the control plane starts, and sweeps work, without Optuna) and holds
each study's Optuna object in memory, rebuilt from the stored trials (their params, values, and the
intermediate values their runs streamed, read back from the runs' metric events) the first time a study is
used in it. When that process dies, the next use starts a fresh one and rebuilds the study there: a trial the
dead process asked but that was not stored yet is not there, every stored one is, so no trial is lost or run
twice. This side keeps no Optuna object, only each study's spec, its lock (one call of a study at a time, so
that what the store holds and what the process holds agree) and the generation of the process it was loaded
in.

Asking ahead: while a study's recent trials are short (under AHEAD_BELOW_S, where the sampler's milliseconds
per trial would show in its wall time), it keeps a trial asked and stored as a waiting variant for each slot of
its parallelism, so that when trials end (instant ones end in bursts), the sweep service releases their
successors at once, while the sampler is told the results and asks the next ones. Longer trials are asked
when a slot frees, with every result known then. The study still asks exactly n_trials trials.

Pruning: the service watches each running trial's events; every value of the objective's metric with a
step is reported to the trial, and when the pruner says so the trial is marked ``pruned``, told so, and
its run stopped (the run ends as a stop ends it; its metrics so far are kept).
"""
from __future__ import annotations

import asyncio
import collections
import copy
import logging
import math
import statistics
import time
import uuid
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.graph.params import ParamError, declared_of, set_param
from cdui.plane import sampler_proc
from cdui.plane.runs import RunService
from cdui.plane.sampler_proc import SamplerProcess, StoredTrial, Timed
from cdui.plane.sched.placement import FilePlan
from cdui.plane.store import TERMINAL
from cdui.plane.subscription import Subscription
from cdui.plane.sweeps import MAX_NAME, SweepService
from cdui.wire.runopts import parse_run_options
from cdui.wire.studyspec import MAX_TRIALS, StudySpec, parse_study
from cdui.wire.target import Target

log = logging.getLogger(__name__)
MIN_IMPORTANCE = 4          # finished trials before param importances are computed
IMPORTANCE_EVERY_S = 10.0   # at most this often while fewer than a tenth more trials finished
IMPORTANCE_COST_SHARE = 0.05  # fits of a watched study's importances take at most this share of a core
MAX_LISTED = 500
MAX_CURVE = 10_000          # intermediate values kept per trial
EVENTS_PAGE = 2000
ASK_AHEAD = 1               # trials asked and stored ahead per slot of parallelism, waiting for a free slot ...
AHEAD_BELOW_S = 1.0         # ... while the study's recent trials took less than this (release to end, median)
NOT_LOADED = -1             # a study's generation when its Optuna object must be (re)built before use


def _spec_of(stored: dict[str, Any]) -> StudySpec:
    """The stored request read back (it passed :func:`parse_study` when the study was created)."""
    s = stored
    return parse_study({"graph": {}, "axes": s["axes"], "objective": s["objective"], "sampler": s["sampler"],
                        "pruner": s["pruner"], "n_trials": s["n_trials"], "parallelism": s["max_running"],
                        "seed": s["seed"]})


def _unavailable(exc: sampler_proc.Unavailable) -> CduiError:
    return CduiError(exc.code, exc.message, hint=exc.hint, status=501 if exc.code == "studies_unavailable" else 400)


def _stopping(exc: sampler_proc.SamplerClosed) -> CduiError:
    return CduiError("stopping", str(exc), hint="try again once the control plane has started again", status=503)


class _Live:
    """What the control plane keeps of a study it has used: its spec, its lock, the generation of the sampler
    process its Optuna object was built in, and its figures."""

    def __init__(self, sweep_id: str, spec: StudySpec) -> None:
        self.sweep_id = sweep_id
        self.spec = spec
        self.lock = asyncio.Lock()     # held around every call into the sampler and the store writes it decides
        self.generation = NOT_LOADED
        self.sampler_s = 0.0       # time spent in the sampler and pruner (bench/studies.py reads it)
        self.sampler_cpu_s = 0.0   # ... of it, the CPU time of the sampler's process (not waiting for a core)
        # (finished trials, when, importances, the fit's CPU seconds) of the last fit; whether one is running now
        self.importance: tuple[int, float, dict[str, float] | None, float] | None = None
        self.importance_busy = False
        self.recent_s: collections.deque[float] = collections.deque(maxlen=8)  # its last trials' durations

    def ahead(self) -> int:
        """Trials to ask ahead per slot: only while its trials are short, where the sampler's milliseconds per
        trial would show in the study's wall time. A study of longer trials asks each one with every result
        known that can be (those of the trials still running aside)."""
        if not self.recent_s or statistics.median(self.recent_s) >= AHEAD_BELOW_S:
            return 0
        return ASK_AHEAD


class StudyService:
    def __init__(self, sweeps: SweepService) -> None:
        self.sweeps = sweeps
        self.runs: RunService = sweeps.runs
        self.store = self.runs.store
        self._live: dict[str, _Live] = {}
        self._watch: dict[str, asyncio.Task[None]] = {}   # trial run id -> its metric watcher
        self._trial_of: dict[str, tuple[str, int]] = {}   # trial run id -> (study id, trial index)
        self._released_at: dict[str, float] = {}          # trial run id -> when it was seen released (monotonic)
        self.sampler = SamplerProcess()  # started at the first call into it

    # -- the run listener -------------------------------------------------------------------
    async def on_terminal(self, run_id: str, status: str) -> None:
        task = self._watch.pop(run_id, None)
        if task is not None:
            task.cancel()
        trial = self._trial_of.pop(run_id, None)
        released = self._released_at.pop(run_id, None)
        if trial is not None and released is not None and trial[0] in self._live:
            self._live[trial[0]].recent_s.append(time.monotonic() - released)
        if trial is None and self._live:
            # Every trial's run is known here from its release on (_watch_new); the store is asked only while a
            # study is loaded, so that a run ending elsewhere costs no read, and a trial missed would not stall it.
            trial = await self.store.studies.trial_of_run(run_id)
        if trial is not None:
            self.runs.spawn(self._trial_ended(trial[0], trial[1], run_id, status))

    async def before_dispatch(self) -> None:
        """At start (after the sweep service brought its variants up to date): every active study is known
        here at once, and then, in the background, rebuilt in the sampler's process from its stored trials,
        asks for what it has room for, and watches its running trials."""
        for sweep_id in await self.store.studies.active_ids():
            await self._live_of(sweep_id)
            self.runs.spawn(self._advance(sweep_id))

    async def on_shutdown(self) -> None:
        for task in self._watch.values():
            task.cancel()
        await self.sampler.close()

    async def check_target(self, target: Target, graph: Any, files: FilePlan) -> None:
        """Any target a run takes, a study takes."""

    async def on_disk_recovered(self) -> None:
        for sweep_id in list(self._live):
            self.runs.spawn(self._advance(sweep_id))

    # -- the sampler's side -------------------------------------------------------------------
    async def _live_of(self, sweep_id: str) -> _Live:
        """The study's state here (read from the store the first time; nothing is built in the sampler yet)."""
        live = self._live.get(sweep_id)
        if live is not None:
            return live
        sweep = await self.store.sweeps.get(sweep_id)
        if sweep is None or sweep["kind"] != "study":
            raise NotFound("study", sweep_id, hint="list studies with GET /api/studies")
        return self._live.setdefault(sweep_id, _Live(sweep_id, _spec_of(sweep["spec"])))

    async def _call(self, live: _Live, fn: Any, *args: Any, counted: bool = True) -> Timed[Any]:
        """``fn(study id, *args)`` in the sampler's process, with ``live.lock`` held; the study is built there
        from its stored trials first when that process has not got it (its first use, or a process started
        after the last one died). A process that dies during the call is replaced and the call made again in
        the new one, once. Its time is added to the study's ``sampler_s`` unless not ``counted``."""
        assert live.lock.locked()
        for attempt in (1, 2):
            try:
                if live.generation != self.sampler.generation:
                    await self._build(live)
                # A process started after the one the study was built in (that one died) raises NotLoaded.
                timed, _ = await self.sampler.call(fn, live.sweep_id, *args)
            except (sampler_proc.SamplerDied, sampler_proc.NotLoaded) as exc:
                live.generation = NOT_LOADED
                if attempt == 2:
                    raise CduiError("sampler_lost", f"study {live.sweep_id}: the sampler's process was lost twice "
                                    f"in one call ({type(exc).__name__})", status=503,
                                    hint="the next trial's ending or a restart of the control plane tries again; "
                                         "see the control plane's log for why the process died") from None
                continue
            except sampler_proc.Unavailable as exc:
                raise _unavailable(exc) from None
            except sampler_proc.SamplerClosed as exc:
                raise _stopping(exc) from None
            if counted:
                live.sampler_s += timed.wall_s
                live.sampler_cpu_s += timed.cpu_s
            return timed
        raise AssertionError("unreachable")

    async def _build(self, live: _Live) -> None:
        """Build the study's Optuna object in the sampler's process from its stored trials."""
        spec = live.spec
        rows = await self.store.sweeps.variants(live.sweep_id)
        marks = await self.store.studies.marks(live.sweep_id)
        trials = []
        for r in rows:
            value = (r["metrics"] or {}).get(spec.objective["metric"])
            ended = r["has_run"] and r["status"] in TERMINAL
            curve = await self._curve(r["run_id"], spec.objective["metric"]) if ended else {}
            trials.append(StoredTrial(_trial_state(r["status"], marks.get(r["idx"]), value),
                                      float(value) if isinstance(value, (int, float)) else None,
                                      dict(r["params"]), curve))
        timed, generation = await self.sampler.call(sampler_proc.load, live.sweep_id, spec, trials)
        live.sampler_s += timed.wall_s
        live.sampler_cpu_s += timed.cpu_s
        live.generation = generation

    async def _curve(self, run_id: str, metric: str) -> dict[int, float]:
        """The intermediate values a run streamed for ``metric``: step -> its last value."""
        out: dict[int, float] = {}
        after = 0
        while True:
            evs = await self.store.events(run_id, after, EVENTS_PAGE)
            for ev in evs:
                after = ev["seq"]
                point = _point(ev, metric)
                if point is not None and (point[0] in out or len(out) < MAX_CURVE):
                    out[point[0]] = point[1]
            if len(evs) < EVENTS_PAGE:
                return out

    # -- asking and telling -------------------------------------------------------------------
    async def _advance(self, sweep_id: str) -> None:
        """Ask the sampler for as many new trials as the study has room for (its parallelism, and while its
        trials are short as many again waiting: :meth:`_Live.ahead`), release them, watch them."""
        sweep = await self.store.sweeps.get(sweep_id)
        if sweep is None or sweep["state"] != "active":
            return
        live = await self._live_of(sweep_id)
        try:
            async with live.lock:
                sweep = await self.store.sweeps.get(sweep_id)  # a stop may have come while it waited
                if sweep is None or sweep["state"] != "active":
                    return
                total, busy = await self.store.studies.pending(sweep_id)
                room = min(live.spec.parallelism * (1 + live.ahead()) - busy, live.spec.n_trials - total)
                for _ in range(max(0, room)):
                    number, params = (await self._call(live, sampler_proc.ask)).result
                    idx = await self.store.studies.add_trial(sweep_id, params, live.spec.n_trials)
                    if idx != number:
                        # Not stored (the study was stopped meanwhile), or numbered unlike the stored trials: the
                        # sampler's study no longer matches the store, so it is rebuilt from the store at its next use.
                        live.generation = NOT_LOADED
                        if idx is not None:
                            log.warning("study %s: trial %d stored as %s; rebuilding it", sweep_id, number, idx)
                        break
        except CduiError as exc:
            log.log(logging.INFO if exc.code == "stopping" else logging.WARNING, "study %s: no trial asked: %s",
                    sweep_id, exc)
            return
        await self.sweeps.release(sweep_id)
        await self._watch_new(sweep_id)

    async def _watch_new(self, sweep_id: str) -> None:
        for idx, run_id, status in await self.store.studies.trial_runs(sweep_id):
            if status not in TERMINAL and run_id not in self._watch:
                self._trial_of[run_id] = (sweep_id, idx)
                self._released_at.setdefault(run_id, time.monotonic())
                self._watch[run_id] = self.runs.spawn(self._watch_run(sweep_id, idx, run_id))

    async def _watch_run(self, sweep_id: str, idx: int, run_id: str) -> None:
        """Report each value of the objective's metric to the trial; prune it when the pruner says so."""
        q: Subscription = self.runs.subscribe(run_id)
        try:
            live = await self._live_of(sweep_id)
            metric = live.spec.objective["metric"]
            if live.spec.pruner["name"] == "none":
                return
            # What it streamed before this watcher came (an adopted run, or a fast one): from the store.
            for step, value in (await self._curve(run_id, metric)).items():
                if await self._report(live, idx, run_id, step, value):
                    return
            while True:
                ev = await q.get()
                if ev.get("kind") == "status" and (ev.get("data") or {}).get("status") in TERMINAL:
                    return
                point = _point(ev, metric)
                if point is not None and await self._report(live, idx, run_id, *point):
                    return
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("study %s: watching trial %d (run %s) failed", sweep_id, idx, run_id)
        finally:
            self.runs.unsubscribe(run_id, q)

    async def _report(self, live: _Live, idx: int, run_id: str, step: int, value: float) -> bool:
        """Report one intermediate value; True when the trial was pruned (its run is being stopped)."""
        async with live.lock:
            decision = (await self._call(live, sampler_proc.report, idx, step, value)).result
            if decision != "prune":
                return decision == "pruned"
            if await self.store.sweeps.run_status(run_id) in TERMINAL:
                return False  # it ended meanwhile: its ending tells the study how it went
            await self.store.studies.mark(live.sweep_id, idx, "pruned")
            await self._call(live, sampler_proc.tell, idx, None, "pruned")
        await self.runs.record_cp(run_id, "log", {"level": "info", "message": (
            f"trial {idx} of study {live.sweep_id} pruned at step {step} ({live.spec.objective['metric']}={value:g}): "
            "its run is stopped, its metrics so far are kept")})
        try:
            await self.runs.stop(run_id)
        except NotFound:
            pass
        return True

    async def _trial_ended(self, sweep_id: str, idx: int, run_id: str, status: str) -> None:
        try:
            live = await self._live_of(sweep_id)
            metrics = await self.sweeps.final_metrics(run_id) or {}
            value = metrics.get(live.spec.objective["metric"])
            ok = status == "succeeded" and isinstance(value, (int, float)) and _finite(value)
            told = float(value) if ok and value is not None else None
            async with live.lock:
                await self._call(live, sampler_proc.tell, idx, told, "complete" if told is not None else "fail")
        except CduiError as exc:  # stopping: the next start rebuilds the study with this trial's ending
            log.log(logging.INFO if exc.code == "stopping" else logging.WARNING,
                    "study %s: trial %d ended but the study cannot go on: %s", sweep_id, idx, exc)
            return
        await self._advance(sweep_id)

    # -- the API ------------------------------------------------------------------------------
    async def create(self, body: Any) -> dict[str, Any]:
        spec = parse_study(body)
        await self._check_sampler(spec)
        if self.store.full:
            err = self.store.disk_full_error()
            raise CduiError("disk_full", f"study refused: {err.message}", hint=err.hint, status=507)
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
            raise CduiError("bad_study", f"name must be text of at most {MAX_NAME} characters", hint="or leave it out")
        graph: dict[str, Any] = body["graph"]
        options = body.get("options") or {}
        parse_run_options(options)
        await self._check(graph, options, spec)
        sweep_id = uuid.uuid4().hex[:12]
        if not name and isinstance(graph.get("name"), str):
            name = graph["name"][:MAX_NAME]
        await self.store.sweeps.create(sweep_id, "study", name or None, spec.to_json(), options, graph,
                                       spec.parallelism, [], self.runs.clock.time())
        await self._advance(sweep_id)
        return await self.get(sweep_id)

    async def _check_sampler(self, spec: StudySpec) -> None:
        """Optuna and the spec's sampler can be had in the sampler's process (started now if it is not yet),
        or the error naming what to install."""
        for attempt in (1, 2):
            try:
                await self.sampler.call(sampler_proc.check, spec)
                return
            except sampler_proc.Unavailable as exc:
                raise _unavailable(exc) from None
            except sampler_proc.SamplerClosed as exc:
                raise _stopping(exc) from None
            except sampler_proc.SamplerDied:
                if attempt == 2:
                    raise CduiError("sampler_lost", "the studies' sampler process died twice while starting",
                                    status=503, hint="see the control plane's log for why, then try again") from None

    async def _check(self, graph: dict[str, Any], options: Any, spec: StudySpec) -> None:
        """Every axis names a param of the graph, and the graph passes a submit's checks at each axis's
        ends (or each of its values); nothing is stored otherwise, every error listed."""
        declared = declared_of(self.runs.registry, graph)
        errors: list[dict[str, Any]] = []
        probes = max(len(d.probes()) for d in spec.dims)
        seen: set[tuple[Any, ...]] = set()
        for i in range(min(probes, 16)):
            g = copy.deepcopy(graph)
            for d in spec.dims:
                values = d.probes()
                value = values[min(i, len(values) - 1)]
                try:
                    set_param(g, d.key, value, declared)
                except ParamError as exc:
                    key: tuple[str, ...] = (d.key, exc.message)
                    if key not in seen:
                        seen.add(key)
                        errors.append({"node_id": exc.node_id, "code": "bad_param", "param": d.key,
                                       "message": f"{d.key}: {exc.message}", "hint": exc.hint})
            if errors:
                break
            try:
                admitted = await self.runs.admit(g, options)
            except CduiError as exc:
                if exc.code != "invalid_graph" or not isinstance(exc.details, list):
                    raise
                for e in exc.details:
                    key = ((str(e.get("node_id")), str(e.get("message"))) if isinstance(e, dict)
                           else (str(e),))
                    if key not in seen:
                        seen.add(key)
                        errors.append(dict(e) if isinstance(e, dict) else {"message": str(e)})
                continue
            if admitted.secrets:
                raise CduiError("study_secrets", "the graph has secret params (API keys); a study stores its graph "
                                "to run trials later, and secrets are never stored",
                                hint="run such a graph with `cdui run`, or leave the secret param empty")
        if errors:
            raise CduiError("invalid_study", f"{len(errors)} error(s) in the study's search space; nothing was "
                            "stored", hint="fix every error listed in details and submit again", details=errors[:200])

    async def _study(self, sweep_id: str) -> dict[str, Any]:
        sweep = await self.store.sweeps.get(sweep_id)
        if sweep is None or sweep["kind"] != "study":
            raise NotFound("study", sweep_id, hint="list studies with GET /api/studies (or `cdui study list`)")
        return sweep

    async def get(self, sweep_id: str) -> dict[str, Any]:
        """The sweep's view of it, each variant as a trial (its mark, its state in the study), the best
        (pruned trials are not candidates), the optimisation history and, with enough finished trials,
        the params' importances."""
        spec = (await self._study(sweep_id))["spec"]
        out = await self.sweeps.get(sweep_id)
        marks = await self.store.studies.marks(sweep_id)
        goal = (spec.get("objective") or {}).get("goal", "min")
        best = None
        history = []
        for v in out["variants"]:
            v["pruned"] = marks.get(v["index"]) == "pruned"
            v["state"] = _state(v)
            if v["pruned"]:
                v["best"] = False
            elif v["state"] == "complete":
                value = float(v["objective"])
                if best is None or (value < best["objective"] if goal == "min" else value > best["objective"]):
                    best = {"index": v["index"], "run_id": v["run_id"], "objective": value, "params": v["params"]}
                history.append({"index": v["index"], "objective": value, "best_so_far": best["objective"]})
        for v in out["variants"]:
            v["best"] = best is not None and v["index"] == best["index"]
        out.update({"trials": out.pop("variants"), "best": best, "history": history,
                    "sampler": spec.get("sampler"), "pruner": spec.get("pruner"), "n_trials": spec.get("n_trials"),
                    "parallelism": spec.get("max_running"),
                    "counts": {**out["counts"], "pruned": sum(1 for m in marks.values() if m == "pruned")},
                    "importances": await self._importances(sweep_id, len(history))})
        live = self._live.get(sweep_id)
        # Seconds the sampler's process spent in Optuna's sampler and pruner for it since this control plane
        # started (bench/studies.py compares them with the study's wall time).
        out["sampler_s"] = round(live.sampler_s, 4) if live is not None else None
        out["sampler_cpu_s"] = round(live.sampler_cpu_s, 4) if live is not None else None
        return out

    async def _importances(self, sweep_id: str, finished: int) -> dict[str, float] | None:
        if finished < MIN_IMPORTANCE:
            return None
        try:
            live = await self._live_of(sweep_id)
        except CduiError:
            return None
        if len(live.spec.dims) == 1:
            # fANOVA's shares add up to 1: a study of one param gives it all, with no forest to fit.
            return {live.spec.dims[0].key: 1.0}
        # fANOVA fits a forest (about half a second of the sampler process's CPU at 100 trials of one param, more
        # with more): a page polling a busy study gets the last answer until a tenth more trials finished or some
        # seconds passed, and never sooner than IMPORTANCE_COST_SHARE allows after the last fit took its time, so
        # that the fits of a study being watched take at most that share of a core from the trials themselves
        # (and hold up the sampler's asks no longer). One fit at a time per study; readers meanwhile get the last
        # answer.
        if not fit_due(live.importance, live.importance_busy, finished, time.monotonic()):
            return live.importance[2] if live.importance is not None else None
        live.importance_busy = True
        try:
            async with live.lock:
                timed = await self._call(live, sampler_proc.importances, counted=False)
        except CduiError as exc:
            log.warning("study %s: no importances: %s", sweep_id, exc)
            return None
        finally:
            live.importance_busy = False
        live.importance = (finished, time.monotonic(), timed.result, timed.cpu_s)
        return timed.result

    async def list(self, limit: int = 100) -> dict[str, Any]:
        ids = await self.store.studies.listing(max(1, min(limit, MAX_LISTED)))
        wanted = set(ids)
        rows = [r for r in (await self.sweeps.list(MAX_LISTED))["sweeps"] if r["id"] in wanted]
        return {"studies": rows}

    async def stop(self, sweep_id: str) -> dict[str, Any]:
        """No more trials are asked; running trials are stopped (as a sweep's stop does)."""
        await self._study(sweep_id)
        await self.sweeps.stop(sweep_id)
        return await self.get(sweep_id)

    async def best_graph(self, sweep_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The study's graph with the best trial's params set, and that trial."""
        out = await self.get(sweep_id)
        best = out["best"]
        if best is None:
            raise CduiError("no_best_trial", f"study {sweep_id} has no finished trial with a value of "
                            f"{(out.get('objective') or {}).get('metric')} yet", status=409,
                            hint="wait for a trial to succeed (GET /api/studies/{id} shows them)")
        sweep = await self.store.sweeps.get(sweep_id, with_graph=True)
        assert sweep is not None
        graph = copy.deepcopy(sweep["graph"])
        declared = declared_of(self.runs.registry, graph)
        for key, value in best["params"].items():
            set_param(graph, key, value, declared)
        return graph, best


def fit_due(last: tuple[int, float, Any, float] | None, busy: bool, finished: int, now: float) -> bool:
    """Whether a read of a study with ``finished`` complete trials fits its importances again, given the last
    fit (finished trials then, when, its answer, its CPU seconds) and whether one is running: not while one
    runs; not for the same trials; not sooner than the last fit's cost allows (``IMPORTANCE_COST_SHARE``);
    then once a tenth more trials finished or ``IMPORTANCE_EVERY_S`` passed."""
    if busy:
        return False
    if last is None:
        return True
    count, at, _answer, cost = last
    since = now - at
    if count == finished or since < cost / IMPORTANCE_COST_SHARE:
        return False
    return finished >= count + max(1, count // 10) or since >= IMPORTANCE_EVERY_S


def _point(ev: dict[str, Any], metric: str) -> tuple[int, float] | None:
    """(step, value) of a metric event of ``metric`` with an integer step (or epoch)."""
    if ev.get("kind") != "metric":
        return None
    d = ev.get("data")
    if not isinstance(d, dict) or d.get("name") != metric:
        return None
    value, step = d.get("value"), d.get("step", d.get("epoch"))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**31:
        return None
    return step, float(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _trial_state(status: str, mark: str | None, value: Any) -> str:
    """A stored trial's state for the sampler (:data:`sampler_proc.STATES`), from its variant's status, its mark
    and its objective's last value."""
    if status not in TERMINAL:
        return "running"
    if mark == "pruned":
        return "pruned"
    return "complete" if status == "succeeded" and _finite(value) else "fail"


def _state(v: dict[str, Any]) -> str:
    """A trial's state as Optuna names it (running, complete, pruned, fail), or waiting."""
    if v["pruned"]:
        return "pruned"
    if v["status"] == "waiting":
        return "waiting"
    if v["status"] not in TERMINAL:
        return "running"
    if v["status"] == "succeeded" and isinstance(v["objective"], (int, float)) and not isinstance(v["objective"], bool):
        return "complete"
    return "fail"


__all__ = ["MAX_TRIALS", "StudyService"]
STUDIES: web.AppKey[StudyService] = web.AppKey("studies")

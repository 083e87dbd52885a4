"""Studies: a sweep whose next variants Optuna chooses from the results so far (docs/sweeps.md, "Studies").

A study is stored as a sweep of kind ``study`` (:mod:`cdui.plane.store.sweeps`); each trial is one of its
variants, added when the sampler asks for it (:meth:`StudyRows.add_trial`, its index is the trial's number)
and released into an ordinary run by the sweep service, which marks the variant as its run in the
transaction that stores the run. So the control plane's own database is the study's storage, not a second
Optuna database beside it: the trial-to-run link is written with the run, a kill -9 at any moment leaves
each trial either waiting (released at the next start) or with its one run (adopted as any run is), and
Optuna itself needs no SQLAlchemy database. Optuna's study lives in memory and is rebuilt from the stored
trials when the control plane starts (or when a study is first read): their params, values, and the
intermediate values their runs streamed, read back from the runs' metric events.

Pruning: the service watches each running trial's events; every value of the objective's metric with a
step is reported to the trial, and when the pruner says so the trial is marked ``pruned``, told so, and
its run stopped (the run ends as a stop ends it; its metrics so far are kept).

Optuna is imported only here, and only when a study is created or loaded: the control plane starts, and
sweeps work, without it.
"""
from __future__ import annotations

import asyncio
import copy
import importlib.util
import logging
import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.graph.params import ParamError, declared_of, set_param
from cdui.plane.runs import RunService
from cdui.plane.sched.placement import FilePlan
from cdui.plane.store import TERMINAL
from cdui.plane.subscription import Subscription
from cdui.plane.sweeps import MAX_NAME, SweepService
from cdui.wire.runopts import parse_run_options
from cdui.wire.studyspec import MAX_TRIALS, Dim, StudySpec, parse_study
from cdui.wire.target import Target

log = logging.getLogger(__name__)
INSTALL_HINT = "install it with `bin/cdui start --extras studies` (or pip install 'cdui[studies]'), then try again"
MIN_IMPORTANCE = 4          # finished trials before param importances are computed
IMPORTANCE_EVERY_S = 10.0   # at most this often while fewer than a tenth more trials finished
IMPORTANCE_COST_SHARE = 0.05  # fits of a watched study's importances take at most this share of a core
MAX_LISTED = 500
MAX_CURVE = 10_000          # intermediate values kept per trial
EVENTS_PAGE = 2000


def load_optuna() -> Any:
    """The optuna module, or :class:`CduiError` ``studies_unavailable`` naming the install command."""
    try:
        import optuna
    except ImportError as exc:
        raise CduiError("studies_unavailable", f"studies need Optuna, which this control plane's Python cannot "
                        f"import ({exc}); sweeps work without it", hint=INSTALL_HINT, status=501) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _distribution(optuna: Any, d: Dim) -> Any:
    dist = optuna.distributions
    if d.kind == "choice":
        return dist.CategoricalDistribution(d.choices)
    if d.kind == "int":
        return dist.IntDistribution(int(d.low), int(d.high), step=int(d.step or 1))
    return dist.FloatDistribution(d.low, d.high, step=d.step, log=d.log)


def _spec_of(stored: dict[str, Any]) -> StudySpec:
    """The stored request read back (it passed :func:`parse_study` when the study was created)."""
    s = stored
    return parse_study({"graph": {}, "axes": s["axes"], "objective": s["objective"], "sampler": s["sampler"],
                        "pruner": s["pruner"], "n_trials": s["n_trials"], "parallelism": s["max_running"],
                        "seed": s["seed"]})


class _Live:
    """A study's Optuna object, rebuilt from the stored trials."""

    def __init__(self, spec: StudySpec, study: Any, distributions: dict[str, Any]) -> None:
        self.spec = spec
        self.study = study
        self.distributions = distributions
        self.lock = asyncio.Lock()
        self.sampler_s = 0.0       # time spent in the sampler and pruner (bench/studies.py reads it)
        self.sampler_cpu_s = 0.0   # ... of it, the CPU time of the sampler's thread (not waiting for a core)
        # (finished trials, when, importances, the fit's CPU seconds) of the last fit; whether one is running now
        self.importance: tuple[int, float, dict[str, float] | None, float] | None = None
        self.importance_busy = False


class StudyService:
    def __init__(self, sweeps: SweepService) -> None:
        self.sweeps = sweeps
        self.runs: RunService = sweeps.runs
        self.store = self.runs.store
        self._live: dict[str, _Live] = {}
        self._watch: dict[str, asyncio.Task[None]] = {}   # trial run id -> its metric watcher
        self._trial_of: dict[str, tuple[str, int]] = {}   # trial run id -> (study id, trial index)
        # Optuna's asking and telling (a TPE ask is milliseconds of Python and numpy at a hundred trials) run in
        # one thread of their own, not on the event loop: the API, dispatch and the other trials' events go on
        # meanwhile. One thread: the calls of all studies take turns, so no Optuna object is used by two at once
        # (each study's own calls are also ordered by its lock).
        self._sampler_thread = ThreadPoolExecutor(1, thread_name_prefix="cdui-optuna")

    # -- the run listener -------------------------------------------------------------------
    async def on_terminal(self, run_id: str, status: str) -> None:
        task = self._watch.pop(run_id, None)
        if task is not None:
            task.cancel()
        trial = self._trial_of.pop(run_id, None)
        if trial is None and self._live:
            # Every trial's run is known here from its release on (_watch_new); the store is asked only while a
            # study is loaded, so that a run ending elsewhere costs no read, and a trial missed would not stall it.
            trial = await self.store.studies.trial_of_run(run_id)
        if trial is not None:
            self.runs.spawn(self._trial_ended(trial[0], trial[1], run_id, status))

    async def before_dispatch(self) -> None:
        """At start (after the sweep service brought its variants up to date): every active study is loaded
        from its stored trials, asks for what it has room for, and watches its running trials."""
        for sweep_id in await self.store.studies.active_ids():
            try:
                await self._load(sweep_id)
            except CduiError as exc:  # Optuna gone since: the study waits, its runs go on as runs
                log.warning("study %s not resumed: %s", sweep_id, exc)
                continue
            self.runs.spawn(self._advance(sweep_id))

    async def on_shutdown(self) -> None:
        for task in self._watch.values():
            task.cancel()
        self._sampler_thread.shutdown(wait=False, cancel_futures=True)

    async def check_target(self, target: Target, graph: Any, files: FilePlan) -> None:
        """Any target a run takes, a study takes."""

    async def on_disk_recovered(self) -> None:
        for sweep_id in list(self._live):
            self.runs.spawn(self._advance(sweep_id))

    # -- Optuna's side ------------------------------------------------------------------------
    async def _timed(self, live: _Live, fn: Callable[[], Any]) -> Any:
        """``fn`` (a call into Optuna) in the sampler's thread; its time is counted in ``sampler_s``."""
        def timed() -> Any:
            t, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn()
            finally:
                live.sampler_s += time.perf_counter() - t  # only this thread adds to them
                live.sampler_cpu_s += time.thread_time() - cpu
        return await asyncio.get_running_loop().run_in_executor(self._sampler_thread, timed)

    async def _load(self, sweep_id: str) -> _Live:
        """The study's Optuna object, rebuilt from its stored trials the first time."""
        live = self._live.get(sweep_id)
        if live is not None:
            return live
        sweep = await self.store.sweeps.get(sweep_id)
        if sweep is None or sweep["kind"] != "study":
            raise NotFound("study", sweep_id, hint="list studies with GET /api/studies")
        optuna = load_optuna()
        spec = _spec_of(sweep["spec"])
        rows = await self.store.sweeps.variants(sweep_id)
        marks = await self.store.studies.marks(sweep_id)
        curves = {r["idx"]: await self._curve(r["run_id"], spec.objective["metric"])
                  for r in rows if r["has_run"] and r["status"] in TERMINAL}
        live = self._live.get(sweep_id)  # another load finished while this one read
        if live is not None:
            return live
        distributions = {d.key: _distribution(optuna, d) for d in spec.dims}
        # A rebuilt sampler continues from a seed of its own (the seed and the trials so far): the first
        # seed again would draw the first trials' params again. Not the grid sampler: it gives trial N the
        # N-th point of its seeded order, so it needs the first order back (each rebuilt trial is then
        # matched to its point, see _grid_attrs).
        grid = spec.sampler["name"] == "grid"
        study = optuna.create_study(direction="minimize" if spec.objective["goal"] == "min" else "maximize",
                                    sampler=self._sampler(optuna, spec, spec.seed + (0 if grid else len(rows))),
                                    pruner=self._pruner(optuna, spec))
        T = optuna.trial.TrialState
        for r in rows:
            params = {k: r["params"][k] for k in distributions if k in r["params"]}
            value = (r["metrics"] or {}).get(spec.objective["metric"])
            curve = curves.get(r["idx"], {})
            if r["status"] not in TERMINAL:
                state, value = T.RUNNING, None
            elif marks.get(r["idx"]) == "pruned":
                state, value = T.PRUNED, None
            elif r["status"] == "succeeded" and isinstance(value, (int, float)) and math.isfinite(value):
                state = T.COMPLETE
            else:
                state, value = T.FAIL, None
            attrs = self._grid_attrs(study, params) if grid else {}
            study.add_trial(optuna.trial.create_trial(
                state=state, value=value, params=params, distributions=distributions,
                intermediate_values=curve, system_attrs=attrs))
        live = _Live(spec, study, distributions)
        self._live[sweep_id] = live
        return live

    def _sampler(self, optuna: Any, spec: StudySpec, seed: int) -> Any:
        s = spec.sampler
        startup = s.get("startup_trials")
        if s["name"] == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if s["name"] == "grid":
            return optuna.samplers.GridSampler({d.key: list(d.choices) for d in spec.dims}, seed=seed)
        if s["name"] == "cmaes":
            if importlib.util.find_spec("cmaes") is None:
                raise CduiError("sampler_unavailable", "the cmaes sampler needs the cmaes package, which this "
                                "control plane's Python cannot import", hint="pip install cmaes into the control "
                                "plane's .venv, or use \"sampler\": \"tpe\"")
            return optuna.samplers.CmaEsSampler(seed=seed, **({"n_startup_trials": startup} if startup else {}))
        return optuna.samplers.TPESampler(seed=seed, **({"n_startup_trials": startup} if startup is not None else {}))

    def _pruner(self, optuna: Any, spec: StudySpec) -> Any:
        p = spec.pruner
        if p["name"] == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=p.get("startup_trials", 5),
                                               n_warmup_steps=p.get("warmup_steps", 0))
        if p["name"] == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, p.get("warmup_steps", 0)) if
                                                          "warmup_steps" in p else "auto")
        return optuna.pruners.NopPruner()

    @staticmethod
    def _grid_attrs(study: Any, params: dict[str, Any]) -> dict[str, Any]:
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
        """Ask the sampler for as many new trials as the study has room for, release them, watch them."""
        sweep = await self.store.sweeps.get(sweep_id)
        if sweep is None or sweep["state"] != "active":
            return
        try:
            live = await self._load(sweep_id)
        except CduiError as exc:
            log.warning("study %s: no trial asked: %s", sweep_id, exc)
            return
        async with live.lock:
            sweep = await self.store.sweeps.get(sweep_id)  # a stop may have come while it was loaded
            if sweep is None or sweep["state"] != "active":
                return
            if self._live.get(sweep_id) is not live:  # rebuilt meanwhile: ask with the rebuilt one
                self.runs.spawn(self._advance(sweep_id))
                return
            total, busy = await self.store.studies.pending(sweep_id)
            room = min(live.spec.parallelism - busy, live.spec.n_trials - total)
            for _ in range(max(0, room)):
                trial = await self._timed(live, lambda: live.study.ask(live.distributions))
                idx = await self.store.studies.add_trial(sweep_id, dict(trial.params), live.spec.n_trials)
                if idx != trial.number:
                    # Not stored (the study was stopped meanwhile), or numbered unlike the stored trials: this
                    # in-memory study no longer matches the store, so it is rebuilt from the store when next needed.
                    number, fail = trial.number, load_optuna().trial.TrialState.FAIL
                    await self._timed(live, lambda: live.study.tell(number, state=fail))  # noqa: B023 (called at once)
                    self._live.pop(sweep_id, None)
                    if idx is None:
                        break
                    log.warning("study %s: trial %d stored as %s; reloading", sweep_id, trial.number, idx)
                    break
        await self.sweeps.release(sweep_id)
        await self._watch_new(sweep_id)

    async def _watch_new(self, sweep_id: str) -> None:
        for idx, run_id, status in await self.store.studies.trial_runs(sweep_id):
            if status not in TERMINAL and run_id not in self._watch:
                self._trial_of[run_id] = (sweep_id, idx)
                self._watch[run_id] = self.runs.spawn(self._watch_run(sweep_id, idx, run_id))

    async def _watch_run(self, sweep_id: str, idx: int, run_id: str) -> None:
        """Report each value of the objective's metric to the trial; prune it when the pruner says so."""
        q: Subscription = self.runs.subscribe(run_id)
        try:
            live = await self._load(sweep_id)
            metric = live.spec.objective["metric"]
            if live.spec.pruner["name"] == "none":
                return
            # What it streamed before this watcher came (an adopted run, or a fast one): from the store.
            for step, value in (await self._curve(run_id, metric)).items():
                if await self._report(sweep_id, idx, run_id, step, value):
                    return
            while True:
                ev = await q.get()
                if ev.get("kind") == "status" and (ev.get("data") or {}).get("status") in TERMINAL:
                    return
                point = _point(ev, metric)
                if point is not None and await self._report(sweep_id, idx, run_id, *point):
                    return
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("study %s: watching trial %d (run %s) failed", sweep_id, idx, run_id)
        finally:
            self.runs.unsubscribe(run_id, q)

    async def _report(self, sweep_id: str, idx: int, run_id: str, step: int, value: float) -> bool:
        """Report one intermediate value; True when the trial was pruned (its run is being stopped)."""
        optuna = load_optuna()
        live = await self._load(sweep_id)  # the study as loaded now (it is rebuilt when it no longer matched the store)
        async with live.lock:
            if self._live.get(sweep_id) is not live:
                return False
            trials = live.study.get_trials(deepcopy=False)
            frozen = trials[idx] if idx < len(trials) else None
            if frozen is None or frozen.state != optuna.trial.TrialState.RUNNING:
                return frozen is not None and frozen.state == optuna.trial.TrialState.PRUNED
            trial = optuna.trial.Trial(live.study, frozen._trial_id)
            reported = step in frozen.intermediate_values

            def decide() -> bool:
                if not reported:
                    trial.report(value, step)
                return bool(trial.should_prune())
            if not await self._timed(live, decide):
                return False
            if await self.store.sweeps.run_status(run_id) in TERMINAL:
                return False  # it ended meanwhile: its ending tells the study how it went
            await self.store.studies.mark(sweep_id, idx, "pruned")
            await self._timed(live, lambda: live.study.tell(idx, state=optuna.trial.TrialState.PRUNED))
        await self.runs.record_cp(run_id, "log", {"level": "info", "message": (
            f"trial {idx} of study {sweep_id} pruned at step {step} ({live.spec.objective['metric']}={value:g}): "
            "its run is stopped, its metrics so far are kept")})
        try:
            await self.runs.stop(run_id)
        except NotFound:
            pass
        return True

    async def _trial_ended(self, sweep_id: str, idx: int, run_id: str, status: str) -> None:
        try:
            live = await self._load(sweep_id)
        except CduiError as exc:
            log.warning("study %s: trial %d ended but the study cannot go on: %s", sweep_id, idx, exc)
            return
        optuna = load_optuna()
        metrics = await self.sweeps.final_metrics(run_id) or {}
        value = metrics.get(live.spec.objective["metric"])
        T = optuna.trial.TrialState
        async with live.lock:
            trials = live.study.get_trials(deepcopy=False)
            if self._live.get(sweep_id) is live and idx < len(trials) and trials[idx].state == T.RUNNING:
                if status == "succeeded" and isinstance(value, (int, float)) and math.isfinite(value):
                    await self._timed(live, lambda: live.study.tell(idx, float(value)))
                else:
                    await self._timed(live, lambda: live.study.tell(idx, state=T.FAIL))
        await self._advance(sweep_id)

    # -- the API ------------------------------------------------------------------------------
    async def create(self, body: Any) -> dict[str, Any]:
        spec = parse_study(body)
        optuna = load_optuna()
        if self.store.full:
            err = self.store.disk_full_error()
            raise CduiError("disk_full", f"study refused: {err.message}", hint=err.hint, status=507)
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
            raise CduiError("bad_study", f"name must be text of at most {MAX_NAME} characters", hint="or leave it out")
        graph: dict[str, Any] = body["graph"]
        options = body.get("options") or {}
        parse_run_options(options)
        self._sampler(optuna, spec, spec.seed)  # a sampler missing its package is refused now
        await self._check(graph, options, spec)
        sweep_id = uuid.uuid4().hex[:12]
        if not name and isinstance(graph.get("name"), str):
            name = graph["name"][:MAX_NAME]
        await self.store.sweeps.create(sweep_id, "study", name or None, spec.to_json(), options, graph,
                                       spec.parallelism, [], self.runs.clock.time())
        await self._load(sweep_id)
        await self._advance(sweep_id)
        return await self.get(sweep_id)

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
        # Seconds this control plane spent in Optuna's sampler and pruner for it since it was loaded
        # (bench/studies.py compares them with the study's wall time).
        out["sampler_s"] = round(live.sampler_s, 4) if live is not None else None
        out["sampler_cpu_s"] = round(live.sampler_cpu_s, 4) if live is not None else None
        return out

    async def _importances(self, sweep_id: str, finished: int) -> dict[str, float] | None:
        if finished < MIN_IMPORTANCE:
            return None
        try:
            live = await self._load(sweep_id)
        except CduiError:
            return None
        if len(live.distributions) == 1:
            # fANOVA's shares add up to 1: a study of one param gives it all, with no forest to fit.
            return {next(iter(live.distributions)): 1.0}
        # fANOVA fits a forest (about half a second of the control plane's CPU at 100 trials of one param, more
        # with more): a page polling a busy study gets the last answer until a tenth more trials finished or some
        # seconds passed, and never sooner than IMPORTANCE_COST_SHARE allows after the last fit took its time, so
        # that the fits of a study being watched take at most that share of a core from the trials themselves.
        # One fit at a time per study; readers meanwhile get the last answer.
        if not fit_due(live.importance, live.importance_busy, finished, time.monotonic()):
            return live.importance[2] if live.importance is not None else None
        optuna = load_optuna()
        study = live.study

        def compute() -> tuple[dict[str, float] | None, float]:
            t = time.thread_time()
            try:
                # fANOVA with a fixed seed: the same trials give the same answer at every read
                evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
                got = optuna.importance.get_param_importances(study, evaluator=evaluator)
            except (ValueError, RuntimeError):  # e.g. every finished trial has the same params
                return None, time.thread_time() - t
            return {k: round(float(v), 6) for k, v in got.items()}, time.thread_time() - t
        live.importance_busy = True
        try:
            result, cost = await asyncio.to_thread(compute)
        finally:
            live.importance_busy = False
        live.importance = (finished, time.monotonic(), result, cost)
        return result

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


__all__ = ["MAX_TRIALS", "StudyService", "load_optuna"]
STUDIES: web.AppKey[StudyService] = web.AppKey("studies")

"""Sweeps: one graph, many variants, each an ordinary run (docs/sweeps.md).

A sweep is stored with every variant waiting (:mod:`cdui.plane.store.sweeps`); at most its
``max_running`` of them are runs that have not ended (queued, running or disconnected) at any time:
the rest wait in the sweep, not in the run queue. Each variant is released through the run service's
own submit checks and queue (:meth:`~cdui.plane.runs.RunService.admit`, then
:meth:`~cdui.plane.runs.RunService.enqueue`, which marks the variant as its run in the same write),
so it is a run like any other: validation, placement on the target, events, artifacts, stop.

What releases the next variants: a variant's run ending (this service is a run listener), a retry,
and the control plane's start (variants whose run ended while it was down are brought up to date
first). Every variant's params are checked against the node declarations and the graph validation
before anything is stored: one bad value refuses the whole sweep, every error listed.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import math
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.graph.params import ParamError, declared_of, set_param, split_key
from cdui.graph.variants import VariantChecker
from cdui.plane.runs import Admitted, RunService, iso
from cdui.plane.sched.placement import FilePlan
from cdui.plane.store import TERMINAL
from cdui.wire.runopts import parse_run_options
from cdui.wire.sweepspec import expand, parse_spec
from cdui.wire.target import Local, Target

log = logging.getLogger(__name__)
LIVE = ("queued", "running", "disconnected")
BODY_FIELDS = {"graph", "name", "mode", "axes", "variants", "count", "seed", "options", "max_running", "objective"}
MAX_NAME = 200
MAX_METRICS = 64           # metric names kept per variant
METRICS_PAGE = 2000        # events read at a time for a run's final metrics
MAX_LISTED = 500
MAX_ERRORS = 200           # distinct errors a refused sweep lists
READMIT_S = 1.0            # a sweep's released variants pass the full submit check at least this often
MAX_CACHED = 8             # sweeps whose graph and last admission are kept in memory (the oldest dropped)
Errors = list[dict[str, Any]]


class SweepService:
    def __init__(self, runs: RunService) -> None:
        self.runs = runs
        self.store = runs.store
        self._locks: dict[str, asyncio.Lock] = {}
        self._run_sweep: dict[str, str] = {}  # the live runs of sweeps -> their sweep
        # Per sweep: its graph and declared params (parsed once), and its last full admission with the
        # checker of its plain params (see release).
        self._graphs: dict[str, tuple[dict[str, Any], dict[str, list[str]]]] = {}
        self._admitted: dict[str, tuple[float, Admitted, VariantChecker]] = {}
        self._releasing: set[str] = set()      # sweeps a release of which runs for their runs' endings
        self._release_again: set[str] = set()  # ... and that had more endings meanwhile
        # The live runs of sweeps -> each metric's last value as its events are stored (name -> (seq, value)),
        # and the seq of the first event seen: a run's final metrics are these and what its events before
        # that hold, never a read of all its events.
        self._metrics: dict[str, dict[str, tuple[int, Any]]] = {}
        self._first_seen: dict[str, int] = {}
        runs.event_taps.append(self._tap)

    # -- the run listener -------------------------------------------------------------------
    async def on_terminal(self, run_id: str, status: str) -> None:
        sweep_id = self._run_sweep.pop(run_id, None)
        if sweep_id is not None:
            self.runs.spawn(self._ended(run_id, sweep_id, status))

    async def before_dispatch(self) -> None:
        """At start: variants whose run ended while the control plane was down take its ending, then
        every active sweep releases what it has room for."""
        for run_id, sweep_id in await self.store.sweeps.live_runs():
            status = await self.store.sweeps.run_status(run_id)
            if status is None:
                await self.store.sweeps.ended(run_id, "interrupted", None)
            elif status in TERMINAL:
                await self.store.sweeps.ended(run_id, status, await self.final_metrics(run_id))
            else:
                self._run_sweep[run_id] = sweep_id
        for sweep_id in await self.store.sweeps.active_ids():
            self.runs.spawn(self.release(sweep_id))

    async def on_shutdown(self) -> None:
        """Nothing of its own to stop: its runs are the run service's."""

    async def check_target(self, target: Target, graph: Any, files: FilePlan) -> None:
        """Any target a run takes, a sweep takes."""

    async def on_disk_recovered(self) -> None:
        for sweep_id in await self.store.sweeps.active_ids():
            self.runs.spawn(self.release(sweep_id))

    async def _ended(self, run_id: str, sweep_id: str, status: str) -> None:
        await self.store.sweeps.ended(run_id, status, await self.final_metrics(run_id))
        await self._release_soon(sweep_id)

    # -- releasing variants -----------------------------------------------------------------
    async def _release_soon(self, sweep_id: str) -> None:
        """:meth:`release`, once for many endings: while one release of the sweep runs, the endings meanwhile
        ask for one more after it (100 runs ending at once release their successors in one or two batches,
        not in 100 passes of one variant each)."""
        if sweep_id in self._releasing:
            self._release_again.add(sweep_id)
            return
        self._releasing.add(sweep_id)
        try:
            while True:
                self._release_again.discard(sweep_id)
                await self.release(sweep_id)
                if sweep_id not in self._release_again:
                    break
        finally:
            self._releasing.discard(sweep_id)

    async def release(self, sweep_id: str) -> None:
        """Turn waiting variants into runs while the sweep has room under its max_running.

        A variant passes every submit check of a run (:meth:`RunService.admit`: the target, the device, the
        presets and files as they are now) at least every :data:`READMIT_S` seconds of a sweep's releases;
        meanwhile, when every param the sweep varies is a plain value (:mod:`cdui.graph.variants`), the
        next variants pass the checks of the nodes they change and take the rest of that admission (its
        files, presets, target), which is theirs too, instead of the whole of it again each. A sweep's
        graph never changes: it is read and parsed once."""
        lock = self._locks.setdefault(sweep_id, asyncio.Lock())
        async with lock:
            sweep = await self.store.sweeps.get(sweep_id)
            if sweep is None or sweep["state"] != "active" or self.runs.store.full:
                return
            room = int(sweep["max_running"]) - await self.store.sweeps.live_count(sweep_id)
            if room <= 0:
                return
            known = self._graphs.get(sweep_id)
            if known is None:
                full = await self.store.sweeps.get(sweep_id, with_graph=True)
                if full is None:
                    return
                known = self._graphs[sweep_id] = (full["graph"], declared_of(self.runs.registry, full["graph"]))
                while len(self._graphs) > MAX_CACHED:
                    self._graphs.pop(next(iter(self._graphs)))
            base_graph, declared = known
            batch = await self.store.sweeps.waiting(sweep_id, room)
            first: Admitted | None = None
            checker: VariantChecker | None = None
            keys = {k for _, params in batch for k in params}
            cached = self._admitted.get(sweep_id)
            if cached is not None and self.runs.clock.time() - cached[0] < READMIT_S and keys <= cached[2].keys:
                _, first, checker = cached
            for idx, params in batch:
                try:
                    if first is not None and checker is not None and checker.fast:
                        graph = _light_variant(base_graph, params, declared)
                        graph["name"] = f"{sweep['name'] or 'sweep ' + sweep_id} #{idx}"
                        errors = checker.node_errors(params)
                        if errors:
                            raise CduiError("invalid_graph", f"the graph has {len(errors)} error(s); nothing was "
                                            "stored", hint="fix every error listed in details and submit again",
                                            details=errors)
                        # Its own graph with the presets the first embedded (plain params name none); the first's
                        # plan stays in it unread: a run is stored and queued from the rest.
                        admitted = replace(first, stored_graph={**graph, "presets": first.stored_graph["presets"]}
                                           if "presets" in first.stored_graph else graph)
                    else:
                        graph = self._variant_graph(base_graph, params, declared)
                        graph["name"] = f"{sweep['name'] or 'sweep ' + sweep_id} #{idx}"
                        admitted = await self.runs.admit(graph, sweep["options"])
                        if first is None and not admitted.secrets:
                            first = admitted
                            checker = await asyncio.to_thread(self._checker, base_graph, sweep["options"],
                                                              [p for _, p in batch])
                            self._admitted[sweep_id] = (self.runs.clock.time(), first, checker)
                            while len(self._admitted) > MAX_CACHED:
                                self._admitted.pop(next(iter(self._admitted)))
                except ParamError as exc:
                    await self.store.sweeps.refuse(sweep_id, idx, f"{exc.message} ({exc.hint})")
                    continue
                except CduiError as exc:
                    if exc.status >= 500:  # the server's state (a full disk), not the variant's: try again later
                        log.warning("sweep %s: variant %d not released now: %s", sweep_id, idx, exc.message)
                        return
                    await self.store.sweeps.refuse(sweep_id, idx, _error_text(exc))
                    continue
                extra = {"sweep": {"id": sweep_id, "variant": idx, "params": params}}
                run_id = await self.runs.enqueue(graph, admitted, extra, (sweep_id, idx))
                if run_id is not None:
                    self._run_sweep[run_id] = sweep_id
                    # A stop can end it while the queueing above awaited, before this service knew it as the
                    # sweep's: its ending is then taken here, so the next variants are not held back.
                    status = await self.store.sweeps.run_status(run_id)
                    if status in TERMINAL:
                        await self.on_terminal(run_id, str(status))
                    await self.runs.record_cp(run_id, "log", {"level": "info", "message": (
                        f"variant {idx} of sweep {sweep_id}: " + ", ".join(f"{k}={v!r}" for k, v in params.items()))})

    def _checker(self, graph: dict[str, Any], options: Any, variants: list[dict[str, Any]]) -> VariantChecker:
        target = parse_run_options(options).target
        return VariantChecker(graph, dict.fromkeys(k for params in variants for k in params), self.runs.registry,
                              self.runs.preset_library(), self.runs.config["CODEFYUI_GRAPH_MAX_NODES"],
                              self.runs.layout if isinstance(target, Local) else None)

    def _tap(self, run_id: str, events: Sequence[dict[str, Any]]) -> None:
        if not events or run_id not in self._run_sweep:
            return
        first = events[0]["seq"]
        self._first_seen[run_id] = min(first, self._first_seen.get(run_id, first))
        seen = self._metrics.setdefault(run_id, {})
        for ev in events:
            m = _metric(ev)
            if m is not None and (m[0] in seen or len(seen) < MAX_METRICS):
                seen[m[0]] = (ev["seq"], m[1])

    async def final_metrics(self, run_id: str) -> dict[str, Any] | None:
        """The last value of each metric the run emitted (None: it emitted none): what this service saw
        stored while the run was live, and the events stored before the first it saw read back (a few,
        the run's queued status; all of them for a run that ended while the control plane was down)."""
        tapped = self._metrics.pop(run_id, {})
        first = self._first_seen.pop(run_id, None)
        out: dict[str, tuple[int, Any]] = {}
        after, done = 0, first is not None and first <= 1
        while not done:
            evs = await self.store.events(run_id, after, METRICS_PAGE)
            done = len(evs) < METRICS_PAGE
            for ev in evs:
                if first is not None and ev["seq"] >= first:
                    done = True
                    break
                after = ev["seq"]
                m = _metric(ev)
                if m is not None and (m[0] in out or len(out) < MAX_METRICS):
                    out[m[0]] = (ev["seq"], m[1])
        for name, (seq, value) in tapped.items():
            if name in out or len(out) < MAX_METRICS:
                if name not in out or out[name][0] < seq:
                    out[name] = (seq, value)
        return {name: value for name, (_, value) in out.items()} or None

    # -- the API ------------------------------------------------------------------------------
    async def create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("graph"), dict):
            raise CduiError("bad_request", "the body must be an object with 'graph' and 'axes' (or 'variants')",
                            hint='POST {"graph": {...}, "axes": {"train.lr": [0.1, 0.01]}, "options": {"target": '
                                 '"any"}, "max_running": 4}')
        unknown = sorted(set(body) - BODY_FIELDS)
        if unknown:
            raise CduiError("bad_request", f"unknown field(s) {', '.join(unknown)} in the sweep",
                            hint=f"the fields are {', '.join(sorted(BODY_FIELDS))}")
        if self.store.full:
            err = self.store.disk_full_error()
            raise CduiError("disk_full", f"sweep refused: {err.message}", hint=err.hint, status=507)
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME):
            raise CduiError("bad_sweep", f"name must be text of at most {MAX_NAME} characters", hint="or leave it out")
        graph: dict[str, Any] = body["graph"]
        options = body.get("options") or {}
        parse_run_options(options)  # a bad target or device is one error for the whole sweep
        spec = parse_spec(body)
        variants = expand(spec)
        errors = await self._check(graph, options, variants)
        if errors:
            raise CduiError("invalid_sweep", f"{len(errors)} error(s) in the sweep's variants; nothing was stored",
                            hint="fix every error listed in details and submit again", details=errors)
        sweep_id = uuid.uuid4().hex[:12]
        if not name and isinstance(graph.get("name"), str):
            name = graph["name"][:MAX_NAME]
        await self.store.sweeps.create(sweep_id, "sweep", name or None, spec.to_json(),
                                       options, graph, spec.max_running, variants, self.runs.clock.time())
        await self.release(sweep_id)
        return await self.get(sweep_id)

    async def _check(self, graph: dict[str, Any], options: Any, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every distinct error of every variant (each naming the variants it is found in).

        The first variant whose keys all name a node and a declared param is checked in full, as a run is;
        when every swept param is a plain value (:mod:`cdui.graph.variants`), the others are checked only
        through the checks of the nodes they change, which gives the same errors as checking each in full,
        in one thread hop for all of them. Otherwise each variant is checked in full."""
        declared = declared_of(self.runs.registry, graph)
        found: dict[tuple[Any, ...], dict[str, Any]] = {}

        def add(error: dict[str, Any], idx: int) -> None:
            key = (error.get("node_id"), error.get("code"), error.get("message"))
            if key not in found:
                if len(found) >= MAX_ERRORS:
                    return
                found[key] = {**error, "variants": []}
            found[key]["variants"].append(idx)

        # Whether NODE.PARAM names a node and a param its type declares does not depend on the value.
        keys = list(dict.fromkeys(k for params in variants for k in params))
        bad_keys: dict[str, ParamError] = {}
        scratch = copy.deepcopy(graph)
        for key in keys:
            try:
                set_param(scratch, key, None, declared)
            except ParamError as exc:
                bad_keys[key] = exc
        good: list[int] = []
        for idx, params in enumerate(variants):
            bad = [(k, v) for k, v in params.items() if k in bad_keys]
            for key, value in bad:
                why = bad_keys[key]
                add({"node_id": why.node_id, "code": "bad_param", "param": key,
                     "message": f"{key}={value!r}: {why.message}", "hint": why.hint}, idx)
            if not bad:
                good.append(idx)
        if not good:
            return list(found.values())
        first = good[0]
        first_errors = await self._admit_errors(self._variant_graph(graph, variants[first], declared), options)
        for e in first_errors:
            add(e, first)
        rest = good[1:]
        if not rest:
            return list(found.values())
        common = await asyncio.to_thread(self._plain_errors, graph, options, variants, first, rest, first_errors)
        if common is None:  # a swept param the node checks alone do not cover: each variant in full
            for idx in rest:
                for e in await self._admit_errors(self._variant_graph(graph, variants[idx], declared), options):
                    add(e, idx)
        else:
            for idx, errors in common:
                for e in errors:
                    add(e, idx)
        return list(found.values())

    def _plain_errors(self, graph: dict[str, Any], options: Any, variants: list[dict[str, Any]], first: int,
                      rest: list[int], first_errors: list[dict[str, Any]]) -> list[tuple[int, Errors]] | None:
        """(index, errors) of each variant of ``rest``, from the errors of variant ``first`` (checked in
        full) with its node-level ones replaced by each variant's; None when that is not the same as
        checking each in full (see :mod:`cdui.graph.variants`). Runs in a thread."""
        checker = self._checker(graph, options, [variants[i] for i in (first, *rest)])
        if not checker.fast:
            return None
        strip = list(first_errors)
        for e in checker.node_errors(variants[first]):
            if e not in strip:
                return None  # not as the full check found them: leave nothing to chance
            strip.remove(e)
        return [(idx, strip + checker.node_errors(variants[idx])) for idx in rest]

    @staticmethod
    def _variant_graph(graph: dict[str, Any], params: dict[str, Any], declared: dict[str, list[str]]) -> dict[str, Any]:
        g = copy.deepcopy(graph)
        for key, value in params.items():
            set_param(g, key, value, declared)
        return g

    async def _admit_errors(self, graph: dict[str, Any], options: Any) -> list[dict[str, Any]]:
        """The graph errors of one variant checked in full (a run's submit checks); raises what is not the
        variant's own (the target, the device, a full disk) and a graph with secrets."""
        try:
            admitted = await self.runs.admit(graph, options)
        except CduiError as exc:
            if exc.code != "invalid_graph" or not isinstance(exc.details, list):
                raise  # the target, the device, a full disk: the same for every variant
            return [dict(e) if isinstance(e, dict) else {"message": str(e)} for e in exc.details]
        if admitted.secrets:
            raise CduiError("sweep_secrets", "the graph has secret params (API keys); a sweep stores its graph "
                            "to release variants later, and secrets are never stored",
                            hint="run such a graph with `cdui run`, or leave the secret param empty")
        return []

    async def _sweep(self, sweep_id: str) -> dict[str, Any]:
        sweep = await self.store.sweeps.get(sweep_id)
        if sweep is None:
            raise NotFound("sweep", sweep_id, hint="list sweeps with GET /api/sweeps")
        return sweep

    async def get(self, sweep_id: str) -> dict[str, Any]:
        sweep = await self._sweep(sweep_id)
        rows = await self.store.sweeps.variants(sweep_id)
        objective = sweep["spec"].get("objective")
        variants = []
        for r in rows:
            metrics = r["metrics"]
            value = metrics.get(objective["metric"]) if objective and metrics else None
            started, finished = r["started_at"], r["finished_at"]
            variants.append({
                "index": r["idx"], "params": r["params"], "run_id": r["run_id"] if r["has_run"] else None,
                "status": r["status"], "worker_id": r["worker_id"], "device": r["slot_device"],
                "started_at": iso(started), "finished_at": iso(finished),
                "duration_s": round(finished - started, 3) if started and finished else None,
                "metrics": metrics, "objective": value, "best": False,
                "error": r["variant_error"] or r["run_error"], "previous_runs": r["previous_runs"]})
        best = None
        if objective:
            done = [v for v in variants if v["status"] == "succeeded" and isinstance(v["objective"], (int, float))]
            if done:
                pick = min if objective["goal"] == "min" else max
                b = pick(done, key=lambda v: v["objective"])
                b["best"] = True
                best = {"index": b["index"], "run_id": b["run_id"], "objective": b["objective"], "params": b["params"]}
        counts: dict[str, int] = {}
        for v in variants:
            counts[v["status"]] = counts.get(v["status"], 0) + 1
        return {**_summary(sweep, counts), "variants": variants, "best": best}

    async def list(self, limit: int = 100) -> dict[str, Any]:
        rows = await self.store.sweeps.listing(max(1, min(limit, MAX_LISTED)))
        return {"sweeps": [_summary(r, r["counts"]) for r in rows]}

    async def stop(self, sweep_id: str) -> dict[str, Any]:
        """No more variants are released; the waiting ones end cancelled, queued runs are cancelled and
        running ones stopped (as ``POST /api/runs/{id}/stop`` does)."""
        await self._sweep(sweep_id)
        lock = self._locks.setdefault(sweep_id, asyncio.Lock())
        async with lock:  # not while a release is between its check and its run
            live = await self.store.sweeps.stop(sweep_id, self.runs.clock.time())
        for run_id in live:
            try:
                await self.runs.stop(run_id)
            except NotFound:
                pass
        return await self.get(sweep_id)

    async def retry(self, sweep_id: str) -> dict[str, Any]:
        """The failed, interrupted and cancelled variants again, as new runs (their old runs stay)."""
        if (await self._sweep(sweep_id))["kind"] == "study":  # its sampler asks for its trials; none is run again
            raise CduiError("study_retry", f"{sweep_id} is a study: its trials are not retried",
                            hint="start a new study (POST /api/studies or `cdui study`)", status=409)
        n = await self.store.sweeps.retry(sweep_id)
        await self.release(sweep_id)
        return {**await self.get(sweep_id), "retried": n}

    async def delete(self, sweep_id: str, keep_runs: bool = False) -> dict[str, Any]:
        """Remove the sweep and (unless ``keep_runs``) every run its variants had; refused while any of
        them is queued or running."""
        sweep = await self.get(sweep_id)
        live = [v["run_id"] for v in sweep["variants"] if v["status"] in LIVE]
        if live or sweep["status"] == "running":
            raise CduiError("sweep_active", f"sweep {sweep_id} has {len(live)} run(s) queued or running and "
                            f"{sweep['counts'].get('waiting', 0)} variant(s) waiting; it cannot be deleted yet",
                            hint=f"stop it first: POST /api/sweeps/{sweep_id}/stop (or `cdui sweep stop {sweep_id}`)",
                            status=409)
        lock = self._locks.setdefault(sweep_id, asyncio.Lock())
        async with lock:
            run_ids = await self.store.sweeps.delete(sweep_id)
        self._locks.pop(sweep_id, None)
        self._graphs.pop(sweep_id, None)
        self._admitted.pop(sweep_id, None)
        if run_ids is None:
            raise NotFound("sweep", sweep_id)
        deleted, warnings = [], []
        if not keep_runs:
            for run_id in run_ids:
                try:
                    warning = await self.runs.delete(run_id)
                except NotFound:
                    continue
                except CduiError as exc:  # a run retried elsewhere and still going: it stays
                    warnings.append(f"run {run_id}: {exc.message}")
                    continue
                deleted.append(run_id)
                if warning:
                    warnings.append(f"run {run_id}: {warning}")
        return {"id": sweep_id, "deleted": True, "runs_deleted": deleted, "runs_kept": [] if not keep_runs else
                run_ids, "warnings": warnings}


def _status(state: str, counts: dict[str, int], to_ask: bool = False) -> str:
    """``to_ask``: a study that has not yet asked for all its trials. Between a trial's end and the ask of
    the next one it has no trial waiting or live, and is still running (`cdui study --wait` ends on finished)."""
    live = sum(counts.get(s, 0) for s in LIVE)
    if state == "stopped":
        return "stopping" if live else "stopped"
    return "running" if live or counts.get("waiting", 0) or to_ask else "finished"


def _summary(sweep: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    spec = sweep["spec"]
    n_trials = spec.get("n_trials") if sweep["kind"] == "study" else None
    to_ask = isinstance(n_trials, int) and sum(counts.values()) < n_trials
    return {"id": sweep["id"], "kind": sweep["kind"], "name": sweep["name"],
            "status": _status(sweep["state"], counts, to_ask),
            "mode": spec.get("mode"), "axes": spec.get("axes"), "count": spec.get("count"), "seed": spec.get("seed"),
            "objective": spec.get("objective"), "max_running": sweep["max_running"], "options": sweep["options"],
            "created_at": iso(sweep["created_at"]), "stopped_at": iso(sweep["stopped_at"]),
            "total": sum(counts.values()), "counts": counts}


def _light_variant(graph: dict[str, Any], params: dict[str, Any], declared: dict[str, list[str]]) -> dict[str, Any]:
    """The variant's graph without a deep copy of the sweep's: the nodes it changes are copied down to their
    params (each a node with a data object, as the plain params' check requires), the rest shared."""
    changed = {split_key(key)[0] for key in params}
    nodes = []
    for n in graph.get("nodes") or []:
        if isinstance(n, dict) and str(n.get("id")) in changed and isinstance(n.get("data"), dict):
            n = {**n, "data": {**n["data"], "params": dict(n["data"].get("params") or {})}}
        nodes.append(n)
    g = {**graph, "nodes": nodes}
    for key, value in params.items():
        set_param(g, key, value, declared)
    return g


def _metric(ev: dict[str, Any]) -> tuple[str, Any] | None:
    """(name, value) of a metric event with a finite number (None for any other event)."""
    d = ev["data"]
    if ev["kind"] != "metric" or not isinstance(d, dict) or not isinstance(d.get("name"), str):
        return None
    value = d.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return d["name"][:128], value


def _error_text(exc: CduiError) -> str:
    text = exc.message + (f" ({exc.hint})" if exc.hint else "")
    if isinstance(exc.details, list):
        text += ": " + "; ".join(str(e.get("message") if isinstance(e, dict) else e) for e in exc.details[:5])
    return text


SWEEPS: web.AppKey[SweepService] = web.AppKey("sweeps")

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
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.graph.params import ParamError, declared_of, set_param
from cdui.plane.runs import RunService, iso
from cdui.plane.sched.placement import FilePlan
from cdui.plane.store import TERMINAL
from cdui.wire.runopts import parse_run_options
from cdui.wire.sweepspec import expand, parse_spec
from cdui.wire.target import Target

log = logging.getLogger(__name__)
LIVE = ("queued", "running", "disconnected")
BODY_FIELDS = {"graph", "name", "mode", "axes", "variants", "count", "seed", "options", "max_running", "objective"}
MAX_NAME = 200
MAX_METRICS = 64           # metric names kept per variant
METRICS_PAGE = 2000        # events read at a time for a run's final metrics
MAX_LISTED = 500
MAX_ERRORS = 200           # distinct errors a refused sweep lists


class SweepService:
    def __init__(self, runs: RunService) -> None:
        self.runs = runs
        self.store = runs.store
        self._locks: dict[str, asyncio.Lock] = {}
        self._run_sweep: dict[str, str] = {}  # the live runs of sweeps -> their sweep

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
        await self.release(sweep_id)

    # -- releasing variants -----------------------------------------------------------------
    async def release(self, sweep_id: str) -> None:
        """Turn waiting variants into runs while the sweep has room under its max_running."""
        lock = self._locks.setdefault(sweep_id, asyncio.Lock())
        async with lock:
            sweep = await self.store.sweeps.get(sweep_id, with_graph=True)
            if sweep is None or sweep["state"] != "active" or self.runs.store.full:
                return
            room = int(sweep["max_running"]) - await self.store.sweeps.live_count(sweep_id)
            if room <= 0:
                return
            declared = declared_of(self.runs.registry, sweep["graph"])
            for idx, params in await self.store.sweeps.waiting(sweep_id, room):
                graph = copy.deepcopy(sweep["graph"])
                try:
                    for key, value in params.items():
                        set_param(graph, key, value, declared)
                    graph["name"] = f"{sweep['name'] or 'sweep ' + sweep_id} #{idx}"
                    admitted = await self.runs.admit(graph, sweep["options"])
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

    async def final_metrics(self, run_id: str) -> dict[str, Any] | None:
        """The last value of each metric the run emitted (None: it emitted none)."""
        out: dict[str, Any] = {}
        after = 0
        while True:
            evs = await self.store.events(run_id, after, METRICS_PAGE)
            for ev in evs:
                after = ev["seq"]
                d = ev["data"]
                if ev["kind"] != "metric" or not isinstance(d, dict) or not isinstance(d.get("name"), str):
                    continue
                value = d.get("value")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    continue
                name = d["name"][:128]
                if name in out or len(out) < MAX_METRICS:
                    out[name] = value
            if len(evs) < METRICS_PAGE:
                break
        return out or None

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
        """Every distinct error of every variant (each naming the variants it is found in)."""
        declared = declared_of(self.runs.registry, graph)
        found: dict[tuple[Any, ...], dict[str, Any]] = {}

        def add(error: dict[str, Any], idx: int) -> None:
            key = (error.get("node_id"), error.get("code"), error.get("message"))
            if key not in found:
                if len(found) >= MAX_ERRORS:
                    return
                found[key] = {**error, "variants": []}
            found[key]["variants"].append(idx)

        for idx, params in enumerate(variants):
            g = copy.deepcopy(graph)
            bad = False
            for key, value in params.items():
                try:
                    set_param(g, key, value, declared)
                except ParamError as exc:
                    add({"node_id": exc.node_id, "code": "bad_param", "param": key,
                         "message": f"{key}={value!r}: {exc.message}", "hint": exc.hint}, idx)
                    bad = True
            if bad:
                continue
            try:
                admitted = await self.runs.admit(g, options)
            except CduiError as exc:
                if exc.code != "invalid_graph" or not isinstance(exc.details, list):
                    raise  # the target, the device, a full disk: the same for every variant
                for e in exc.details:
                    add(dict(e) if isinstance(e, dict) else {"message": str(e)}, idx)
                continue
            if admitted.secrets:
                raise CduiError("sweep_secrets", "the graph has secret params (API keys); a sweep stores its graph "
                                "to release variants later, and secrets are never stored",
                                hint="run such a graph with `cdui run`, or leave the secret param empty")
        return list(found.values())

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


def _status(state: str, counts: dict[str, int]) -> str:
    live = sum(counts.get(s, 0) for s in LIVE)
    if state == "stopped":
        return "stopping" if live else "stopped"
    return "running" if live or counts.get("waiting", 0) else "finished"


def _summary(sweep: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    spec = sweep["spec"]
    return {"id": sweep["id"], "kind": sweep["kind"], "name": sweep["name"], "status": _status(sweep["state"], counts),
            "mode": spec.get("mode"), "axes": spec.get("axes"), "count": spec.get("count"), "seed": spec.get("seed"),
            "objective": spec.get("objective"), "max_running": sweep["max_running"], "options": sweep["options"],
            "created_at": iso(sweep["created_at"]), "stopped_at": iso(sweep["stopped_at"]),
            "total": sum(counts.values()), "counts": counts}


def _error_text(exc: CduiError) -> str:
    text = exc.message + (f" ({exc.hint})" if exc.hint else "")
    if isinstance(exc.details, list):
        text += ": " + "; ".join(str(e.get("message") if isinstance(e, dict) else e) for e in exc.details[:5])
    return text


SWEEPS: web.AppKey[SweepService] = web.AppKey("sweeps")

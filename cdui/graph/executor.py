"""Runs a validated plan, node by node, inside the run subprocess."""
from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from cdui.graph.context import RunContext, RunStopped
from cdui.graph.model import parse
from cdui.graph.validate import Plan, PlanNode, build_plan
from cdui.nodes.registry import Registry


class NodeFailed(Exception):
    def __init__(self, node_id: str, node_type: str, error: str, tb: str) -> None:
        super().__init__(f"node {node_id!r} ({node_type}) failed: {error}")
        self.node_id = node_id
        self.node_type = node_type
        self.error = error
        self.tb = tb


def _summary(value: Any) -> Any:
    """A small JSON-safe description of a node output for node_status events."""
    # A value can be a tensor or a module only if torch is already imported; importing it
    # here just to find out would cost every run that never uses torch seconds.
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            d: dict[str, Any] = {"type": "tensor", "shape": list(value.shape), "dtype": str(value.dtype)}
            if value.numel() <= 16:
                d["value"] = value.detach().cpu().tolist()
            return d
        if isinstance(value, torch.nn.Module):
            return {"type": "model", "class": type(value).__name__,
                    "parameters": sum(p.numel() for p in value.parameters())}
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if isinstance(value, str):
        return value if len(value) <= 500 else value[:500] + "..."
    if isinstance(value, (list, tuple)):
        return {"type": "list", "length": len(value)}
    return {"type": type(value).__name__}


MAX_STEPS = 64  # steps of one node reported; a node that records more is cut there
MAX_STEP_VALUES = 16  # values of one step reported


def _step_dict(step: Any) -> dict[str, Any]:
    """One entry of ``__steps__`` (a Step, CodefyUI's or ours, or a dict of the same fields) as a dict."""
    get = step.get if isinstance(step, dict) else (lambda k, d=None: getattr(step, k, d))
    tensors, scalars = get("tensors", {}), get("scalars", {})
    return {"name": str(get("name", "") or "")[:200], "description": str(get("description", "") or "")[:1000],
            "tensors": dict(tensors) if isinstance(tensors, dict) else {},
            "scalars": {str(k): v for k, v in (scalars.items() if isinstance(scalars, dict) else [])
                        if isinstance(v, (int, float)) and not isinstance(v, bool)}}


class NodeCache(Protocol):
    """The canvas process's execution cache (cdui/run/canvas_proc.py), as the executor uses it."""

    def key(self, pn: PlanNode, inputs: dict[str, tuple[str, bool, str]]) -> tuple[str, bool]:
        """``pn``'s key and whether the cache may answer for it, from its inputs' ``(key, cacheable,
        output port)``: a node below one the cache may not answer for is not answered either."""

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The outputs kept under ``key``, or None."""

    def ran(self, pn: PlanNode, key: str, cacheable: bool, result: dict[str, Any]) -> None:
        """``pn`` ran and gave ``result`` (before any node downstream of it sees it)."""


class Executor:
    def __init__(self, registry: Registry, ctx: RunContext,
                 on_outputs: Callable[[str, str, dict[str, Any]], None] | None = None,
                 cache: NodeCache | None = None, statuses: bool = True) -> None:
        self.registry = registry
        self.ctx = ctx
        # Nodes return their __steps__ only while a run records its outputs, where the steps are kept.
        self.ctx.verbose = on_outputs is not None
        # Given each reported node's outputs when it completes (recorded outputs, cdui/run/outputs.py).
        self.on_outputs = on_outputs
        # A canvas run's cache: an unchanged node answers from it (node_status "cached") instead of running.
        self.cache = cache
        # False: no node_status or node_steps events (an app's serving process, whose invokes nobody watches
        # node by node: describing each node's outputs cost more than running a small model).
        self.statuses = statuses

    def run(self, plan: Plan) -> dict[str, dict[str, Any]]:
        self.ctx.run_preset = lambda name, inputs: self.run_preset(plan, name, inputs)
        return self._execute(plan.order, {})

    def _execute(self, order: list[PlanNode], injected: dict[tuple[str, str], Any],
                 report: bool = True) -> dict[str, dict[str, Any]]:
        outputs: dict[str, dict[str, Any]] = {}
        cache = self.cache if report and not injected else None
        statuses = report and self.statuses
        keys: dict[str, tuple[str, bool]] = {}
        for pn in order:
            self.ctx.check_stop()
            inputs: dict[str, Any] = {}
            for port, (src, src_port) in pn.inputs.items():
                inputs[port] = outputs.get(src, {}).get(src_port)
            for (nid, port), value in injected.items():
                if nid == pn.id:
                    inputs[port] = value
            key, cacheable = "", False
            if cache is not None:
                key, cacheable = cache.key(pn, {port: (*keys.get(src, ("", False)), src_port)
                                                for port, (src, src_port) in pn.inputs.items()})
                keys[pn.id] = (key, cacheable)
                hit = cache.lookup(key) if cacheable else None
                if hit is not None:
                    outputs[pn.id] = hit
                    self._report_done(pn, hit, "cached", 0.0)
                    continue
            prev = (self.ctx.node_id, self.ctx.node_type)
            self.ctx.node_id, self.ctx.node_type = pn.id, pn.type
            if statuses:
                self.ctx.emit("node_status", {"status": "running", "type": pn.type})
            t0 = time.monotonic()
            try:
                node = pn.cls()
                result = node.execute(inputs, dict(pn.params), self.ctx) or {}
            except RunStopped:
                if statuses:
                    self.ctx.emit("node_status", {"status": "stopped", "type": pn.type})
                raise
            except NodeFailed:
                raise
            except Exception as exc:  # a node's own failure: report it with the node named
                if statuses:
                    self.ctx.emit("node_status", {"status": "failed", "type": pn.type,
                                                  "error": f"{type(exc).__name__}: {exc}"})
                raise NodeFailed(pn.origin, pn.type, f"{type(exc).__name__}: {exc}", traceback.format_exc()) from exc
            finally:
                self.ctx.node_id, self.ctx.node_type = prev
            if not isinstance(result, dict):
                raise NodeFailed(pn.origin, pn.type, f"execute returned {type(result).__name__}, not a dict", "")
            steps = result.pop("__steps__", None)
            step_values = self._report_steps(pn, steps) if steps and report else {}
            outputs[pn.id] = result
            if cache is not None:
                cache.ran(pn, key, cacheable, result)
            if report:
                self._report_done(pn, result, "done", time.monotonic() - t0, step_values)
        return outputs

    def _report_steps(self, pn: PlanNode, steps: Any) -> dict[str, Any]:
        """A node's ``__steps__``: one ``node_steps`` event (names, descriptions, numbers, value summaries) and,
        when outputs are recorded, each step's values as outputs ``__step__<i>__<name>`` beside the node's own,
        with ``__step__<i>__meta`` saying what the step was (CodefyUI's names for them)."""
        listed = [_step_dict(s) for s in (steps if isinstance(steps, (list, tuple)) else [])][:MAX_STEPS]
        if self.statuses:
            prev = self.ctx.node_id
            self.ctx.node_id = pn.id
            self.ctx.emit("node_steps", {"type": pn.type, "steps": [
                {"name": s["name"], "description": s["description"], "scalars": s["scalars"],
                 "values": {k: _summary(v) for k, v in list(s["tensors"].items())[:MAX_STEP_VALUES]}}
                for s in listed]})
            self.ctx.node_id = prev
        extra: dict[str, Any] = {}
        if self.on_outputs is not None:
            for i, s in enumerate(listed):
                numbers = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                                    for k, v in s["scalars"].items())
                extra[f"__step__{i}__meta"] = f"{s['name']}: {s['description']}" + (f" ({numbers})" if numbers else "")
                for k, v in list(s["tensors"].items())[:MAX_STEP_VALUES]:
                    extra[f"__step__{i}__{k}"] = v
        return extra

    def _report_done(self, pn: PlanNode, result: dict[str, Any], status: str, seconds: float,
                     step_values: dict[str, Any] | None = None) -> None:
        if self.statuses:
            prev = self.ctx.node_id
            self.ctx.node_id = pn.id
            self.ctx.emit("node_status", {
                "status": status, "type": pn.type, "seconds": round(seconds, 3),
                "outputs": {k: _summary(v) for k, v in result.items()}})
            self.ctx.node_id = prev
        if self.on_outputs is not None:
            self.on_outputs(pn.id, pn.type, {**result, **step_values} if step_values else result)

    def run_preset(self, plan: Plan, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run preset ``name`` once with ``inputs`` on its exposed inputs (used by Map)."""
        name = name.removeprefix("preset:")
        preset = plan.presets.get(name)
        if preset is None:
            # A ValueError, as CodefyUI's Map raises for a name it does not find.
            raise ValueError(f"Map: preset {name!r} was not found (it is not installed); add it to the "
                             f"graph's 'presets' list or to data/presets/, or name an installed one")
        g, errors = parse({"nodes": [{"id": "p", "type": "preset:" + name}], "edges": []}, plan.presets)
        exposed_in = {p["name"]: (f"p__{p['internal_node']}", p["internal_port"])
                      for p in preset.get("exposed_inputs", [])}
        exposed_out = {p["name"]: (f"p__{p['internal_node']}", p["internal_port"])
                       for p in preset.get("exposed_outputs", [])}
        sub = build_plan(g, self.registry, None, errors, external_inputs=set(exposed_in.values()))
        if errors:
            raise ValueError("; ".join(e["message"] for e in errors))
        # Map cannot know the preset's input name: "" means its first exposed input (CodefyUI's rule).
        first = next(iter(exposed_in), None)
        inputs = {(first if k == "" and first is not None else k): v for k, v in inputs.items()}
        injected = {exposed_in[k]: v for k, v in inputs.items() if k in exposed_in}
        outs = self._execute(sub.order, injected, report=False)
        return {k: outs.get(nid, {}).get(port) for k, (nid, port) in exposed_out.items()}

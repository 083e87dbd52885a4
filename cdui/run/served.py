"""The lines between a published app's serving pool and its serving process: the version once, then only
each invoke's inputs (docs/apps.md, "Warm serving").

A serving process is a canvas process (:mod:`cdui.run.canvas_proc`) that serves one frozen app version.
Sending it the version's whole job at every invoke made it read, validate and plan the same graph again
each time, and made the pool encode it each time. Instead, after its ``canvas`` line it gets:

- ``version {"id": ID, "job": JOB}`` once: the version's job, its GraphInputs holding no caller's value.
  The process checks and plans the graph once and keeps the plan (a graph that is not valid there fails
  every invoke with the same error a run of it would give).
- ``invoke {"id": ID, "inputs": {NODE_ID: VALUE}}`` per invoke: the callers' values by GraphInput node id,
  each put into that node's ``value`` param as :func:`cdui.graph.contract.fill_inputs` does. The process
  answers with the run's events it needs (``graph_output`` lines) and one ``result`` line, as for a job.
  An invoke naming a version the process was not given, or a node that is no GraphInput of its plan, is
  answered with a failed ``result`` and runs nothing.

What cannot change between invokes of one version is done once: the plan, the node registry, the layout.
What may change is still checked at each invoke: the nodes' preflights (a dataset's files gone), every
node's execution as before, and the execution cache's keys of the nodes it may answer for (a file a node
reads that changed makes it run again).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from cdui.graph.validate import Plan, PlanNode
from cdui.wire.job import Job, JobError

VERSION = "version "
INVOKE = "invoke "
INPUT_TYPE = "GraphInput"
ID_MAX = 200


class ServedError(ValueError):
    """A ``version`` or ``invoke`` line that does not fit its shape; the text says what was wrong."""


@dataclass(frozen=True)
class Invoke:
    """One invoke: the version it is for and the callers' values by GraphInput node id."""
    version_id: str
    inputs: dict[str, Any]


def version_line(version_id: str, job: Job) -> str:
    return VERSION + json.dumps({"id": version_id, "job": job.to_dict()}) + "\n"


def invoke_line(version_id: str, inputs: dict[str, Any]) -> str:
    return INVOKE + json.dumps({"id": version_id, "inputs": inputs}, allow_nan=False) + "\n"


def _object(text: str, what: str) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except ValueError as exc:
        raise ServedError(f"{what} line is not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ServedError(f"{what} line holds a {type(d).__name__}, not an object")
    vid = d.get("id")
    if not isinstance(vid, str) or not vid or len(vid) > ID_MAX:
        raise ServedError(f"{what} line's id {str(vid)[:40]!r} is not a version id")
    return d


def parse_version(line: str) -> tuple[str, Job]:
    """A ``version`` line (its prefix included): the version's id and its job."""
    d = _object(line[len(VERSION):], "a version")
    if not isinstance(d.get("job"), dict):
        raise ServedError(f"version {d['id']!r}: job must be an object, got {type(d.get('job')).__name__}")
    try:
        return d["id"], Job.from_dict(d["job"])
    except JobError as exc:
        raise ServedError(f"version {d['id']!r}: {exc}") from None


def parse_invoke(line: str) -> Invoke:
    """An ``invoke`` line (its prefix included)."""
    d = _object(line[len(INVOKE):], "an invoke")
    inputs = d.get("inputs")
    if not isinstance(inputs, dict):
        raise ServedError(f"invoke of {d['id']!r}: inputs must be an object of GraphInput node id -> value")
    return Invoke(d["id"], inputs)


def input_ids(plan: Plan) -> frozenset[str]:
    """The GraphInput nodes of a plan's top level, whose ``value`` an invoke may set."""
    return frozenset(pn.id for pn in plan.order if pn.type == INPUT_TYPE and pn.id == pn.origin)


def with_inputs(plan: Plan, inputs: dict[str, Any], allowed: frozenset[str]) -> Plan:
    """The plan with each given value in its GraphInput's ``value`` param; the kept plan is not changed (the
    nodes given a value are copies). Raises :class:`ServedError` naming a node that is not in ``allowed``."""
    unknown = sorted(set(inputs) - allowed)
    if unknown:
        raise ServedError(f"the invoke gives values to {unknown[:5]}, which are not GraphInput nodes of the "
                          f"version (those are {sorted(allowed)[:20]})")
    if not inputs:
        return plan
    order: list[PlanNode] = [replace(pn, params={**pn.params, "value": inputs[pn.id]}) if pn.id in inputs else pn
                             for pn in plan.order]
    return Plan(order, plan.presets, plan.pruned)

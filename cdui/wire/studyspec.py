"""A study's request (``POST /api/studies``): its search space, objective, sampler, pruner and sizes, read
and bounded here, before anything is stored; pure (no Optuna: the control plane turns this into Optuna's
objects in cdui/plane/studies.py, so that a request is judged the same with or without it installed).

A search-space axis is ``NODE.PARAM`` -> one of:

- a list of values (or ``{"values": [...]}``): a choice among them (numbers, text, true/false, null);
- ``{"range": [low, high, step]}``: numbers from low to high by step (ints stay ints);
- ``{"uniform": [low, high]}``, ``{"loguniform": [low, high]}`` (low > 0), ``{"randint": [low, high]}``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from cdui.core.errors import CduiError
from cdui.wire.sweepspec import DISTRIBUTIONS, MAX_AXES, MAX_KEY, parse_objective, text_value

MAX_TRIALS = 2000        # trials in one study
MAX_PARALLEL = 256       # trials in flight at once
MAX_CHOICES = 1000       # values of one choice axis
MAX_STARTUP = 1000
SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("none", "median", "successive_halving")
BODY_FIELDS = {"graph", "name", "axes", "options", "objective", "sampler", "pruner", "n_trials", "parallelism",
               "seed"}
HINT_AXIS = ('e.g. "optimizer.lr": {"loguniform": [0.0001, 0.1]}, "train.epochs": [10, 20], '
             '"model.hidden": {"range": [32, 128, 32]}')
HINT_BODY = ('POST {"graph": {...}, "axes": {"optimizer.lr": {"loguniform": [0.0001, 0.1]}}, '
             '"objective": {"metric": "val_loss", "goal": "min"}, "n_trials": 20, "options": {"target": "any"}}')


def _bad(message: str, hint: str = HINT_AXIS) -> CduiError:
    return CduiError("bad_study", message, hint=hint)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Dim:
    """One axis of the search space: ``kind`` choice (``choices``), int or float (``low``..``high``, ``step``
    or None, ``log``)."""
    key: str
    kind: str
    choices: tuple[Any, ...] = ()
    low: float = 0
    high: float = 0
    step: float | None = None
    log: bool = False

    def to_json(self) -> Any:
        if self.kind == "choice":
            return {"values": list(self.choices)}
        if self.step is not None:
            return {"range": [self.low, self.high, self.step]}
        if self.kind == "int":
            return {"randint": [self.low, self.high]}
        return {"loguniform" if self.log else "uniform": [self.low, self.high]}

    def probes(self) -> list[Any]:
        """The values a request is checked with before it is stored: every choice, or both ends."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def parse_dim(key: Any, raw: Any) -> Dim:
    if not isinstance(key, str) or not 3 <= len(key) <= MAX_KEY or "." not in key.strip("."):
        raise _bad(f"axis name {str(key)[:100]!r} is not NODE.PARAM", "e.g. optimizer.lr (the node's id, a dot, "
                   "the param's name)")
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict) or len(raw) != 1:
        raise _bad(f"axis {key}: {json.dumps(raw)[:200]} is not a list of values, a range or a distribution")
    (form, arg), = raw.items()
    if form == "values":
        if not isinstance(arg, list) or not arg or len(arg) > MAX_CHOICES:
            raise _bad(f"axis {key}: values must be a list of 1 to {MAX_CHOICES} values, got {json.dumps(arg)[:200]}")
        for v in arg:
            if not (v is None or isinstance(v, (bool, str)) or _num(v)):
                raise _bad(f"axis {key}: value {json.dumps(v)[:100]} is not a number, text, true/false or null",
                           "a study chooses among plain values; give lists and objects as a sweep's values")
        if len(set(map(json.dumps, arg))) != len(arg):
            raise _bad(f"axis {key}: values {json.dumps(arg)[:200]} repeat a value", "give each value once")
        return Dim(key, "choice", choices=tuple(arg))
    if form == "range":
        if not (isinstance(arg, list) and len(arg) == 3 and all(_num(v) for v in arg)):
            raise _bad(f"axis {key}: range must be [low, high, step], three numbers, got {json.dumps(arg)[:200]}",
                       'e.g. {"range": [32, 128, 32]}')
        low, high, step = arg
        if step <= 0 or high <= low:
            raise _bad(f"axis {key}: range [{low}, {high}, {step}] needs low < high and a step above 0",
                       'e.g. {"range": [32, 128, 32]}')
        kind = "int" if all(_int(v) for v in arg) else "float"
        n = math.floor((high - low) / step + 1e-9)
        top = low + n * step if kind == "int" else round(low + n * step, 12)  # high itself when step divides it
        return Dim(key, kind, low=low, high=top, step=step)
    if form in DISTRIBUTIONS:
        if not (isinstance(arg, list) and len(arg) == 2 and _num(arg[0]) and _num(arg[1]) and arg[0] < arg[1]):
            raise _bad(f"axis {key}: {form} needs [low, high] with low < high, got {json.dumps(arg)[:200]}",
                       f'e.g. {{"{form}": [0.0001, 0.1]}}')
        if form == "loguniform" and arg[0] <= 0:
            raise _bad(f"axis {key}: loguniform needs low > 0, got {arg[0]}", 'e.g. {"loguniform": [0.0001, 0.1]}')
        if form == "randint":
            if not all(_int(v) for v in arg):
                raise _bad(f"axis {key}: randint needs two integers, got {arg}", 'e.g. {"randint": [16, 256]}')
            return Dim(key, "int", low=arg[0], high=arg[1])
        return Dim(key, "float", low=float(arg[0]), high=float(arg[1]), log=form == "loguniform")
    raise _bad(f"axis {key}: {str(form)[:50]!r} is not values, range, uniform, loguniform or randint")


def _named(raw: Any, what: str, names: tuple[str, ...], default: str, fields: set[str]) -> dict[str, Any]:
    """A sampler or pruner: its name, or an object with ``name`` and its settings."""
    if raw is None:
        raw = default
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or raw.get("name") not in names:
        got = raw.get("name") if isinstance(raw, dict) else raw
        raise _bad(f"{what} {json.dumps(got)[:100]} is not one of {', '.join(names)}",
                   f'e.g. "{what}": "{default}", or {{"name": "{names[1]}"' + (f', "{sorted(fields)[0]}": 5}}'
                                                                              if fields else "}"))
    unknown = sorted(set(raw) - fields - {"name"})
    if unknown:
        raise _bad(f"{what} setting(s) {', '.join(unknown)} are not known", "its settings are "
                   + (", ".join(sorted(fields)) or "none"))
    for k in fields & set(raw):
        v = raw[k]
        if not _int(v) or not 0 <= v <= MAX_STARTUP:
            raise _bad(f"{what} {k} {json.dumps(v)[:50]} is not an integer from 0 to {MAX_STARTUP}", f'e.g. "{k}": 5')
    return dict(raw)


@dataclass(frozen=True)
class StudySpec:
    dims: tuple[Dim, ...]
    objective: dict[str, str]
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    n_trials: int
    parallelism: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        """What is stored and shown (the sweep's fields a listing reads, and the study's own)."""
        return {"mode": "study", "axes": {d.key: d.to_json() for d in self.dims}, "count": self.n_trials,
                "seed": self.seed, "objective": self.objective, "max_running": self.parallelism,
                "sampler": self.sampler, "pruner": self.pruner, "n_trials": self.n_trials}

    def grid_size(self) -> int | None:
        """The grid sampler's number of points (None: an axis is not a list of values)."""
        if any(d.kind != "choice" for d in self.dims):
            return None
        return math.prod(len(d.choices) for d in self.dims)


def parse_study(body: Any) -> StudySpec:
    """The study part of a ``POST /api/studies`` body, or :class:`CduiError` ``bad_study`` naming what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("graph"), dict):
        raise CduiError("bad_request", "the body must be an object with 'graph', 'axes' and 'objective'",
                        hint=HINT_BODY)
    unknown = sorted(set(body) - BODY_FIELDS)
    if unknown:
        raise _bad(f"unknown field(s) {', '.join(unknown)} in the study",
                   f"the fields are {', '.join(sorted(BODY_FIELDS))}")
    raw_axes = body.get("axes")
    if not isinstance(raw_axes, dict) or not raw_axes:
        raise _bad("a study needs axes: an object of NODE.PARAM -> values, a range or a distribution")
    if len(raw_axes) > MAX_AXES:
        raise _bad(f"{len(raw_axes)} axes, more than {MAX_AXES}", "search fewer params at once")
    dims = tuple(parse_dim(k, v) for k, v in raw_axes.items())
    if body.get("objective") is None:
        raise _bad("a study needs an objective: the metric it optimises and min or max",
                   '"objective": {"metric": "val_loss", "goal": "min"}')
    try:
        objective = parse_objective(body["objective"])
    except CduiError as exc:
        raise _bad(exc.message, exc.hint or "") from None
    assert objective is not None
    sampler = _named(body.get("sampler"), "sampler", SAMPLERS, "tpe", {"startup_trials"})
    pruner = _named(body.get("pruner"), "pruner", PRUNERS, "none", {"startup_trials", "warmup_steps"})
    n_trials = body.get("n_trials", 20)
    if not _int(n_trials) or not 1 <= n_trials <= MAX_TRIALS:
        raise _bad(f"n_trials {json.dumps(n_trials)[:50]} is not an integer from 1 to {MAX_TRIALS}", '"n_trials": 20')
    parallelism = body.get("parallelism", 1)
    if not _int(parallelism) or not 1 <= parallelism <= MAX_PARALLEL:
        raise _bad(f"parallelism {json.dumps(parallelism)[:50]} is not an integer from 1 to {MAX_PARALLEL}",
                   "how many trials may be queued or running at once, e.g. 2")
    seed = body.get("seed", 0)
    if not _int(seed) or not 0 <= seed < 2**32:
        raise _bad(f"seed {json.dumps(seed)[:50]} is not an integer from 0 to 2^32-1", '"seed": 1')
    spec = StudySpec(dims, objective, sampler, pruner, n_trials, parallelism, seed)
    if sampler["name"] == "grid":
        size = spec.grid_size()
        if size is None:
            raise _bad("the grid sampler needs every axis as a list of values", 'e.g. "train.epochs": [10, 20]; or '
                       'use "sampler": "tpe" for ranges and distributions')
        spec = StudySpec(dims, objective, sampler, pruner, min(n_trials, size), parallelism, seed)
    return spec


# -- the command line's text forms ---------------------------------------------------------------
_DIST_TEXT = re.compile(r"(uniform|loguniform|randint|range):([^:]+):([^:]+)(?::([^:]+))?")


def dim_from_text(text: str) -> tuple[str, Any]:
    """``NODE.PARAM=SPEC`` as (key, axis JSON): ``loguniform:1e-4:1e-1``, ``uniform:0:1``, ``randint:16:256``,
    ``range:32:128:32``, or as a sweep's ``--param`` (``a,b,c`` values, ``start:stop:step``)."""
    key, eq, raw = text.partition("=")
    if not eq or "." not in key:
        raise CduiError("bad_param", f"--param {text!r} is not NODE.PARAM=SPEC",
                        hint="e.g. --param optimizer.lr=loguniform:1e-4:1e-1 or --param train.epochs=10,20")
    raw = raw.strip()
    m = _DIST_TEXT.fullmatch(raw)
    if m:
        form = m.group(1)
        ends = [text_value(p) for p in m.groups()[1:] if p is not None]
        if (form == "range") != (len(ends) == 3):
            raise CduiError("bad_param", f"--param {text!r}: {form} takes " + ("low:high:step" if form == "range"
                            else "low:high"), hint="e.g. loguniform:1e-4:1e-1, randint:16:256, range:32:128:32")
        return key, {form: ends}
    parts = raw.split(":")
    if len(parts) == 3 and all(_num(text_value(p)) for p in parts):
        return key, {"range": [text_value(p) for p in parts]}
    return key, {"values": [text_value(p) for p in raw.split(",")]}

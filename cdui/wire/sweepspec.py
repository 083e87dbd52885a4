"""A sweep's request (``POST /api/sweeps``): its axes, mode and objective, read and expanded into
variants; and the text forms the command line turns into axes (``--param train.lr=0.1,0.01``).

Pure and bounded: every count a request can name is capped here, before anything is expanded.

An axis is ``NODE.PARAM`` -> one of:

- a list of values, or ``{"values": [...]}``;
- ``{"range": [start, stop, step]}``: start, start+step, ... up to and including stop;
- for ``random`` mode only, a distribution: ``{"uniform": [low, high]}``, ``{"loguniform": [low, high]}``
  or ``{"randint": [low, high]}`` (both ends included).

Modes: ``grid`` (every combination), ``list`` (the i-th value of every axis together, or explicit
``variants``), ``random`` (``count`` variants drawn with ``seed``; a list or range axis is drawn from).
"""
from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from cdui.core.errors import CduiError

MAX_VARIANTS = 10_000   # variants in one sweep
MAX_AXES = 64           # axes of one sweep
MAX_KEY = 200           # characters of an axis name
MODES = ("grid", "list", "random")
DISTRIBUTIONS = ("uniform", "loguniform", "randint")
GOALS = ("min", "max")
HINT_AXIS = ('e.g. "train.lr": [0.1, 0.01], "model.hidden": {"range": [32, 128, 32]}, or in random mode '
             '"train.lr": {"loguniform": [0.0001, 0.1]}')


def _bad(message: str, hint: str = HINT_AXIS) -> CduiError:
    return CduiError("bad_sweep", message, hint=hint)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[Any, ...] | None = None    # a list or an expanded range
    dist: str | None = None                  # or a distribution (random mode)
    low: float = 0.0
    high: float = 0.0

    def to_json(self) -> Any:
        if self.dist is not None:
            return {self.dist: [self.low, self.high]}
        return {"values": list(self.values or ())}


def range_values(key: str, start: Any, stop: Any, step: Any) -> tuple[Any, ...]:
    """start, start+step, ... up to and including stop (ints stay ints; floats are rounded to 12
    digits, so 0.1:0.3:0.1 gives 0.3, not 0.30000000000000004)."""
    if not (_num(start) and _num(stop) and _num(step)):
        raise _bad(f"axis {key}: range [{start!r}, {stop!r}, {step!r}] must be three numbers: start, stop, step",
                   'e.g. {"range": [32, 128, 32]} gives 32, 64, 96, 128')
    if step == 0 or (stop - start) * step < 0:
        raise _bad(f"axis {key}: range [{start}, {stop}, {step}] never reaches {stop} from {start}",
                   "give a step with the sign of stop - start, not 0")
    n = math.floor((stop - start) / step + 1e-9) + 1
    if n > MAX_VARIANTS:
        raise _bad(f"axis {key}: range [{start}, {stop}, {step}] has {n} values, more than {MAX_VARIANTS}",
                   "use a larger step")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return tuple(start + i * step for i in range(n))
    return tuple(round(start + i * step, 12) for i in range(n))


def parse_axis(key: Any, raw: Any) -> Axis:
    if not isinstance(key, str) or not 3 <= len(key) <= MAX_KEY or "." not in key.strip("."):
        raise _bad(f"axis name {key!r} is not NODE.PARAM", "e.g. train.lr (the node's id, a dot, the param's name)")
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict) or len(raw) != 1:
        raise _bad(f"axis {key}: {json.dumps(raw)[:200]} is not a list of values, a range or a distribution")
    (form, arg), = raw.items()
    if form == "values":
        if not isinstance(arg, list) or not arg:
            raise _bad(f"axis {key}: values must be a non-empty list, got {json.dumps(arg)[:200]}")
        if len(arg) > MAX_VARIANTS:
            raise _bad(f"axis {key}: {len(arg)} values, more than {MAX_VARIANTS}", "sweep fewer values")
        return Axis(key, values=tuple(arg))
    if form == "range":
        if not isinstance(arg, list) or len(arg) != 3:
            raise _bad(f"axis {key}: range must be [start, stop, step], got {json.dumps(arg)[:200]}",
                       'e.g. {"range": [32, 128, 32]}')
        return Axis(key, values=range_values(key, *arg))
    if form in DISTRIBUTIONS:
        if not (isinstance(arg, list) and len(arg) == 2 and _num(arg[0]) and _num(arg[1]) and arg[0] <= arg[1]):
            raise _bad(f"axis {key}: {form} needs [low, high] with low <= high, got {json.dumps(arg)[:200]}",
                       f'e.g. {{"{form}": [0.0001, 0.1]}}')
        if form == "loguniform" and arg[0] <= 0:
            raise _bad(f"axis {key}: loguniform needs low > 0, got {arg[0]}", 'e.g. {"loguniform": [0.0001, 0.1]}')
        if form == "randint" and not all(isinstance(v, int) for v in arg):
            raise _bad(f"axis {key}: randint needs two integers, got {arg}", 'e.g. {"randint": [16, 256]}')
        return Axis(key, dist=form, low=arg[0], high=arg[1])
    raise _bad(f"axis {key}: {form!r} is not values, range, uniform, loguniform or randint")


@dataclass(frozen=True)
class SweepSpec:
    mode: str
    axes: tuple[Axis, ...]
    variants: tuple[dict[str, Any], ...]
    count: int | None
    seed: int
    objective: dict[str, str] | None
    max_running: int

    def to_json(self) -> dict[str, Any]:
        """What is stored and shown of the request (the variants are stored one by one)."""
        return {"mode": self.mode, "axes": {a.key: a.to_json() for a in self.axes}, "count": self.count,
                "seed": self.seed, "objective": self.objective, "max_running": self.max_running}


def parse_objective(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"metric": raw}
    metric = raw.get("metric") if isinstance(raw, dict) else None
    goal = raw.get("goal", "min") if isinstance(raw, dict) else None
    if not isinstance(metric, str) or not 0 < len(metric) <= 128 or goal not in GOALS:
        raise _bad(f"objective {json.dumps(raw)[:200]} is not a metric name and a goal (min or max)",
                   'e.g. "objective": {"metric": "val_loss", "goal": "min"}')
    return {"metric": metric, "goal": str(goal)}


def parse_spec(body: dict[str, Any], default_max_running: int = 4) -> SweepSpec:
    """The sweep part of a ``POST /api/sweeps`` body, or :class:`CduiError` ``bad_sweep`` naming what is wrong."""
    mode = body.get("mode", "grid")
    if mode not in MODES:
        raise _bad(f"mode {mode!r} is not grid, list or random", "give \"mode\": \"grid\", \"list\" or \"random\"")
    raw_axes = body.get("axes") or {}
    if not isinstance(raw_axes, dict):
        raise _bad("axes must be an object of NODE.PARAM -> values")
    if len(raw_axes) > MAX_AXES:
        raise _bad(f"{len(raw_axes)} axes, more than {MAX_AXES}", "sweep fewer params at once")
    axes = tuple(parse_axis(k, v) for k, v in raw_axes.items())
    raw_variants = body.get("variants")
    variants: tuple[dict[str, Any], ...] = ()
    if raw_variants is not None:
        if mode != "list" or axes:
            raise _bad("explicit variants are for list mode without axes", 'give "mode": "list" and "variants": '
                       '[{"train.lr": 0.1}, ...], and no "axes"')
        if not isinstance(raw_variants, list) or not raw_variants or len(raw_variants) > MAX_VARIANTS:
            raise _bad(f"variants must be a list of 1 to {MAX_VARIANTS} objects")
        for i, v in enumerate(raw_variants):
            if not isinstance(v, dict) or not v or len(v) > MAX_AXES:
                raise _bad(f"variant {i} is not an object of NODE.PARAM -> value",
                           'e.g. "variants": [{"train.lr": 0.1, "train.epochs": 10}]')
            for k in v:
                parse_axis(k, [0])  # the key's form
        variants = tuple(dict(v) for v in raw_variants)
    elif not axes:
        raise _bad("a sweep needs at least one axis (or, in list mode, variants)")
    dists = [a.key for a in axes if a.dist is not None]
    if dists and mode != "random":
        raise _bad(f"axis {dists[0]} is a distribution: only random mode draws from one",
                   "give \"mode\": \"random\" with a count, or list the values")
    count = body.get("count")
    if mode == "random":
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_VARIANTS:
            raise _bad(f"random mode needs a count from 1 to {MAX_VARIANTS}, got {count!r}", 'e.g. "count": 20')
    elif count is not None:
        raise _bad(f"count is for random mode only (mode is {mode})", "leave count out, or give \"mode\": \"random\"")
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _bad(f"seed {seed!r} is not an integer", 'e.g. "seed": 1')
    max_running = body.get("max_running", default_max_running)
    if not isinstance(max_running, int) or isinstance(max_running, bool) or not 1 <= max_running <= MAX_VARIANTS:
        raise _bad(f"max_running {max_running!r} is not a number from 1 to {MAX_VARIANTS}",
                   "how many of the sweep's runs may be queued or running at once, e.g. 8")
    spec = SweepSpec(mode, axes, variants, count, seed, parse_objective(body.get("objective")), max_running)
    expand(spec)  # refuses a sweep too large, or list axes of different lengths, before anything else
    return spec


def expand(spec: SweepSpec) -> list[dict[str, Any]]:
    """The variants, in order: each a ``{NODE.PARAM: value}``."""
    if spec.variants:
        return [dict(v) for v in spec.variants]
    keys = [a.key for a in spec.axes]
    if spec.mode == "grid":
        total = math.prod(len(a.values or ()) for a in spec.axes)
        if total > MAX_VARIANTS:
            raise _bad(f"the grid has {total} variants, more than {MAX_VARIANTS}", "sweep fewer values, or use "
                       "random mode with a count")
        combos = itertools.product(*(a.values or () for a in spec.axes))
        return [dict(zip(keys, combo, strict=True)) for combo in combos]
    if spec.mode == "list":
        lengths = {a.key: len(a.values or ()) for a in spec.axes}
        if len(set(lengths.values())) != 1:
            raise _bad("list mode pairs the i-th values of every axis, but the axes have different lengths: "
                       + ", ".join(f"{k} {n}" for k, n in lengths.items()), "give every axis as many values")
        n = next(iter(lengths.values()))
        return [{a.key: (a.values or ())[i] for a in spec.axes} for i in range(n)]
    rng = random.Random(spec.seed)
    out = []
    for _ in range(spec.count or 0):
        v: dict[str, Any] = {}
        for a in spec.axes:
            if a.values is not None:
                v[a.key] = rng.choice(a.values)
            elif a.dist == "uniform":
                v[a.key] = rng.uniform(a.low, a.high)
            elif a.dist == "loguniform":
                v[a.key] = math.exp(rng.uniform(math.log(a.low), math.log(a.high)))
            else:
                v[a.key] = rng.randint(int(a.low), int(a.high))
        out.append(v)
    return out


# -- the command line's text forms ---------------------------------------------------------------
_DIST = re.compile(r"(uniform|loguniform|randint)\((.*)\)")


def text_value(text: str) -> Any:
    """A value typed as text: JSON where it parses (numbers, true/false, lists, quoted text), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def axis_from_text(text: str) -> tuple[str, Any]:
    """``NODE.PARAM=SPEC`` as (key, axis JSON): ``a,b,c`` values (each JSON where it parses, else text),
    ``start:stop:step`` a range (stop included), ``uniform(lo,hi)``/``loguniform(lo,hi)``/``randint(lo,hi)``
    a distribution (random mode)."""
    key, eq, raw = text.partition("=")
    if not eq or "." not in key:
        raise CduiError("bad_param", f"--param {text!r} is not NODE.PARAM=VALUES",
                        hint="e.g. --param train.lr=0.1,0.01,0.001 or --param model.hidden=32:128:32")
    raw = raw.strip()
    m = _DIST.fullmatch(raw)
    if m:
        ends = [text_value(p.strip()) for p in m.group(2).split(",")]
        return key, {m.group(1): ends}
    parts = raw.split(":")
    if len(parts) == 3:
        nums = [text_value(p) for p in parts]
        if all(_num(n) for n in nums):
            return key, {"range": nums}
    return key, {"values": [text_value(p) for p in raw.split(",")]}

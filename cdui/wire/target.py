"""A run's target: where it may run, parsed once from what a submit gives and matched everywhere else.

Four kinds, as the submit options and the stored ``runs.target`` column write them:

- :class:`Local` ``"local"`` (also what no target means): this server's own devices;
- :class:`AnyWorker` ``"any"``: any connected executor, workers first, never a one-shot worker;
- :class:`Worker` ``{"worker": NAME}`` (or a bare ``"NAME"``): that worker, or that instance ``NAME.ID``;
- :class:`Pool` ``{"pool": "one-shot"}`` (or ``"one-shot"``): the next one-shot worker offering the device.

:func:`parse_target` is the only place the raw forms are read; :func:`target_json` gives the one form that
is stored and shown (the database row, the run's options, ``GET /api/runs/{id}``), so a target is written
exactly as before. Code that decides by target uses ``match`` on these classes.
"""
from __future__ import annotations

from dataclasses import dataclass

from cdui.core.errors import CduiError

POOL = "one-shot"  # the one pool there is


@dataclass(frozen=True)
class Local:
    """This server's own devices."""


@dataclass(frozen=True)
class AnyWorker:
    """Any executor that may take it (workers before this server, never a one-shot worker)."""


@dataclass(frozen=True)
class Worker:
    """One named worker (a credential's name, or ``NAME.ID`` for a one-shot instance)."""

    name: str


@dataclass(frozen=True)
class Pool:
    """The one-shot pool: the next one-shot worker that offers the run's device."""

    name: str = POOL


Target = Local | AnyWorker | Worker | Pool

TargetJson = str | dict[str, str]


def parse_target(raw: object) -> Target:
    """The target a submit's ``options.target`` (or a stored row) names; raises ``bad_target`` listing the
    accepted forms. None is ``local``; a bare string other than ``local``, ``any`` and ``one-shot`` names
    a worker."""
    if raw is None or raw == "local":
        return Local()
    if raw == "any":
        return AnyWorker()
    if raw == POOL:
        return Pool()
    if isinstance(raw, str) and raw:
        return Worker(raw)
    if isinstance(raw, dict):
        name = raw.get("worker")
        if isinstance(name, str) and name:
            return Worker(name)
        if raw.get("pool") == POOL:
            return Pool()
    raise CduiError("bad_target", f"target {raw!r} is not valid",
                    hint='use "local", "any", {"worker": NAME} or {"pool": "one-shot"}')


def target_json(target: Target) -> TargetJson:
    """The stored and shown form: ``"local"``, ``"any"``, ``{"worker": NAME}`` or ``{"pool": "one-shot"}``."""
    match target:
        case Local():
            return "local"
        case AnyWorker():
            return "any"
        case Worker(name=name):
            return {"worker": name}
        case Pool(name=name):
            return {"pool": name}


def worker_name(target: Target) -> str | None:
    """The worker a target names, or None (local, any, the pool)."""
    match target:
        case Worker(name=name):
            return name
        case _:
            return None

"""Placing device sets and runs on devices shared by memory: the control plane's policy.

What a set and share by memory are, and their written form, is in :mod:`cdui.wire.devicesets`;
here are the decisions: which slots of one executor a set gets now (:func:`choose`), the largest
set an executor could ever give (:func:`largest`, for the refusal at submit), the memory each
held run needs on its devices (:class:`DeviceBook`) and why a run waits (:func:`busy_text`).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError
from cdui.wire.devicesets import (
    DEFAULT_MEMORY_MB,
    Key,
    device_matches,
    join,
    members,
    memory_need,
    parse_shared,
    set_size,
    shares,
    slots_used,
)
from cdui.wire.target import AnyWorker, Local, Pool, Target, Worker


# -- placement ------------------------------------------------------------------------------------
@dataclass
class Ask:
    """What a run asks of placement beyond one slot: a set of ``count``, and on shared
    devices (``capacity``: their total MiB; None where the worker reported none) ``need`` MiB each."""

    count: int = 1
    need: int = DEFAULT_MEMORY_MB
    capacity: dict[Key, int | None] = field(default_factory=dict)
    used_mb: dict[Key, int] = field(default_factory=dict)

    def admits(self, key: Key, n: int, used: Mapping[Key, int], slots: int) -> bool:
        """Whether ``n`` more members fit on device ``key``."""
        if key in self.capacity:
            cap = self.capacity[key]
            return cap is not None and self.used_mb.get(key, 0) + n * self.need <= cap
        return used.get(key, 0) + n <= slots

    def most(self, key: Key, slots: int) -> int:
        """The most members device ``key`` could ever hold at once."""
        if key in self.capacity:
            cap = self.capacity[key]
            return 0 if cap is None else cap // self.need
        return slots


def _matching(devices: list[str], wanted: str | None) -> list[str]:
    return [d for d in devices if device_matches(wanted, d)]


def _groups(devices: list[str], wanted: str | None) -> list[list[str]]:
    """The device groups a set may come from, in the order tried: CUDA cards, then the CPU
    (a set is of one kind; ``auto`` prefers cards, as a single run does)."""
    devs = _matching(devices, wanted)
    cards = [d for d in devs if d.startswith("cuda")]  # in the executor's own order
    rest = sorted(d for d in devs if not d.startswith("cuda"))
    return ([cards] if cards else []) + [[d] for d in rest]


def choose(ex: Any, wanted: str | None, used: Mapping[Key, int], caps: Any, ask: Ask) -> str | None:
    """The set (or single slot) for ``ask`` on executor ``ex`` now, or None if it must wait."""
    for group in _groups(ex.devices(), wanted):
        if len(group) == 1 and not group[0].startswith("cuda"):
            d = group[0]  # the CPU (or mps): the members share it
            if ask.admits((ex.name, d), ask.count, used, caps.slots(ex.name, d)):
                return join([d] * ask.count)
            continue
        free = [d for d in group if ask.admits((ex.name, d), 1, used, caps.slots(ex.name, d))]
        if len(free) >= ask.count:
            return join(free[:ask.count])
    return None


def largest(ex: Any, wanted: str | None, caps: Any, ask: Ask) -> int:
    """The largest set ``ex`` could give a run of this kind when idle."""
    best = 0
    for group in _groups(ex.devices(), wanted):
        if len(group) == 1 and not group[0].startswith("cuda"):
            best = max(best, ask.most((ex.name, group[0]), caps.slots(ex.name, group[0])))
        else:
            best = max(best, sum(1 for d in group if ask.most((ex.name, d), caps.slots(ex.name, d)) >= 1))
    return best


def busy_text(name: str, wanted: str | None, ask: Ask, devices: list[str] | None = None) -> str:
    kind = "device" if wanted in (None, "", "auto") else wanted
    matching = _matching(devices or [], wanted)
    blind = [d for d in matching if (name, d) in ask.capacity and ask.capacity[(name, d)] is None]
    if blind and len(blind) == len(matching):
        return f"{name} shares {'/'.join(blind)} by memory but reported no memory for it"
    if ask.count > 1:
        return f"{name} has no {ask.count} free {kind} slots for the set"
    return f"{name} has no free {kind} slot or memory"


def fits_text(wanted: str | None, count: int) -> str:
    kind = "device" if wanted in (None, "", "auto") else wanted
    return f"waiting for {count} free {kind} slots on one worker"



class DeviceBook:
    """The control plane's memory bookkeeping: each held run's need, and which workers share by memory."""

    def __init__(self) -> None:
        self.needs: dict[str, int] = {}
        self.shared: dict[str, frozenset[str]] = {}  # worker -> the devices it shares ("*": all)

    def load(self, stored: Mapping[str, str]) -> None:
        """The settings as stored (worker -> its JSON text), read at start."""
        settings = {name: parse_shared(text) for name, text in stored.items()}
        self.shared = {name: s for name, s in settings.items() if s is not None}

    def hold(self, run_id: str, options: Mapping[str, Any]) -> None:
        self.needs[run_id] = memory_need(options)

    def setting(self, executor: str) -> frozenset[str] | None:
        # An instance NAME.ID of a one-shot credential shares what its credential shares.
        s = self.shared.get(executor)
        return s if s is not None else self.shared.get(executor.rpartition(".")[0]) if "." in executor else None

    def used_mb(self, active: Mapping[str, tuple[str, str]]) -> dict[Key, int]:
        for rid in [r for r in self.needs if r not in active]:
            del self.needs[rid]  # ended or requeued: its memory is free
        used: dict[Key, int] = {}
        for rid, (ex, slot) in active.items():
            self.took(used, ex, slot, self.needs.get(rid, DEFAULT_MEMORY_MB))
        return used

    def forget_ended(self, active: Mapping[str, tuple[str, str]]) -> None:
        """Forget the needs of runs that no longer hold a slot, now and then: often enough that they
        stay about as many as the running runs, rarely enough that it costs a pass nothing on average."""
        if len(self.needs) > 2 * len(active) + 256:
            for rid in [r for r in self.needs if r not in active]:
                del self.needs[rid]

    @staticmethod
    def took(used_mb: dict[Key, int], executor: str, slot: str, need: int) -> None:
        for d in members(slot):
            used_mb[(executor, d)] = used_mb.get((executor, d), 0) + need

    def ask(self, options: Mapping[str, Any], executors: Mapping[str, Any], used_mb: dict[Key, int]) -> Ask | None:
        """The run's :class:`Ask`, or None for a plain run where no device is shared (the old path)."""
        count = set_size(options)
        if count == 1 and not self.shared:
            return None  # the common case costs a dispatch pass nothing more
        capacity: dict[Key, int | None] = {}
        for name, ex in executors.items():
            setting = self.setting(name)
            if setting is None:
                continue
            report = device_memory(ex)
            for d in ex.devices():
                if shares(setting, d):
                    capacity[(name, d)] = (report.get(d) or {}).get("total_mb")
        if count == 1 and not capacity:
            return None
        return Ask(count, memory_need(options), capacity, used_mb)

    def card(self, name: str, devices: list[str], here: list[tuple[str, str, str]], report: Mapping[str, Any],
             caps: Any) -> dict[str, Any]:
        """The card's ``devices`` (slots in use counted per member) and ``share_by_memory``."""
        setting = self.setting(name)
        used = slots_used((ex, slot) for _, ex, slot in here)
        mb: dict[Key, int] = {}
        for rid, ex, slot in here:
            self.took(mb, ex, slot, self.needs.get(rid, DEFAULT_MEMORY_MB))
        rows = []
        for d in devices:
            row: dict[str, Any] = {"device": d, "slots": caps.slots(name, d), "in_use": used.get((name, d), 0),
                                   "memory": report.get(d), "shared_by_memory": shares(setting, d)}
            if shares(setting, d):
                row["memory_in_use_mb"] = mb.get((name, d), 0)
            rows.append(row)
        return {"devices": rows, "share_by_memory": sorted(setting) if setting is not None else []}


def device_memory(ex: Any) -> Mapping[str, Any]:
    """An executor's reported memory; this server's own executor reads its CPU's now."""
    report = getattr(ex, "device_memory", None)
    if callable(report):
        return report() or {}
    return {}



# -- the check at submit ---------------------------------------------------------------------------
@dataclass
class _Offered:
    """An enrolled worker that is not connected, with the devices it offered when it last was."""

    name: str
    offered: list[str]

    def devices(self) -> list[str]:
        return list(self.offered)


async def check_fit(target: Target, wanted: str, device_set: Mapping[str, Any], executors: Mapping[str, Any],
                    caps: Any, book: DeviceBook, stored: Callable[[], Awaitable[Mapping[str, list[str]]]]) -> None:
    """Refuse at submit a set larger than any executor the target may use offers (even when idle);
    ``stored`` reads the devices each enrolled worker's last agent offered."""
    count = set_size(device_set)
    if count == 1:
        return
    seen: dict[str, Any] = {n: ex for n, ex in executors.items() if not getattr(ex, "one_shot", False)}
    for name, devs in (await stored()).items():
        if name not in seen:
            seen[name] = _Offered(name, devs)
    match target:
        case Local():
            names = ["local"]
        case AnyWorker():
            names = list(seen)
        case Worker(name=name):
            names = [name]
        case Pool():
            return
    ask = Ask(count, memory_need(device_set), {}, {})
    best: dict[str, int] = {}
    for n in names:
        ex = seen.get(n)
        if ex is None:
            continue
        for d in ex.devices():
            if shares(book.setting(n), d):
                ask.capacity[(n, d)] = (device_memory(ex).get(d) or {}).get("total_mb")
        best[n] = largest(ex, wanted, caps, ask)
    if not best or max(best.values()) >= count:
        return  # an unknown worker is refused elsewhere with its own message
    kind = "device" if wanted in ("", "auto") else wanted
    offered = ", ".join(f"{n}: {k}" for n, k in sorted(best.items())[:5])
    raise CduiError("device_set_too_large",
                    f"a set of {count} {kind} slots on one worker was asked for, but no worker the target may "
                    f"use offers that many ({offered}); nothing was stored",
                    hint="ask for fewer (\"devices\"), offer more slots (CODEFYUI_RUN_QUEUE_MAX_CONCURRENT "
                         "cpu=N or NAME/cpu=N, or more cards with --devices), or target another worker")

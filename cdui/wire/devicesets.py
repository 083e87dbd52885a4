"""Device sets and "Share by memory": a run given several devices of one executor,
and devices that admit runs by memory instead of by slot count.

A run asks for a set with the submit options ``"devices": N`` (2..64) beside the
usual ``"device"`` kind (``cpu``, ``cuda`` or ``auto``; a set never names one card).
Placement gives it N slots of ONE executor, never spread over workers:

- CUDA: N distinct cards, each with a free slot (torch.distributed's nccl puts
  one rank on each card, so two members on one card would not train);
- CPU: N slots of the one ``cpu`` device (``CODEFYUI_RUN_QUEUE_MAX_CONCURRENT``
  ``cpu=N`` or ``NAME/cpu=N``); ddp then runs N gloo processes.

The set is written as the slot names joined by commas (``cuda:0,cuda:1``,
``cpu,cpu``) wherever a single slot was written before: the run's ``device``,
the stored ``slot_device``, the job's ``slot_device``, the executor's held
slots. So a set is kept while its worker is disconnected, re-occupied on
adoption and released at the end exactly like one slot, by the same code; only
the few places that count or narrow slots read the members (:func:`members`).

Share by memory is an operator's choice per worker (``POST
/api/workers/{name}/share-by-memory``, optionally for one device). On such a
device the slot count no longer applies: a run is admitted while the memory
needs of the runs on that device plus its own fit the device's total memory, as
the agent reported it (``device_memory`` in its hello: CUDA cards from the
catalog helper, the CPU from ``/proc/meminfo``). A run's need is its
``memory_mb`` option, else :data:`DEFAULT_MEMORY_MB`; each member of a set
needs it on its device.
"""
from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError
from cdui.wire.target import AnyWorker, Local, Pool, Target, Worker

MAX_SET = 64                  # members of one set: ddp's rank limit
DEFAULT_MEMORY_MB = 1024      # a run's need on a shared device when it declares none
MAX_MEMORY_MB = 1 << 24       # 16 TiB: bounds what a submit or a worker's report may claim
MAX_MEMORY_DEVICES = 64       # entries of a worker's device_memory report
ALL = "*"                     # share every device of the worker

Key = tuple[str, str]         # (executor, device)


# -- the submit options ---------------------------------------------------------------------
def _int_option(options: Mapping[str, Any], key: str, low: int, high: int, hint: str) -> int | None:
    v = options.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise CduiError(f"bad_{key}", f"{key} {v!r} is not valid: it must be a whole number from {low} to {high}",
                        hint=hint)
    return v


def submit_options(options: Mapping[str, Any], device: str, pool: bool) -> dict[str, Any]:
    """The set size and memory need a submit asks for, as stored in the run's options
    (nothing when it asks for neither, so existing submits store what they did)."""
    count = _int_option(options, "devices", 1, MAX_SET,
                        f'e.g. "devices": 2 with "device": "cuda" or "cpu" (at most {MAX_SET})')
    need = _int_option(options, "memory_mb", 1, MAX_MEMORY_MB,
                       f"the MiB the run needs on each device it uses on a shared device "
                       f"(default {DEFAULT_MEMORY_MB})")
    out: dict[str, Any] = {}
    if count is not None and count > 1:
        if ":" in device:
            raise CduiError("bad_devices", f"a set of {count} devices cannot be on the one device {device!r}",
                            hint='name the kind ("device": "cuda" or "cpu") and the count ("devices": N)')
        if pool:
            raise CduiError("bad_devices", "device sets are not offered to the one-shot pool",
                            hint="target a worker, any or local, or submit one run per device")
        out["devices"] = count
    if need is not None:
        out["memory_mb"] = need
    return out


def set_size(options: Mapping[str, Any]) -> int:
    v = options.get("devices")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 1 else 1


def memory_need(options: Mapping[str, Any]) -> int:
    v = options.get("memory_mb")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else DEFAULT_MEMORY_MB


def lane_extra(options: Mapping[str, Any]) -> list[Any]:
    """What a run's lane key adds (see cdui/dispatch.lane_of): runs of other set sizes or memory
    needs may get other answers for the same slots. Empty for a plain run, so its key is as before."""
    extra: list[Any] = []
    if set_size(options) > 1:
        extra.append({"devices": set_size(options)})
    if "memory_mb" in options:
        extra.append({"memory_mb": memory_need(options)})
    return extra


# -- the written form of a set ------------------------------------------------------------------
def members(slot: str | None) -> list[str]:
    """The slots a run holds: ``cuda:0,cuda:1`` -> both; a single slot -> itself."""
    return [m.strip() for m in (slot or "cpu").split(",") if m.strip()] or ["cpu"]


def join(devices: Iterable[str]) -> str:
    return ",".join(devices)


def slots_used(held: Iterable[tuple[str, str]]) -> dict[Key, int]:
    """Slots in use per (executor, device), from every run's (executor, slot or set)."""
    used: dict[Key, int] = {}
    for ex, slot in held:
        take(used, ex, slot)
    return used


def take(used: dict[Key, int], executor: str, slot: str) -> None:
    for d in members(slot):
        used[(executor, d)] = used.get((executor, d), 0) + 1


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
    from cdui.plane.sched.queue import device_matches
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


# -- share by memory ----------------------------------------------------------------------------
def parse_shared(text: str | None) -> frozenset[str] | None:
    """A worker's stored setting: the devices it shares by memory (``*``: all), None when off."""
    if not text:
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return None
    if not isinstance(v, list) or not v:
        return None
    return frozenset(str(x) for x in v)


def shares(setting: frozenset[str] | None, device: str) -> bool:
    return setting is not None and (ALL in setting or device in setting)


def parse_memory_report(v: Any, where: str = "hello.device_memory") -> dict[str, dict[str, int]] | None:
    """A worker's ``device_memory`` report, bounded: ``{device: {total_mb, free_mb}}``."""
    from cdui.wire.protocol import MAX_NAME, ProtocolError
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object, got {type(v).__name__}")
    if len(v) > MAX_MEMORY_DEVICES:
        raise ProtocolError(f"{where} lists {len(v)} devices, over the limit of {MAX_MEMORY_DEVICES}")
    out: dict[str, dict[str, int]] = {}
    for dev, facts in v.items():
        if not isinstance(dev, str) or not dev or len(dev) > MAX_NAME:
            raise ProtocolError(f"{where} has a device name that is not a short string")
        if not isinstance(facts, dict):
            raise ProtocolError(f"{where}[{dev!r}] must be an object")
        entry: dict[str, int] = {}
        for k in ("total_mb", "free_mb"):
            x = facts.get(k)
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_MEMORY_MB:
                raise ProtocolError(f"{where}[{dev!r}].{k}={str(x)[:40]!r} is not a whole number of MiB "
                                    f"from 0 to {MAX_MEMORY_MB}")
            entry[k] = x
        out[dev] = entry
    return out


def system_memory(meminfo: str) -> dict[str, int] | None:
    """The CPU's memory from the text of ``/proc/meminfo`` (kB lines)."""
    values: dict[str, int] = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) // 1024
    if "MemTotal" not in values:
        return None
    return {"total_mb": min(values["MemTotal"], MAX_MEMORY_MB),
            "free_mb": min(values.get("MemAvailable", values.get("MemFree", 0)), MAX_MEMORY_MB)}


def memory_report(devices: list[str], cards: Mapping[str, Any] | None) -> dict[str, dict[str, int]]:
    """What an agent reports: the cards' memory as its catalog helper saw them, and the CPU's now."""
    out: dict[str, dict[str, int]] = {}
    for d in devices:
        if d.startswith("cuda") and cards and isinstance(cards.get(d), dict):
            out[d] = {k: int(cards[d][k]) for k in ("total_mb", "free_mb")}
        elif d == "cpu":
            try:
                with open("/proc/meminfo", encoding="ascii") as fh:
                    cpu = system_memory(fh.read(65536))
            except OSError:
                cpu = None
            if cpu is not None:
                out[d] = cpu
    return out


def cuda_memory() -> dict[str, dict[str, int]]:
    """Each visible card's memory (imports torch: only the catalog helper calls it)."""
    out: dict[str, dict[str, int]] = {}
    try:
        import torch
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                out[f"cuda:{i}"] = {"total_mb": int(total) >> 20, "free_mb": int(free) >> 20}
    except Exception:  # no torch or a broken driver: no card memory is reported, shared cards admit nothing
        return {}
    return out


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


# -- the run's process ---------------------------------------------------------------------------
def map_set(slot: str, inherited: str | None) -> tuple[str, str | None]:
    """A set's (device inside the run, the run's ``CUDA_VISIBLE_DEVICES``): the cards of a CUDA
    set are narrowed to exactly the set, in its order, and are ``cuda:0..N-1`` inside the run."""
    from cdui.run.runner import map_slot_device
    devs = members(slot)
    if not devs[0].startswith("cuda"):
        return devs[0], None
    visible = [map_slot_device(d, inherited)[1] for d in devs]
    return "cuda:0", ",".join(v for v in visible if v is not None)


def process_devices(slot: str, process_device: str | None) -> list[str]:
    """The run's devices as its own process names them: a CUDA set's cards are
    ``cuda:0..N-1`` there (the launcher narrowed ``CUDA_VISIBLE_DEVICES`` to them)."""
    devs = members(slot)
    if len(devs) == 1:
        return [process_device or devs[0]]
    return [f"cuda:{i}" for i in range(len(devs))] if devs[0].startswith("cuda") else devs


def run_facts(slot: str, process_device: str | None) -> dict[str, Any]:
    """What the run's process reports of its devices (``execution_facts.devices``)."""
    return {"set": members(slot), "process": process_devices(slot, process_device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def facts_from_report(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The bounded copy of a run's ``devices`` report that its facts keep (a worker may send anything)."""
    d = data.get("devices")
    if not isinstance(d, dict):
        return None
    out: dict[str, Any] = {}
    for k in ("set", "process"):
        v = d.get(k)
        if isinstance(v, list):
            out[k] = [str(x)[:64] for x in v[:MAX_SET]]
    cvd = d.get("cuda_visible_devices")
    out["cuda_visible_devices"] = str(cvd)[:1024] if cvd is not None else None
    return out


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

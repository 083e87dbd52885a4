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

This module holds the shared vocabulary (the submit options, the written form of a set, a
device name against the kind a run asks for, memory reports): the control plane, the agent
and the run process all use it. Placing sets and runs on shared devices is the control
plane's policy, in :mod:`cdui.plane.sched.device_fit`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from cdui.core.errors import CduiError

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



# -- a device name against the device a run asks for -------------------------------------------
def device_kind(device: str | None) -> str:
    if not device or device == "auto":
        return "auto"
    return device.split(":")[0]


def device_matches(wanted: str | None, device: str) -> bool:
    if not wanted or wanted == "auto":
        return True
    if ":" in wanted:
        return wanted == device
    return device.split(":")[0] == wanted


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



# -- the run's process ---------------------------------------------------------------------------
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

"""Each CUDA card's use, for the worker cards' bars: utilisation and memory, read from ``torch.cuda``.

Only an agent that offers CUDA cards reads anything (and imports torch for it, once, off the event loop);
one that offers none reports none, and a figure that cannot be read is null, never guessed. The reading
rides on the heartbeat at most once per :data:`GPU_REPORT_S` (the control plane keeps the last one in
between), and whole MiB and percents keep an idle card's heartbeat the same text from beat to beat,
which the control plane handles without decoding it.

The figures come from NVML through torch (``torch.cuda.utilization``, ``torch.cuda.device_memory_used``),
which opens no CUDA context; without NVML (the ``nvidia-ml-py`` package) the memory comes from
``torch.cuda.mem_get_info``, which opens one on each card the first time (some hundred MiB each), and
the utilisation is not reported.
"""
from __future__ import annotations

import re
from typing import Any

GPU_REPORT_S = 15.0  # the least time between two readings sent
CARD = re.compile(r"cuda:(\d+)")


def cards(devices: list[str]) -> list[str]:
    """The CUDA cards among the devices an agent offers (``cuda:N``)."""
    return [d for d in devices if CARD.fullmatch(d)]


def read(devices: list[str]) -> list[dict[str, Any]] | None:
    """``[{device, util, used_mb, total_mb}]`` for the CUDA cards among ``devices``, or None when there are
    none, torch is missing or sees no CUDA (nothing is reported then)."""
    wanted = cards(devices)
    if not wanted:
        return None  # a CPU-only agent never imports torch for this
    try:
        import torch
        if not torch.cuda.is_available():
            return None
    except Exception:  # no torch, or a broken driver: nothing to report
        return None
    out = []
    for dev in wanted:
        i = int(dev.split(":")[1])
        if i >= torch.cuda.device_count():
            continue
        util: int | None = None
        used: int | None = None
        total: int | None = None
        try:
            util = int(torch.cuda.utilization(i))
        except Exception:  # no NVML here
            util = None
        try:
            used = int(torch.cuda.device_memory_used(i))
            total = int(torch.cuda.get_device_properties(i).total_memory)
        except Exception:
            try:
                free, total = (int(x) for x in torch.cuda.mem_get_info(i))
                used = total - free
            except Exception:
                used = total = None
        if util is None and used is None:
            continue
        out.append({"device": dev, "util": util if util is None else max(0, min(100, util)),
                    "used_mb": None if used is None else max(0, used) >> 20,
                    "total_mb": None if total is None else max(0, total) >> 20})
    return out or None


class Sampler:
    """When the next reading is due (at most one per :data:`GPU_REPORT_S`), on the agent's monotonic clock."""

    def __init__(self, devices: list[str], every_s: float = GPU_REPORT_S) -> None:
        self.active = bool(cards(devices))
        self.every_s = every_s
        self.last: float | None = None

    def due(self, now: float) -> bool:
        if not self.active or (self.last is not None and now - self.last < self.every_s):
            return False
        self.last = now
        return True

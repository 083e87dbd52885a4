"""The one device probe: which devices this machine offers to runs.

Both the control plane (its own local executor) and a worker agent ask here.
The answer is the CUDA cards torch sees, then ``cpu``, which every machine has
(a CUDA machine runs CPU graphs too). Importing torch costs seconds and
hundreds of megabytes and may initialise CUDA, so the probe runs in a short
helper subprocess, ``python -m cdui.run.devices``, which prints the list as JSON;
the processes that ask never import torch themselves.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

log = logging.getLogger("cdui.run.devices")

PROBE_TIMEOUT_S = 120.0


def probe_here() -> list[str]:
    """The devices, seen from this process (imports torch): what the helper prints."""
    try:
        import torch
        if torch.cuda.is_available():
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())] + ["cpu"]
    except Exception:  # torch missing or a broken CUDA: the CPU still runs graphs it can
        pass
    return ["cpu"]


def parse_probe(stdout: str) -> list[str] | None:
    """The helper's answer, or None if it is not a non-empty list of device names."""
    try:
        devs = json.loads(stdout)
    except ValueError:
        return None
    if isinstance(devs, list) and devs and all(isinstance(d, str) and d for d in devs):
        return devs
    return None


# One answer per process and card selection: the cards do not change under a running
# process, and the helper costs seconds (it imports torch). A process that builds
# several control planes (the in-process test tier) probes once.
_answers: dict[tuple[str, str | None], list[str]] = {}


def detect_devices(timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The devices (the helper's answer, once per process); a helper that fails or hangs leaves the CPU,
    with a warning saying why."""
    key = (sys.executable, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if key not in _answers:
        _answers[key] = _probe(timeout)
    return list(_answers[key])


def _probe(timeout: float) -> list[str]:
    cmd = [sys.executable, "-m", "cdui.run.devices"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("the device probe (%s) failed: %s; offering cpu only", " ".join(cmd), exc)
        return ["cpu"]
    devs = parse_probe(proc.stdout) if proc.returncode == 0 else None
    if devs is None:
        log.warning("the device probe (%s) exited %s with %r; offering cpu only", " ".join(cmd),
                    proc.returncode, (proc.stdout + proc.stderr)[-300:])
        return ["cpu"]
    return devs


if __name__ == "__main__":
    print(json.dumps(probe_here()))

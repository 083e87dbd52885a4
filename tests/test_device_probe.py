"""The one device probe: a helper subprocess, so the asking process never imports torch."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cdui.core.config import load
from cdui.core.errors import CduiError
from cdui.plane.runs import RUNS
from cdui.run import devices
from cdui.run.devices import parse_probe
from inproc.harness import Plane


@pytest.mark.parametrize("stdout, expected", [
    ('["cuda:0", "cuda:1", "cpu"]', ["cuda:0", "cuda:1", "cpu"]),
    ('["cpu"]\n', ["cpu"]),
    ("[]", None),                     # no device at all is not an answer
    ('["cpu", 3]', None),
    ('{"cpu": true}', None),
    ("Traceback (most recent call last):", None),
    ("", None),
])
def test_parse_probe(stdout: str, expected: list[str] | None) -> None:
    assert parse_probe(stdout) == expected


@pytest.mark.e2e  # starts the probe subprocess, which imports torch
def test_probe_offers_cpu_and_keeps_torch_out_of_the_caller() -> None:
    """The control plane and the agent both ask detect_devices; cpu is always offered
    (a CUDA worker used to drop it), and the caller's process has not imported torch."""
    code = ("import json, sys; from cdui.run.devices import detect_devices; import cdui.plane.runs, cdui.agent.agent; "
            "print(json.dumps([detect_devices(), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    devs, torch_loaded = json.loads(out)
    assert devs[-1] == "cpu" and all(d.startswith("cuda:") for d in devs[:-1]), devs
    assert torch_loaded is False


@pytest.mark.parametrize("value, expected", [
    ("cpu", ["cpu"]),
    (" cuda:0 , cuda:1,cpu ", ["cuda:0", "cuda:1", "cpu"]),
    ("", []),                         # empty: probe
    ("gpu", None),
    ("cuda:0", None),                 # the CPU is offered on every machine, last, as the probe answers
    ("cpu,cuda:0", None),
    ("cuda:x,cpu", None),
])
def test_local_devices_setting(value: str, expected: list[str] | None) -> None:
    if expected is None:
        with pytest.raises(CduiError, match="CODEFYUI_LOCAL_DEVICES"):
            load({"CODEFYUI_LOCAL_DEVICES": value})
    else:
        assert load({"CODEFYUI_LOCAL_DEVICES": value})["CODEFYUI_LOCAL_DEVICES"] == expected


def test_a_control_plane_given_its_devices_offers_them_without_probing(tmp_path: Path, monkeypatch) -> None:
    """CODEFYUI_LOCAL_DEVICES is what the control plane's local runs get, and no probe runs for it."""
    monkeypatch.setattr(devices, "_probe", lambda timeout: pytest.fail("the devices were probed"))
    monkeypatch.setattr(devices, "_answers", {})

    async def offered() -> list[str]:
        async with Plane(tmp_path / "ud", tmp_path / "data", CODEFYUI_LOCAL_DEVICES="cuda:0,cpu") as cp:
            assert cp.app is not None
            return cp.app[RUNS].executors["local"].devices()
    assert asyncio.run(offered()) == ["cuda:0", "cpu"]

"""The one device probe: a helper subprocess, so the asking process never imports torch."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cdui.run.devices import parse_probe


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

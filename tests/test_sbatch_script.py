"""The shipped ``deploy/slurm/codefyui.sbatch`` run by bash outside SLURM, with a stand-in cdui
launcher and ``module`` command that record how they were called: it asks for no GPU itself
(SBATCH_GRES does), loads the CUDA module only in a job that got a GPU, finds the launcher or
says it cannot, needs CONTROL, and keeps the token off the command line.
tests/test_slurm.py runs the same script under a real single-host SLURM cluster."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from procs import REPO_ROOT

SCRIPT = REPO_ROOT / "deploy" / "slurm" / "codefyui.sbatch"
TOKEN = "abcdef.0123456789abcdef"
RECORDER = """#!/bin/sh
{{ printf '%s\\n' "$0 $*"; printf 'token=%s\\n' "$CODEFYUI_AGENT_TOKEN"; }} >>'{log}'
"""


def recorder(path: Path, log: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECORDER.format(log=log))
    path.chmod(0o755)
    return path


def run(tmp: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The script under bash with a recording `module` first on PATH; (its result, the recorded calls)."""
    log = tmp / "calls"
    recorder(tmp / "bin" / "module", log)
    (tmp / "home").mkdir(exist_ok=True)
    base = {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "HOME": str(tmp / "home"), "CODEFYUI_ENROLL_TOKEN": TOKEN}
    r = subprocess.run(["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=60)
    return r, log.read_text().splitlines() if log.exists() else []


def test_the_script_asks_for_no_gpu_itself() -> None:
    directives = [line for line in SCRIPT.read_text().splitlines() if line.startswith("#SBATCH")]
    assert directives and not any("--gres" in d or "--gpus" in d for d in directives), directives


@pytest.mark.parametrize("gpu_env, module_calls", [
    ({}, []),                                                       # a CPU partition
    ({"SLURM_JOB_GPUS": "0"}, ["load cuda/12.4"]),                  # submitted with SBATCH_GRES=gpu:1
    ({"SLURM_JOB_GPUS": "0", "CUDA_MODULE": "cuda/11.8"}, ["load cuda/11.8"]),
    ({"SLURM_JOB_GPUS": "0", "CUDA_MODULE": ""}, []),               # a cluster that needs no module
])
def test_a_cpu_job_loads_no_cuda_and_the_token_stays_off_the_command_line(tmp_path: Path, gpu_env: dict[str, str],
                                                                          module_calls: list[str]) -> None:
    cdui = recorder(tmp_path / "CodefyUI" / "bin" / "cdui", tmp_path / "calls")
    r, calls = run(tmp_path, {"CONTROL": "https://cp.example", "CDUI": str(cdui), **gpu_env})
    assert r.returncode == 0, r.stderr
    module = f"{tmp_path / 'bin' / 'module'} "
    assert [c.removeprefix(module) for c in calls if c.startswith(module)] == module_calls, calls
    agent = f"{cdui} agent start --one-shot --instance --control https://cp.example --name slurm"
    assert calls[-2:] == [agent, f"token={TOKEN}"], calls  # the token in its environment, not its arguments


def test_the_launcher_is_found_on_path_else_in_the_default_install(tmp_path: Path) -> None:
    on_path = recorder(tmp_path / "p" / "bin" / "cdui", tmp_path / "p" / "calls")
    r, calls = run(tmp_path / "p", {"CONTROL": "https://cp.example"})
    assert r.returncode == 0 and calls[0].startswith(f"{on_path} agent start --one-shot"), (r.stderr, calls)
    default = recorder(tmp_path / "d" / "home" / "CodefyUI" / "bin" / "cdui", tmp_path / "d" / "calls")
    r, calls = run(tmp_path / "d", {"CONTROL": "https://cp.example"})
    assert r.returncode == 0 and calls[0].startswith(f"{default} agent start --one-shot"), (r.stderr, calls)


@pytest.mark.parametrize("env, says", [
    ({}, "CONTROL is not set: give the control plane's URL"),
    ({"CONTROL": "https://cp.example"}, "no cdui launcher at '"),
    ({"CONTROL": "https://cp.example", "CDUI": "/nowhere/bin/cdui"}, "no cdui launcher at '/nowhere/bin/cdui'"),
])
def test_what_the_script_cannot_do_without_ends_the_task_with_4(tmp_path: Path, env: dict[str, str],
                                                                says: str) -> None:
    r, calls = run(tmp_path, env)
    assert r.returncode == 4 and f"codefyui.sbatch: error: {says}" in r.stderr, (r.returncode, r.stderr)
    assert calls == []

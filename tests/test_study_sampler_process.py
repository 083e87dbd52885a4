"""The studies' sampler process (cdui/plane/sampler_proc.py, #27): Optuna asks and tells in one child process of
the control plane, started at the first study, not with the control plane.

A SIGKILL of that process in the middle of a study: the next study call starts a fresh one, where the study is
rebuilt from its stored trials, and the study reaches its n_trials with each trial stored once and run once (a
trial the dead process asked but that was not stored is simply not there). The control plane's shutdown ends
the sampler's process.

A real control plane (`cdui start`) and a fake agent speaking the real worker protocol (tests/inproc/harness.py's
FakeAgent) that answers each run at once with a metric of its trial's param, so trials end as fast as they are
given out and the kill meets the sampler busy asking and telling.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from procs import ServerProc, start_then, wait_for

sys.path.insert(0, str(Path(__file__).parent / "inproc"))
from harness import FakeAgent  # noqa: E402

pytestmark = pytest.mark.e2e
optuna = pytest.importorskip("optuna", reason="the studies extra (Optuna) is not installed")

N_TRIALS = 16
KILL_AFTER = 5   # trials answered before the sampler's process is killed


def sampler_pids(server: ServerProc) -> list[int]:
    """The control plane's children that run the sampler."""
    out = subprocess.run(["ps", "-e", "-ww", "-o", "pid=,ppid=,stat=,args="], text=True, capture_output=True,
                         check=True).stdout
    pids = []
    for line in out.splitlines():
        pid, ppid, stat, args = line.split(None, 3)
        if int(ppid) == server.pid and not stat.startswith("Z") and "cdui.plane.sampler_proc" in args:
            pids.append(int(pid))
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def param_of(assign: dict[str, Any]) -> float:
    return float(next(n for n in assign["job"]["graph"]["nodes"] if n["id"] == "n")["data"]["params"]["value"])


async def answer(agent: FakeAgent, assign: dict[str, Any]) -> None:
    """The run starts, emits its objective (the param's distance to 1.3, squared) and succeeds."""
    run_id = assign["run_id"]
    await agent.status(run_id, "running", pid=1, device="cpu")
    await agent.send(run_id, "metric", name="loss", value=(param_of(assign) - 1.3) ** 2, step=1)
    await agent.status(run_id, "succeeded", error=None)


async def kill_the_sampler_in_the_middle_of_a_study(server: ServerProc) -> None:
    assert sampler_pids(server) == [], "the sampler's process started with the control plane"
    agent = FakeAgent(server, "w1")
    try:
        await agent.enroll()
        await agent.connect()
        study = await asyncio.to_thread(server.call, "POST", "/api/studies", {
            "graph": start_then("TensorCreate"), "axes": {"n.value": {"uniform": [-5.0, 5.0]}},
            "objective": {"metric": "loss", "goal": "min"}, "n_trials": N_TRIALS, "parallelism": 2, "seed": 1,
            "sampler": {"name": "tpe", "startup_trials": 3}, "options": {"target": {"worker": "w1"}, "device": "cpu"}})
        sid = study["id"]
        first = sampler_pids(server)
        assert len(first) == 1, first
        runs: list[str] = []
        while len(runs) < N_TRIALS:
            assign = await agent.assignment(timeout=120)
            runs.append(assign["run_id"])
            await answer(agent, assign)
            if len(runs) == KILL_AFTER:
                os.kill(first[0], signal.SIGKILL)  # the next trials' tells and asks meet it dead or dying

        def finished() -> dict[str, Any] | None:
            s: dict[str, Any] = server.call("GET", f"/api/studies/{sid}")
            return s if s["status"] in ("finished", "stopped") else None
        s = await asyncio.to_thread(wait_for, finished, 120, 0.2, f"study {sid} to finish",
                                    detail=lambda: server.call("GET", f"/api/studies/{sid}")["counts"])
    finally:
        await agent.close()
    assert s["status"] == "finished" and s["total"] == N_TRIALS, s["counts"]
    assert [t["index"] for t in s["trials"]] == list(range(N_TRIALS))
    assert all(t["state"] == "complete" and t["previous_runs"] == [] for t in s["trials"]), s["trials"]
    # each trial has its one run, the one the agent was given for it; no run was given twice or left over
    assert sorted(t["run_id"] for t in s["trials"]) == sorted(runs) and len(set(runs)) == N_TRIALS
    assert not alive(first[0])
    again = sampler_pids(server)
    assert len(again) == 1 and again != first, (first, again)
    server.stop()
    assert not alive(again[0]), "the sampler's process outlived the control plane's shutdown"


def test_a_study_goes_on_after_its_sampler_process_is_killed(tmp_path: Path) -> None:
    # The fake agent sends no heartbeats: a long interval keeps it connected for the whole study.
    server = ServerProc(tmp_path, name="sampler-kill").start({"CODEFYUI_WORKER_HEARTBEAT_S": "600"})
    try:
        asyncio.run(kill_the_sampler_in_the_middle_of_a_study(server))
    finally:
        server.stop()

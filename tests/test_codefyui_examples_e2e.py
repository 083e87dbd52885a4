"""CodefyUI's example graphs, unchanged, as real runs: submitted to a real
control plane process, run in its run subprocess, and once on a real agent
process enrolled with a token (the agent counts as another machine)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from procs import Proc, ServerProc, env_for, wait_for, wait_run

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).parent / "data" / "codefyui_examples"


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / f"{name}.graph.json").read_text(encoding="utf-8"))


def log_messages(cp: ServerProc, run_id: str) -> list[str]:
    return [str(e["data"].get("message", "")) for e in cp.events(run_id) if e["kind"] == "log"]


@pytest.fixture
def cp(tmp_path: Path):
    s = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
    yield s
    s.stop()


def test_examples_run_to_succeeded_on_the_control_plane(cp: ServerProc) -> None:
    for name in ("RLHF-Reward-and-KL", "Mini-UNet-Compact"):
        run = cp.submit(example(name), {"target": "local"})
        done = wait_run(cp, run["id"])
        assert done["status"] == "succeeded", (name, done)
    messages = log_messages(cp, run["id"])
    assert any(m.startswith("[Compact U-Net output (1-step denoise)] tensor(") for m in messages), messages


def test_an_example_runs_to_succeeded_on_a_real_agent(cp: ServerProc, tmp_path: Path) -> None:
    token = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", cp.url, "--token", token,
                  "--name", "w1", "--devices", "cpu", "--foreground"],
                 env_for(tmp_path / "agent", tmp_path / "agent-data", {"CODEFYUI_MACHINE_ID": "another-machine"}),
                 tmp_path / "agent.log", name="agent-w1")
    agent.spawn()
    try:
        def online() -> bool:
            if not agent.alive:
                raise AssertionError(f"agent exited {agent.returncode}:\n{agent.log_tail(30)}")
            return any(w["name"] == "w1" and w["online"] for w in cp.call("GET", "/api/workers", expect=200)["workers"])
        wait_for(online, 120, 0.2, "worker w1 online")
        run = cp.submit(example("Toy-Sampling"), {"target": {"worker": "w1"}})
        done = wait_run(cp, run["id"])
        assert done["status"] == "succeeded" and done["worker_id"] == "w1", done
        assert any(m.startswith("[Final x_0 (untrained → noise)] tensor(") for m in log_messages(cp, run["id"]))
    finally:
        agent.stop()

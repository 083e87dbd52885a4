"""`cdui agent start … --token T` (the command the web page prints) leaves T out of /proc/PID/cmdline.

Every local user can read a process's command line. The agent under test is real, started both
through the launcher and as ``python -m cdui``, and kept enrolling against a loopback port where
nothing listens (it retries), which is where a token used to sit in the command line for as long
as the control plane was away."""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from cdui.core.argv_token import restore_token, split_token
from procs import REPO_ROOT, Proc, cmdlines, env_for, free_port, wait_for


@pytest.mark.parametrize("args, rest, token", [
    (["agent", "start", "--control", "U", "--token", "T1"], ["agent", "start", "--control", "U"], "T1"),
    (["agent", "start", "--token=T2", "--name", "n"], ["agent", "start", "--name", "n"], "T2"),
    (["agent", "start", "--token"], ["agent", "start", "--token"], None),  # argparse refuses it as before
    (["agent", "start", "--control", "U"], ["agent", "start", "--control", "U"], None),
    (["agent", "start", "--", "--token", "x"], ["agent", "start", "--", "--token", "x"], None),
])
def test_split_token(args: list[str], rest: list[str], token: str | None) -> None:
    assert split_token(args) == (rest, token)


def test_a_moved_token_is_the_flag_again_and_leaves_the_environment() -> None:
    class Args:
        token = None
    env = {"CODEFYUI_AGENT_TOKEN": "T", "CODEFYUI_AGENT_TOKEN_FROM_ARGV": "1"}
    args = Args()
    restore_token(args, env)
    assert (args.token, env) == ("T", {})
    env = {"CODEFYUI_AGENT_TOKEN": "from-a-unit-file"}  # set by the operator, not moved: left alone
    args = Args()
    restore_token(args, env)
    assert (args.token, env) == (None, {"CODEFYUI_AGENT_TOKEN": "from-a-unit-file"})


@pytest.mark.e2e  # a real agent process
@pytest.mark.parametrize("launch", ["bin/cdui", "python -m cdui"])
def test_the_token_is_not_in_the_agents_command_line(tmp_path: Path, launch: str) -> None:
    token = "cdui-enroll-" + uuid.uuid4().hex
    control = f"http://127.0.0.1:{free_port()}"
    start = [str(REPO_ROOT / "bin" / "cdui")] if launch == "bin/cdui" else [sys.executable, "-m", "cdui"]
    agent = Proc([*start, "agent", "start", "--control", control, "--token", token, "--foreground"],
                 env_for(tmp_path / "ud"), tmp_path / "agent.log", name="agent-token")
    agent.spawn()
    try:
        # It is enrolling (and retrying): the token is in use by now.
        wait_for(lambda: "retrying in" in agent.log_text() or not agent.alive, timeout=120)
        assert agent.alive, agent.log_tail()
        assert f"enrollment at {control} failed" in agent.log_text()
        pid = agent.pid
        assert pid is not None
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        assert b"agent\0start" in cmdline and b"--token" not in cmdline, cmdline
        assert [p for p, line in cmdlines() if token.encode() in line] == []
        # It went to the environment, which only this user (and root) can read.
        with open(f"/proc/{pid}/environ", "rb") as fh:
            assert f"CODEFYUI_AGENT_TOKEN={token}".encode() in fh.read().split(b"\0")
        assert os.stat(f"/proc/{pid}/environ").st_mode & 0o077 == 0
    finally:
        agent.stop(timeout=30)

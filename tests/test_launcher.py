"""The launcher ``bin/cdui`` as a user runs it (not ``python -m cdui``): every
error reaches the terminal, relative path settings mean the folder the user
ran the command in, and the systemd units keep the promises docs/install.md
makes about restarts, stop budgets and never installing at service start.

These tests go through the real launcher because its shell lines sit between
the user and the Python CLI: a redirection there can silence every message the
CLI prints, and its daemon re-spawn changes the working directory.
"""
from __future__ import annotations

import configparser
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from procs import (REPO_ROOT, ServerProc, env_for, free_port, graph, node, pid_alive, track_log, trig, edge,
                   untrack_log, wait_for)

LAUNCHER = REPO_ROOT / "bin" / "cdui"


def launch(*args: str, env: dict[str, str], cwd: Path | str = REPO_ROOT,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAUNCHER), *args], env=env, cwd=str(cwd), text=True, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def explain(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


# -- every error reaches the terminal ----------------------------------------------------
def test_bad_flag_prints_its_error(tmp_path: Path) -> None:
    """A bad flag through the launcher exits 2 with the CLI's one error line on stderr."""
    r = launch("--badflag", env=env_for(tmp_path / "ud"))
    assert r.returncode == 2, explain(r)
    assert r.stderr == "cdui: error: unrecognized arguments: --badflag (see `cdui --help`)\n", explain(r)
    assert r.stdout == ""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path).start()
    try:
        yield s
    finally:
        s.stop()


def test_run_of_invalid_graph_prints_every_error(server: ServerProc, tmp_path: Path) -> None:
    """`bin/cdui run` of a graph with an unknown node type and a cycle prints both
    errors on stderr and exits 1; nothing is queued."""
    g = graph([node("start", "Start"), node("ghost", "NoSuchNodeType"), node("a", "Print"), node("b", "Print")],
              [trig("start", "ghost"), trig("start", "a"), edge("a", "value", "b", "value"),
               edge("b", "value", "a", "value")], name="unknown type and a cycle")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(g))
    r = launch("run", str(path), env=env_for(server.user_data, server.data_dir))
    assert r.returncode == 1, explain(r)
    assert r.stderr.splitlines() == [
        "cdui: error: the graph has 2 error(s); nothing was stored",
        "  - node ghost: node 'ghost' has unknown type 'NoSuchNodeType' (install the plugin or custom node that "
        "provides it, or remove the node)",
        "  - node a: nodes ['a', 'b'] form a cycle (remove one edge of the loop)",
    ], explain(r)
    assert r.stdout == ""
    assert server.call("GET", "/api/runs") == []

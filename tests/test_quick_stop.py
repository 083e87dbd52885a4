"""`cdui stop` is quick: it asks the server to stop and kills it about 2 s later.

What the server had not ended by then ends ``interrupted`` at the next start,
local and worker runs alike (a worker run is not adopted: its worker had been
told to stop it); a local run's process left without its server ends itself;
an SSH worker's ssh is not killed with the server but ends once its agent,
told to stop, has exited. Driven through the launcher ``bin/cdui``, as a user
stops cdui, against a real sshd on loopback (tests/sshd.py)."""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdui.plane.runs import STOPPED_KILLED
from procs import REPO_ROOT, ServerProc, long_training_graph, pid_alive, start_then, wait_event, wait_for
from sshd import Sshd, running
from syspkgs import requires_command
from test_runs import CUSTOM_NODES, run_pid
from test_ssh_e2e import children_running, tunnel_ssh_pids, wait_tunnel

pytestmark = pytest.mark.e2e

LAUNCHER = REPO_ROOT / "bin" / "cdui"


def _install_misbehaving(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "misbehaving.py").write_text(CUSTOM_NODES)


def _sleeping(server: ServerProc, run_id: str) -> None:
    wait_event(server, run_id, lambda e: e["kind"] == "log" and "ignoring stop" in e["data"].get("message", ""),
               what=f"run {run_id}'s node to start ignoring stops")


@pytest.fixture
def ssh_host(tmp_path: Path) -> Iterator[Sshd]:
    with running(tmp_path / "ssh") as s:
        yield s


@pytest.mark.long
@requires_command("sshd", "openssh-server")
@requires_command("ssh", "openssh-client")
def test_cdui_stop_kills_the_server_after_2_s_and_the_next_start_ends_what_was_stopping(
        tmp_path: Path, ssh_host: Sshd) -> None:
    """A local run that ignores stop requests and an SSH worker's run held with SIGSTOP: the
    server's own graceful stop would wait 10 s and more for them, `bin/cdui stop` kills it after
    about 2 s instead, says so, and leaves no pid file. Then the local run's process ends itself,
    and the worker's ssh ends by itself once its agent has exited. At the next start neither run
    is adopted or left active: both end `interrupted`, saying the server was killed while
    stopping, and the SSH worker connects again with a new agent."""
    server = ServerProc(tmp_path, extra_env={**ssh_host.env(), "CODEFYUI_WORKER_HEARTBEAT_S": "2"})
    _install_misbehaving(server.data_dir)
    server.start()
    try:
        _through_a_quick_stop(server, ssh_host)
    finally:
        server.stop()


def _through_a_quick_stop(server: ServerProc, sshd: Sshd) -> None:
    added = server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "gpu3"}, expect=201)
    first = wait_tunnel(server, "gpu3", "connected")
    agent_pid = first["remote_pid"]
    local = server.submit(start_then("TestIgnoreStop", "sleeper"))
    remote = server.submit(long_training_graph(), {"target": {"worker": "gpu3"}})
    _sleeping(server, local["id"])
    wait_event(server, remote["id"], lambda e: e["kind"] == "metric", what="the worker run's first metric")
    # Held (SIGSTOP), the worker's run cannot stop within the 2 s: its agent ends it after its own grace.
    # The run's own process (its zygote's command line is the same: cdui/run/spare.py).
    runproc = [run_pid(server, remote["id"])]
    assert runproc[0] in children_running(agent_pid, b"cdui.run.runproc")
    os.kill(runproc[0], signal.SIGSTOP)
    local_pid = run_pid(server, local["id"])
    slot_dir = f".codefyui-ssh/{added['remote_dir'].rsplit('/', 1)[1]}"
    assert len(tunnel_ssh_pids(slot_dir)) == 1
    server_pid = server.pid
    assert server.proc is not None and server_pid is not None

    r = subprocess.run([str(LAUNCHER), "stop"], env=server.env, cwd=str(REPO_ROOT), text=True,
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout == (f"cdui (pid {server_pid}) stopped: killed 2 s after the stop request; runs that had "
                        f"not ended by then end interrupted at the next start (to wait for them instead: "
                        f"kill -TERM {server_pid})\n"), (r.stdout, r.stderr)
    assert server.proc.wait(timeout=30) == -9, "the server was not killed"
    assert not (server.user_data / "cdui.pid").exists()
    assert not (server.user_data / "server.json").exists()
    # Nobody is left to kill the local run's process after its grace: it ends itself.
    wait_for(lambda: not pid_alive(local_pid), 120, 0.2, f"the orphaned run process {local_pid} to end")
    # The ssh outlives the server only until its agent, told to stop, has exited.
    wait_for(lambda: agent_pid not in sshd.agent_pids(), 180, 0.2, "the remote agent to exit")
    wait_for(lambda: tunnel_ssh_pids(slot_dir) == [], 60, 0.2, "the worker's ssh to end by itself")

    server.start()
    for run_id, why in ((local["id"], STOPPED_KILLED),
                        (remote["id"], f"{STOPPED_KILLED}; worker gpu3 had been told to stop it")):
        run = server.run(run_id)
        assert (run["status"], run["error"]) == ("interrupted", why), run
    assert not (server.user_data / "server-stopping").exists()
    again = wait_tunnel(server, "gpu3", "connected")
    assert again["remote_pid"] != agent_pid

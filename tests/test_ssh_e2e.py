"""SSH workers end to end: a real control plane, a real OpenSSH server on
loopback (see tests/sshd.py), real remote agents and real torch runs.

The control plane listens on 127.0.0.1 only; sshd is the only other listener.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from procs import (
    SESSION_ENV,
    Proc,
    ServerProc,
    cmdlines,
    free_port,
    long_training_graph,
    wait_event,
    wait_for,
    wait_run,
)
from sshd import Sshd
from sshd import running as running_sshd
from syspkgs import requires_command

pytestmark = [pytest.mark.e2e, requires_command("sshd", "openssh-server"), requires_command("ssh", "openssh-client")]
TOKEN_RE = re.compile(rb"[a-z0-9]{6}\.[a-z0-9]{16}")


@pytest.fixture
def sshd(tmp_path: Path):
    with running_sshd(tmp_path / "ssh") as s:
        yield s


@pytest.fixture
def server(tmp_path: Path, sshd: Sshd):
    srv = ServerProc(tmp_path, extra_env={**sshd.env(), "CODEFYUI_WORKER_HEARTBEAT_S": "2"}).start()
    try:
        yield srv
    finally:
        srv.stop()


def ssh_view(server: ServerProc, name: str) -> dict[str, Any]:
    for w in server.call("GET", "/api/workers/ssh")["ssh_workers"]:
        if w["name"] == name:
            return w
    raise AssertionError(f"no SSH worker {name}")


def wait_tunnel(server: ServerProc, name: str, state: str, timeout: float = 120, after: int = 0,
                **want: Any) -> dict[str, Any]:
    """The tunnel once it is in ``state`` (with ``want``), on an attempt later than ``after``."""
    def check() -> dict[str, Any] | None:
        t = ssh_view(server, name)["tunnel"]
        ok = t["state"] == state and t["attempts"] > after and all(t.get(k) == v for k, v in want.items())
        return t if ok else None

    def detail() -> str:
        logs = [f"{p}: {p.read_text()[-3000:]}" for p in Path("/tmp").glob("rh-*/.codefyui-ssh/*/agent.log")]
        return f"{ssh_view(server, name)['tunnel']}; remote agent logs: {logs}"
    return wait_for(check, timeout, 0.1, f"SSH worker {name}'s tunnel to be {state} {want or ''}", detail=detail)


def tunnel_ssh_pids(slot_dir: str) -> list[int]:
    """The long-lived ssh processes (those with the -R forward to this slot's folder)."""
    out = []
    for pid, cmd in cmdlines():
        argv = cmd.split(b"\0")
        if argv and argv[0].endswith(b"ssh") and b"-R" in argv and any(slot_dir.encode() in a for a in argv):
            out.append(pid)
    return out


def this_planes(added: dict[str, Any]) -> str:
    """The remote folder prefix of every SSH worker of the control plane that answered ``added``
    (``.codefyui-ssh/<its id>-``): other tests, run at the same time by other pytest workers,
    have tunnels of their own, which a check for leftovers must not count."""
    return added["remote_dir"].removeprefix("~/").rpartition("-")[0] + "-"


def children_running(parent: int, needle: bytes) -> list[int]:
    """Descendants of ``parent`` whose command line contains ``needle``."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                table[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out = []
    for p in table:
        q, hops = table.get(p, 0), 0
        while q > 1 and q != parent and hops < 64:
            q, hops = table.get(q, 0), hops + 1
        if q == parent:
            try:
                if needle in Path(f"/proc/{p}/cmdline").read_bytes():
                    out.append(p)
            except OSError:
                continue
    return out


class CmdlineWatch:
    """Reads every /proc/*/cmdline over and over until stopped; keeps any that holds a token.

    Only this test session's processes count (the control plane, its ssh, sshd's sessions and the
    remote agent all carry the session marker): other suites on the machine may pass tokens on
    purpose."""

    def __init__(self) -> None:
        self.marker = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
        self.seen: list[bytes] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, cmd in cmdlines():
                if TOKEN_RE.search(cmd) and self._ours(str(pid)):
                    self.seen.append(cmd)
            self.scans += 1

    def _ours(self, pid: str) -> bool:
        try:
            return self.marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.timeout(900)  # a real training run on a machine other suites share
def test_acceptance_add_run_and_kill_ssh_mid_run(server: ServerProc, sshd: Sshd):
    """Add user@localhost on sshd's port: online within seconds, a targeted graph succeeds, and
    killing its ssh mid-run changes neither the remote agent nor the run's outcome."""
    with CmdlineWatch() as watch:
        added = server.call("POST", "/api/workers/ssh", {"target": "root@localhost", "port": sshd.port},
                            expect=201)
        assert added["name"] == "localhost"
        first = wait_tunnel(server, "localhost", "connected")
    assert watch.scans > 0
    assert watch.seen == [], f"a token appeared on a command line: {watch.seen[:2]}"
    pid = first["remote_pid"]
    assert isinstance(pid, int) and pid in sshd.agent_pids()
    assert any("started pid=" in line for line in first["recent_output"])
    workers = {w["name"]: w for w in server.call("GET", "/api/workers")["workers"]}
    assert workers["localhost"]["online"] is True and workers["localhost"]["ssh"]["tunnel"]["state"] == "connected"
    assert workers["localhost"]["unencrypted"] is False

    run = server.submit(long_training_graph(epochs=120), {"target": {"worker": "localhost"}})
    wait_event(server, run["id"], lambda e: e["kind"] == "metric", what="a first metric")
    # Held mid-run (SIGSTOP) while the ssh is killed, so "mid-run" does not depend on how fast it trains.
    # The run's own process (its zygote's command line is the same: cdui/run/spare.py).
    runproc = [next(int(e["data"]["pid"]) for e in server.events(run["id"])
                    if e["kind"] == "status" and e["data"].get("status") == "running")]
    assert runproc[0] in children_running(pid, b"cdui.run.runproc")
    os.kill(runproc[0], signal.SIGSTOP)
    assert server.run(run["id"])["status"] == "running"
    slot_dir = f"{added['slot']}"
    pids = tunnel_ssh_pids(f".codefyui-ssh/{added['control'].split('cp-')[1].split('.')[0]}-{slot_dir}")
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)

    again = wait_tunnel(server, "localhost", "connected", timeout=180, after=first["attempts"], remote_pid=pid)
    assert any(f"attached pid={pid}" in line for line in again["recent_output"]), again["recent_output"]
    assert sshd.agent_pids() == [pid]
    os.kill(runproc[0], signal.SIGCONT)
    done = wait_run(server, run["id"], timeout=600)
    assert done["status"] == "succeeded", done
    kinds = [e["data"].get("kind") for e in server.events(run["id"]) if e["kind"] == "run_warning"]
    assert "worker_disconnected" in kinds and "worker_reconnected" in kinds


def test_forwarding_refused_fails_without_retry(tmp_path: Path, sshd: Sshd):
    sshd.restart("AllowStreamLocalForwarding no")
    srv = ServerProc(tmp_path, extra_env=sshd.env()).start()
    try:
        srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "nofwd"}, expect=201)
        t = wait_tunnel(srv, "nofwd", "failed", timeout=180, retrying=False)
        assert t["attempts"] == 3
        assert "forwarding" in t["reason"] and "AllowStreamLocalForwarding" in t["reason"]
        assert sshd.agent_pids() == []
    finally:
        srv.stop()


def test_wrong_host_key_fails(server: ServerProc, sshd: Sshd):
    other = sshd.tmp / "otherkey"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")  # noqa: S605 - a fixed command in the test's folder
    sshd.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {other.with_suffix('.pub').read_text().split(' ')[0]} "
                                f"{other.with_suffix('.pub').read_text().split(' ')[1]}\n")
    server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "badkey"}, expect=201)
    t = wait_tunnel(server, "badkey", "failed", retrying=False)
    assert t["attempts"] == 1
    assert t["reason"].startswith("host key verification failed")
    assert any("Host key verification failed" in line or "HOST IDENTIFICATION" in line for line in t["recent_output"])


def test_missing_remote_cdui_fails_127(server: ServerProc, sshd: Sshd):
    server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "nocdui", "remote_cdui": "~/nowhere/cdui"},
                expect=201)
    t = wait_tunnel(server, "nocdui", "failed", retrying=False)
    assert t["attempts"] == 1
    assert "cannot run cdui (not found, exit 127)" in t["reason"]


def test_disable_with_a_running_run_then_enable(server: ServerProc, sshd: Sshd):
    server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "gpu1"}, expect=201)
    first = wait_tunnel(server, "gpu1", "connected")
    run = server.submit(long_training_graph(), {"target": {"worker": "gpu1"}})
    wait_event(server, run["id"], lambda e: e["kind"] == "metric", what="a first metric")
    assert server.call("POST", "/api/workers/gpu1/disable") == {"name": "gpu1", "disabled": True}
    done = server.run(run["id"])
    assert done["status"] == "cancelled", done  # the agent stopped it within its 10 s grace
    view = ssh_view(server, "gpu1")
    assert view["enabled"] is False and view["tunnel"]["state"] == "stopped"
    assert first["remote_pid"] not in sshd.agent_pids()
    w = {x["name"]: x for x in server.call("GET", "/api/workers")["workers"]}["gpu1"]
    assert w["status"] == "disabled" and w["online"] is False

    server.call("POST", "/api/workers/gpu1/enable")
    again = wait_tunnel(server, "gpu1", "connected")
    assert again["remote_pid"] != first["remote_pid"]
    # The stored credential is reused: no second enrollment of the name.
    assert not any("enrolled as worker" in line for line in again["recent_output"]), again["recent_output"]


def test_delete_cleans_the_remote_folder_and_credential(server: ServerProc, sshd: Sshd):
    added = server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "gone"}, expect=201)
    wait_tunnel(server, "gone", "connected")
    folder = sshd.home / added["remote_dir"].removeprefix("~/")
    cred = credential_file(sshd, added)
    assert folder.is_dir() and cred.is_file()
    assert server.call("DELETE", "/api/workers/gone") == {"removed": "gone", "cleanup": "started"}
    wait_for(lambda: not folder.exists() and not cred.exists(), 120, 0.1, "the remote cleanup",
             detail=lambda: (list(folder.iterdir()) if folder.exists() else "gone", cred.exists()))
    assert sshd.agent_pids() == []
    # The slot is free again once the cleanup has ended.
    wait_for(lambda: server.call("GET", "/api/workers/ssh")["cleaning_slots"] == [], 120, 0.1, "the cleanup's end")
    names = [w["name"] for w in server.call("GET", "/api/workers")["workers"]]
    assert "gone" not in names
    # The same name can be added again.
    server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "gone"}, expect=201)
    assert json.dumps(ssh_view(server, "gone")["slot"]) == str(added["slot"])


def test_shutdown_stops_ssh_agents_and_a_restart_reconnects(server: ServerProc, sshd: Sshd):
    added = server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "gpu2"}, expect=201)
    first = wait_tunnel(server, "gpu2", "connected")
    run = server.submit(long_training_graph(), {"target": {"worker": "gpu2"}})
    wait_event(server, run["id"], lambda e: e["kind"] == "metric", what="a first metric")
    assert server.stop() == 0
    assert tunnel_ssh_pids(this_planes(added)) == []
    wait_for(lambda: first["remote_pid"] not in sshd.agent_pids(), 60, 0.1, "the remote agent to exit")
    server.start()
    assert server.run(run["id"])["status"] == "cancelled"  # stopped by the agent, reported before the end
    again = wait_tunnel(server, "gpu2", "connected")
    assert again["remote_pid"] != first["remote_pid"]


def credential_file(sshd: Sshd, added: dict[str, Any]) -> Path:
    """Where the remote agent stores this SSH worker's credential (keyed by its never-resolving URL)."""
    host_port = added["control"].removeprefix("http://").replace(":", "-")
    return sshd.home / "ud" / "agent" / f"{host_port}.token"


def test_a_refused_stored_credential_is_forgotten_and_enrolled_again(server: ServerProc, sshd: Sshd):
    added = server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "stale"}, expect=201)
    wait_tunnel(server, "stale", "connected")
    server.call("POST", "/api/workers/stale/disable")
    cred = credential_file(sshd, added)
    data = json.loads(cred.read_text())
    cred.write_text(json.dumps({**data, "credential": "cdw_" + "x" * 43}))  # one this control plane never issued
    server.call("POST", "/api/workers/stale/enable")
    t = wait_tunnel(server, "stale", "connected", timeout=180)
    assert t["attempts"] == 2, t  # the refused start, then the one that enrolled again
    assert any("forgot http://cp-" in line for line in t["recent_output"]), t["recent_output"]
    assert any("enrolled as worker stale" in line for line in t["recent_output"]), t["recent_output"]
    assert json.loads(cred.read_text())["credential"] != "cdw_" + "x" * 43


def test_a_control_plane_updated_first_fails_once_and_keeps_the_credential(tmp_path: Path, server: ServerProc,
                                                                           sshd: Sshd):
    """The control plane is updated (here: restarted as another version) while its SSH worker is not.
    The remote agent, refused for its version, is not made to forget its credential and relaunched
    with new tokens for ever: the tunnel shows the mismatch on its first attempt, keeps the
    credential and waits (no ssh runs, none is scheduled) for Retry or the next restart."""
    from cdui import __version__
    added = server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "skew"}, expect=201)
    wait_tunnel(server, "skew", "connected")
    cred = credential_file(sshd, added)
    kept = cred.read_text()
    newer = tmp_path / "newer"  # the "update": this control plane now says it is another version
    newer.mkdir()
    (newer / "sitecustomize.py").write_text(f"import cdui\ncdui.__version__ = {__version__ + '.post1'!r}\n")
    server.stop()
    server.start({"PYTHONPATH": str(newer)})
    assert server.call("GET", "/api/health")["version"] == __version__ + ".post1"
    t = wait_tunnel(server, "skew", "failed")
    assert t["reason"].startswith(f"version mismatch (worker {__version__}, server {__version__}.post1)"), t
    assert (t["attempts"], t["retrying"], t["next_attempt_s"]) == (1, False, None), t
    # No ssh of this worker left running (other tests' tunnels on the machine have other folders).
    assert tunnel_ssh_pids(added["remote_dir"].removeprefix("~/")) == []  # .codefyui-ssh/<this plane's id>-<slot>
    assert not any("forgot http://cp-" in line for line in t["recent_output"]), t["recent_output"]
    assert cred.read_text() == kept  # the credential that connected before: the next start needs no token


def test_the_remote_agent_stops_when_no_tunnel_returns_within_the_grace(tmp_path: Path, sshd: Sshd):
    srv = ServerProc(tmp_path, extra_env={**sshd.env(), "CODEFYUI_WORKER_RESUME_GRACE_S": "5"}).start()
    try:
        added = srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "lone"}, expect=201)
        pid = wait_tunnel(srv, "lone", "connected")["remote_pid"]
        sshd.stop()  # no new connection can come; the live session goes with its ssh client below
        iid = added["control"].split("cp-")[1].split(".")[0]
        for p in tunnel_ssh_pids(f".codefyui-ssh/{iid}-{added['slot']}"):
            os.kill(p, signal.SIGKILL)
        wait_for(lambda: pid not in sshd.agent_pids(), 120, 0.1, f"remote agent {pid} to stop without a tunnel")
        log = (sshd.home / added["remote_dir"].removeprefix("~/") / "agent.log").read_text()
        assert "no SSH tunnel for 5 s (the resume grace); stopping" in log
    finally:
        srv.stop()


def slot_ssh_pids(added: dict[str, Any]) -> list[int]:
    iid = added["control"].split("cp-")[1].split(".")[0]
    return tunnel_ssh_pids(f".codefyui-ssh/{iid}-{added['slot']}")


def test_disable_without_a_connection_stops_the_agent_over_a_short_ssh(server: ServerProc, sshd: Sshd):
    added = server.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "cut"}, expect=201)
    first = wait_tunnel(server, "cut", "connected")
    pid = first["remote_pid"]
    # The connection cannot come back (the host now refuses forwarding); its agent waits for one.
    sshd.restart("AllowStreamLocalForwarding no")
    for p in slot_ssh_pids(added):
        os.kill(p, signal.SIGKILL)
    wait_tunnel(server, "cut", "failed", after=first["attempts"])
    assert pid in sshd.agent_pids()
    assert server.call("POST", "/api/workers/cut/disable") == {"name": "cut", "disabled": True}
    # Told through a short ssh of its own, the agent is gone by the time disable answers.
    assert sshd.agent_pids() == []
    assert re.search(rf"ssh worker cut: stop over a short ssh: exit 0: .*agent {pid} stopped", server.log_text())
    assert ssh_view(server, "cut")["tunnel"]["state"] == "stopped"


# An older version's agent as far as the preparation can see it: "agent start" on its command line,
# a TCP connection to the slot's port on the remote loopback while its ssh forward was there.
LEGACY_AGENT = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[-1].rsplit(":", 1)[1])))
while s.recv(1):
    pass
s.close()
while True:
    time.sleep(3600)
"""


def test_a_legacy_agent_is_stopped_only_once_no_connection_is_attached(tmp_path: Path, sshd: Sshd):
    slot = free_port()
    srv = ServerProc(tmp_path, extra_env={**sshd.env(), "CODEFYUI_SSH_REMOTE_PORT_RANGE": f"{slot}-{slot}"}).start()
    # What an older version's `ssh -R <slot>:...` opened on the remote loopback.
    forward = socket.create_server(("127.0.0.1", slot))
    forward.settimeout(60)
    legacy_dir = sshd.home / ".codefyui-ssh" / str(slot)
    legacy_dir.mkdir(mode=0o700, parents=True)
    legacy = Proc([sys.executable, "-c", LEGACY_AGENT, "agent", "start", "--control", f"http://127.0.0.1:{slot}"],
                  dict(os.environ), tmp_path / "legacy.log", name="legacy-agent")
    try:
        legacy.spawn()
        (legacy_dir / "agent.pid").write_text(f"{legacy.pid}\n")
        conn, _ = forward.accept()
        added = srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "new"}, expect=201)
        first = wait_tunnel(srv, "new", "connected")
        assert f"cdui-ssh: legacy agent {legacy.pid} in {legacy_dir} has a connection; left running" \
               in first["recent_output"], first["recent_output"]
        assert legacy.alive
        conn.close()  # its connection ends (its old ssh is gone) ...
        forward.close()
        for p in slot_ssh_pids(added):  # ... and the next preparation stops it
            os.kill(p, signal.SIGKILL)
        again = wait_tunnel(srv, "new", "connected", after=first["attempts"])
        assert f"cdui-ssh: legacy agent {legacy.pid} in {legacy_dir} stopped" in again["recent_output"], \
            again["recent_output"]
        wait_for(lambda: not legacy.alive, 60, 0.1, "the legacy agent to exit")
        assert legacy.returncode == -signal.SIGTERM
        assert again["remote_pid"] == first["remote_pid"]  # the current agent is not touched
    finally:
        forward.close()
        legacy.stop(10)
        srv.stop()


def sshd_sessions(sshd: Sshd) -> list[int]:
    """The sshd processes serving the open connections (descendants of the listening sshd)."""
    assert sshd.proc is not None and sshd.proc.pid is not None
    return [p for p in children_running(sshd.proc.pid, b"") if Path(f"/proc/{p}/cmdline").read_bytes()
            .startswith(b"sshd:")]


@pytest.mark.timeout(600)
def test_shutdown_gives_ssh_workers_25_s_when_a_host_does_not_answer(tmp_path: Path, sshd: Sshd):
    """A long shutdown grace would let a silent host hold the stop for 125 s; the SSH workers get
    25 s in all, alongside the server's own runs, which still get their grace."""
    # A user's ssh config may wait long for a silent host (ServerAliveCountMax): 25 min here, so only
    # the control plane's own cap can end the wait.
    sshd.config_file.write_text(sshd.config_file.read_text().replace("Host sshtest\n",
                                                                     "Host sshtest\n  ServerAliveCountMax 100\n"))
    srv = ServerProc(tmp_path, extra_env={**sshd.env(), "CODEFYUI_SHUTDOWN_GRACE_S": "120"}).start()
    frozen: list[int] = []
    try:
        added = srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "silent"}, expect=201)
        wait_tunnel(srv, "silent", "connected")
        remote = srv.submit(long_training_graph(), {"target": {"worker": "silent"}})
        local = srv.submit(long_training_graph(), {"target": "local"})
        for run in (remote, local):
            wait_event(srv, run["id"], lambda e: e["kind"] == "metric", what="a first metric")
        # The host stops answering: the sshd side of the connection is frozen, the ssh stays up.
        frozen = sshd_sessions(sshd)
        assert frozen
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        # A generous wait, yet well short of the 125 s the grace alone would hold the stop.
        assert srv.stop(timeout=100) == 0, srv.log_tail(40)
        assert tunnel_ssh_pids(this_planes(added)) == []
        with sqlite3.connect(srv.db_path) as db:
            ended = {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, status, error FROM runs")}
        assert ended[local["id"]][0] == "cancelled", ended
        assert ended[remote["id"]] == ("interrupted", "the server stopped and SSH worker silent did not report "
                                                      "the run within 25 s"), ended
        log = srv.log_text()
        assert "ssh worker silent: runs not reported within 25 s of the shutdown's stop notice" in log
    finally:
        for p in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        srv.stop()


def test_a_cleanup_the_host_did_not_answer_resumes_after_a_restart(tmp_path: Path, sshd: Sshd):
    """The host stops answering new connections while a delete's cleanup waits on it, and the control
    plane restarts: the slot stays reserved across the restart (a new worker gets the other one), and
    the cleanup resumed at start removes the folder and the credential once the host answers."""
    srv = ServerProc(tmp_path, extra_env={**sshd.env(), "CODEFYUI_SSH_REMOTE_PORT_RANGE": "18000-18001"}).start()
    assert sshd.proc is not None and sshd.proc.pid is not None
    listener = sshd.proc.pid
    frozen = False
    try:
        added = srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "gone"}, expect=201)
        pid = wait_tunnel(srv, "gone", "connected")["remote_pid"]
        folder = sshd.home / added["remote_dir"].removeprefix("~/")
        cred = sshd.home / "ud" / "agent" / f"cp-{added['control'].split('cp-')[1].split(':')[0]}-18000.token"
        assert added["slot"] == 18000 and folder.is_dir() and cred.is_file()
        # The listening sshd is held: the live session still carries the stop, but a new ssh (the
        # cleanup's) waits for the host's greeting.
        os.kill(listener, signal.SIGSTOP)
        frozen = True
        assert srv.call("DELETE", "/api/workers/gone") == {"removed": "gone", "cleanup": "started"}
        assert pid not in sshd.agent_pids()  # stopped through its connection before the delete answered
        assert srv.call("GET", "/api/workers/ssh")["cleaning_slots"] == [18000]
        assert srv.stop() == 0
        srv.start()
        listed = srv.call("GET", "/api/workers/ssh")
        assert (listed["ssh_workers"], listed["cleaning_slots"]) == ([], [18000])
        assert folder.is_dir() and cred.is_file()
        other = srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "other"}, expect=201)
        assert other["slot"] == 18001
        os.kill(listener, signal.SIGCONT)
        frozen = False
        wait_for(lambda: not folder.exists() and not cred.exists(), 120, 0.1, "the resumed remote cleanup",
                 detail=lambda: (list(folder.iterdir()) if folder.exists() else "gone", cred.exists(),
                                 srv.log_tail(20)))
        wait_for(lambda: srv.call("GET", "/api/workers/ssh")["cleaning_slots"] == [], 120, 0.1, "the cleanup's end")
        log = srv.log_text()
        assert "ssh worker gone: resuming the remote cleanup of slot 18000 on sshtest" in log
        assert f"ssh worker gone: remote cleanup done: cdui-ssh: no agent running | cdui-ssh: cleaned {folder}" \
               in log, srv.log_tail(30)
        third = srv.call("POST", "/api/workers/ssh", {"target": "sshtest", "name": "third"}, expect=201)
        assert third["slot"] == 18000
    finally:
        if frozen:
            os.kill(listener, signal.SIGCONT)
        srv.stop()

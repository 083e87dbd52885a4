"""Remote workers end to end: real control plane, real agent processes, real runs.

Requirement ids: ENR (enrollment), CONN (connection), DISC (disconnects,
resume, adoption), ROUTE (targets, drain), SVC (agent stop semantics),
TRUST-secrets (no secret on the worker's disk).

Disconnects within and past the grace, missed heartbeats, adoption after a restart, a stop
pressed while the worker is offline and a graceful stop are pinned in process
(tests/inproc/test_inproc_workers.py, the real control plane and the worker protocol), and
for real processes by the fault suite (tests/faults/test_fault_injection.py: cut, stall,
control plane killed or stopped, 50 seeded iterations); this file keeps what needs the real
agent process (enrollment and its refusals, exit codes, signals, the CLI, a long replay).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from procs import REPO_ROOT, Proc, ServerProc, env_for, install_ticker, spool_dir, ticker_graph, wait_for, wait_run
from tcpproxy import TcpProxy

# Every test here drives real cdui processes (server, agents, run subprocesses): the e2e tier.
pytestmark = pytest.mark.e2e

class Agent(Proc):
    def __init__(self, tmp: Path, control: str, name: str = "w1", token: str | None = None,
                 extra: list[str] | None = None, env_extra: dict[str, str] | None = None,
                 user_data: Path | None = None) -> None:
        self.user_data = user_data or tmp / f"agent-{name}"
        self.data_dir = tmp / f"agent-{name}-data"
        install_ticker(self.data_dir)
        cmd = [sys.executable, "-m", "cdui", "agent", "start", "--control", control, "--name", name,
               "--devices", "cpu", "--foreground"]
        if token:
            cmd += ["--token", token]
        cmd += extra or []
        super().__init__(cmd, env_for(self.user_data, self.data_dir, env_extra), tmp / f"agent-{name}.log",
                         name=f"agent-{name}")


def make_server(tmp: Path, **env: str) -> ServerProc:
    s = ServerProc(tmp, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1", **env})
    install_ticker(s.data_dir)
    return s.start()


def token(server: ServerProc, **body: Any) -> str:
    return server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1, **body}, expect=201)["token"]


def worker(server: ServerProc, name: str) -> dict[str, Any] | None:
    for w in server.call("GET", "/api/workers", expect=200)["workers"]:
        if w["name"] == name:
            return w
    return None


def wait_online(server: ServerProc, name: str = "w1", agent: Proc | None = None) -> dict[str, Any]:
    def check():
        if agent is not None and not agent.alive:
            raise AssertionError(f"agent exited with {agent.returncode}:\n{agent.log_tail(30)}")
        w = worker(server, name)
        return w if w and w["online"] else None
    return wait_for(check, 120, 0.2, f"worker {name} online")


@contextlib.contextmanager
def proxied_worker(tmp_path: Path, **env: str):
    """A control plane, a loopback proxy the test controls, and worker w1 connected through it;
    all three are stopped afterwards, whatever the test did to them."""
    cp = make_server(tmp_path, **env)
    proxy = TcpProxy(cp.port)
    a = Agent(tmp_path, proxy.url, token=token(cp))
    a.spawn()
    try:
        wait_online(cp, agent=a)
        yield cp, proxy, a
    finally:
        a.stop()
        proxy.close()
        cp.stop()


def progress_ticks(server: ServerProc, run_id: str) -> list[int]:
    return [e["data"]["tick"] for e in server.events(run_id) if e["kind"] == "progress"]


def spooled_progress(agent: Agent, run_id: str) -> int:
    """Progress events the worker has written to its spool for the run (the
    spool keeps them all until the run ends and everything is acknowledged)."""
    try:
        lines = (spool_dir(agent.user_data, run_id) / "events.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    n = 0
    for line in lines:
        try:
            n += json.loads(line).get("kind") == "progress"
        except ValueError:
            continue  # the line being appended right now
    return n


def wait_spooled_beyond(agent: Agent, server: ServerProc, run_id: str, more: int, what: str) -> None:
    """Wait until the worker has ``more`` progress events that ``server`` has not stored."""
    stored = len(progress_ticks(server, run_id))
    wait_for(lambda: spooled_progress(agent, run_id) >= stored + more, 120, 0.05, what,
             detail=lambda: f"{spooled_progress(agent, run_id)} spooled, {stored} stored")


def assert_complete_log(server: ServerProc, run_id: str, ticks: int) -> list[dict[str, Any]]:
    evs = server.events(run_id)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "event seq must be gapless from 1"
    assert progress_ticks(server, run_id) == list(range(1, ticks + 1)), "every tick exactly once, in order"
    starts = [e for e in evs if e["kind"] == "node_status" and e["data"].get("status") == "running"]
    assert [e["data"]["node_id"] for e in starts] == ["start", "tick", "print"], "each node started exactly once"
    return evs


@pytest.fixture
def cp(tmp_path):
    s = make_server(tmp_path)
    yield s
    s.stop()


def test_enroll_and_run_on_worker(cp, tmp_path):
    """Enroll with a token, run on w1, same events as a local run."""
    a = Agent(tmp_path, cp.url, token=token(cp))
    a.spawn()
    try:
        w = wait_online(cp, agent=a)
        assert w["version"] and w["devices"][0]["device"] == "cpu"
        cred = a.user_data / "agent" / f"127.0.0.1-{cp.port}.token"
        assert cred.exists() and (cred.stat().st_mode & 0o777) == 0o600, "credential file readable by owner only"
        run = cp.submit(ticker_graph(5), {"target": {"worker": "w1"}})
        done = wait_run(cp, run["id"])
        assert done["status"] == "succeeded", done
        assert done["worker_id"] == "w1"
        assert_complete_log(cp, run["id"], 5)
        local = cp.submit(ticker_graph(5), {"target": "local"})
        assert wait_run(cp, local["id"])["status"] == "succeeded"
        kinds = lambda rid: [(e["kind"], e["data"].get("status")) for e in cp.events(rid)  # noqa: E731
                             if e["kind"] in ("status", "node_status", "progress")]
        assert kinds(run["id"]) == kinds(local["id"]), "a worker run reports the same events as a local run"
    finally:
        a.stop()


def test_token_refusals_name_taken_and_reissue(cp, tmp_path):
    """Token refusals (used up, expired, revoked, named), a second enrollment of a name (409), reissue, exit 2."""
    t = token(cp)
    first = Agent(tmp_path, cp.url, "w1", token=t)
    first.spawn()
    wait_online(cp, "w1", first)

    def refused(name: str, tok: str, needle: str) -> None:
        a = Agent(tmp_path, cp.url, name, token=tok)
        a.spawn()
        wait_for(lambda: not a.alive, 60, 0.1, f"agent {name} to give up")
        assert a.returncode == 4, a.log_tail()
        assert needle in a.log_text(), a.log_tail()

    refused("w2", t, "used up")
    short = cp.call("POST", "/api/workers/tokens", {"ttl_s": 0.5, "uses": 1}, expect=201)
    wait_for(lambda: [t for t in cp.call("GET", "/api/workers/tokens", expect=200)
                      if t["id"] == short["id"] and t["expired"]], 30, 0.1, "the short token to be listed as expired")
    refused("w3", short["token"], "expired")
    revoked = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)
    cp.call("DELETE", f"/api/workers/tokens/{revoked['id']}", expect=200)
    refused("w4", revoked["token"], "revoked")
    # A token unknown here may be another server's behind the same address: retried with advice.
    unknown = Agent(tmp_path, cp.url, "w5", token="abcdef.0123456789abcdef")
    unknown.spawn()
    try:
        wait_for(lambda: "is not known to this control plane" in unknown.log_text() or not unknown.alive, 60, 0.1,
                 "agent w5's enrollment to be refused as unknown")
        assert unknown.alive, unknown.log_tail()
        assert "a token works only at the control plane (and database) that issued it" in unknown.log_text()
    finally:
        unknown.stop()
    # A taken name: 409 from the API (exit 2 from the agent).
    status, body = cp.api("POST", "/api/workers/enroll", {"token": token(cp), "name": "w1", "devices": ["cpu"]},
                          token=False)
    assert status == 409 and "already enrolled" in body["error"]["message"], body
    # Reissue: the bound token enrolls only w1 and supersedes the running agent's credential.
    re_tok = cp.call("POST", "/api/workers/w1/reissue", {}, expect=201)
    assert "--name w1" in re_tok["command"]
    status, body = cp.api("POST", "/api/workers/enroll", {"token": re_tok["token"], "name": "other",
                                                          "devices": ["cpu"]}, token=False)
    assert status == 403 and "only enroll worker 'w1'" in body["error"]["message"], body
    first.stop()
    second = Agent(tmp_path, cp.url, "w1", token=re_tok["token"], user_data=tmp_path / "agent-w1-new")
    second.spawn()
    try:
        wait_online(cp, "w1", second)
        # The old agent, restarted with its old credential, is told it was superseded and exits 2.
        first.spawn()
        wait_for(lambda: not first.alive, 60, 0.1, "the superseded agent to exit")
        assert first.returncode == 2, first.log_tail()
        assert "superseded" in first.log_text()
        rejected = cp.call("GET", "/api/workers", expect=200)["rejected"]
        assert any(r["name"] == "w1" and "superseded" in r["reason"] for r in rejected), rejected
    finally:
        second.stop()


def test_version_mismatch_exits_2(cp, tmp_path):
    """`version mismatch: worker A, control plane B`, exit 2 without retrying."""
    fake = tmp_path / "old-install"
    shutil.copytree(REPO_ROOT / "cdui", fake / "cdui", ignore=shutil.ignore_patterns("__pycache__"))
    init = fake / "cdui" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.0-old'))
    real = cp.call("GET", "/api/health", expect=200)["version"]
    a = Agent(tmp_path, cp.url, "old", token=token(cp))
    a.cwd = str(fake)
    a.env["PYTHONPATH"] = str(fake)
    a.spawn()
    wait_for(lambda: not a.alive, 90, 0.1, "the old agent to exit")
    log = a.log_text()
    assert a.returncode == 2, log[-2000:]
    assert f"version mismatch: worker 0.0.0-old{real}, control plane {real}" in log, log[-2000:]
    # An enrolled worker updated to another version is refused on /ws/worker (its first field).
    good = Agent(tmp_path, cp.url, "w9", token=token(cp))
    good.spawn()
    wait_online(cp, "w9", good)
    good.stop()
    old = Agent(tmp_path, cp.url, "w9", user_data=good.user_data)
    old.cwd, old.env["PYTHONPATH"] = str(fake), str(fake)
    old.spawn()
    wait_for(lambda: not old.alive, 90, 0.1, "the outdated agent to exit")
    assert old.returncode == 2, old.log_tail()
    # One line says it (under systemd each restart, every 5 s, adds just this line to the journal).
    assert old.log_text().count("version mismatch") == 1, old.log_tail()
    assert (f"cdui: error: refused by the control plane: version mismatch: worker 0.0.0-old{real}, "
            f"control plane {real}") in old.log_text()
    rejected = cp.call("GET", "/api/workers", expect=200)["rejected"]
    assert any(r["name"] == "w9" and "version mismatch" in r["reason"] for r in rejected), rejected


def test_drain_remove_revokes(cp, tmp_path):
    """Drain, and remove (revoke, interrupted, queued fail, agent exit 2)."""
    a = Agent(tmp_path, cp.url, token=token(cp))
    a.spawn()
    wait_online(cp, agent=a)
    cp.call("POST", "/api/workers/w1/drain", expect=200)
    assert worker(cp, "w1")["status"] == "draining"
    queued = cp.submit(ticker_graph(2), {"target": {"worker": "w1"}})
    draining = "waiting: worker w1 is draining (no new runs)"
    wait_for(lambda: cp.run(queued["id"])["queue_reason"] == draining, 30, 0.2, f"the queue_reason {draining!r}",
             detail=lambda: cp.run(queued["id"]))
    cp.call("POST", "/api/workers/w1/undrain", expect=200)
    assert wait_run(cp, queued["id"])["status"] == "succeeded"
    running = cp.submit(ticker_graph(10000, 0.05), {"target": {"worker": "w1"}})
    wait_for(lambda: progress_ticks(cp, running["id"]), 60, 0.2, "the long run to tick")
    waiting = cp.submit(ticker_graph(2), {"target": {"worker": "w1"}})
    cp.call("DELETE", "/api/workers/w1", expect=200)
    assert wait_run(cp, running["id"])["status"] == "interrupted"
    assert wait_run(cp, waiting["id"])["status"] == "failed"
    wait_for(lambda: not a.alive, 60, 0.1, "the removed agent to exit")
    assert a.returncode == 2, a.log_tail()
    assert "removed" in a.log_text()
    assert worker(cp, "w1") is None
    status, body = cp.api("POST", "/api/runs", {"graph": ticker_graph(1), "options": {"target": {"worker": "w1"}}})
    assert status == 400 and "no worker named 'w1'" in body["error"]["message"]


def test_agent_sigterm_cancels_runs_and_keeps_no_secret(cp, tmp_path):
    """SIGTERM to the agent (docs/remote-workers.md#running-the-agent-under-systemd) → the agent stops
    its run (cancelled); secrets never on the worker's disk."""
    secret = "s3cr3t-" + os.urandom(6).hex()
    a = Agent(tmp_path, cp.url, token=token(cp))
    a.spawn()
    wait_online(cp, agent=a)
    run = cp.submit(ticker_graph(100000, 0.05, token=secret), {"target": {"worker": "w1"}})
    wait_for(lambda: progress_ticks(cp, run["id"]), 60, 0.1, "ticks")
    a.proc.send_signal(signal.SIGTERM)
    assert wait_run(cp, run["id"])["status"] == "cancelled"
    wait_for(lambda: not a.alive, 60, 0.1, "the agent to exit")
    assert a.returncode == 0, a.log_tail()
    for root in (a.user_data, a.data_dir):
        for p in root.rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), f"secret found in {p}"
    assert secret not in a.log_text()


def test_same_machine_agent_has_data_label(cp, tmp_path):
    """Agent on the control plane's machine: recognised by the files it reads and writes (its machine id only
    gets it asked); CODEFYUI_MACHINE_ID makes it another."""
    a = Agent(tmp_path, cp.url, token=token(cp))
    a.spawn()
    b = Agent(tmp_path, cp.url, "w2", token=token(cp), env_extra={"CODEFYUI_MACHINE_ID": "another-machine"})
    b.spawn()
    try:
        assert wait_online(cp, "w1", a)["labels"].get("data") == str(cp.data_dir)
        assert "data" not in wait_online(cp, "w2", b)["labels"]
    finally:
        a.stop()
        b.stop()


NOBODY = 65534


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run an agent as another OS user")
def test_agent_of_another_os_user_on_this_machine_is_another_machine(tmp_path):
    """An agent on the control plane's host, under an OS user that can read its data folder but not write
    it: its machine id is the control plane's, yet it is another machine (no data mount, so its runs move
    their files through the control plane instead of failing with PermissionError at their end; the
    assignment's paths are checked in tests/inproc/test_same_machine.py). Run processes cannot be started
    as that user here (the test interpreter lies under /root), so no run is sent."""
    import tempfile
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                            "-c", "import cdui"], capture_output=True, text=True, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"OS user {NOBODY} cannot run this checkout's interpreter ({sys.executable}): "
                    f"{probe.stderr.strip()[-200:]}; put the checkout where other users can read it "
                    f"(every folder above it at least mode 0755), e.g. not under a `mktemp -d` folder")
    shared = Path(tempfile.mkdtemp(prefix="cdui-other-user-"))  # outside pytest's 0700 folders
    try:
        os.chmod(shared, 0o755)
        s = ServerProc(tmp_path, name="shared", data_dir=shared / "data",
                       extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"}).start()
        ud, home = shared / "agent-ud", shared / "home"
        for d in (ud, home):
            d.mkdir()
            os.chown(d, NOBODY, NOBODY)
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-m", "cdui",
               "agent", "start", "--control", s.url, "--name", "other", "--devices", "cpu", "--foreground",
               "--token", token(s)]
        a = Proc(cmd, env_for(ud, home / "data", {"HOME": str(home)}), tmp_path / "agent-other.log",
                 name="agent-other")
        a.spawn()
        try:
            w = wait_online(s, "other", a)
            assert (w["same_machine"], w["labels"]) == (False, {}), w
            assert w["same_machine_note"] == (f"it runs on this machine but cannot write {s.data_dir / 'models'} "
                                              f"(PermissionError: Permission denied), so its runs move their files "
                                              f"through the control plane"), w
        finally:
            a.stop()
            s.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_garbage_on_worker_socket_is_refused_cleanly(cp, tmp_path):
    """Malformed messages get an error, the server keeps serving."""
    import asyncio

    import aiohttp

    async def go() -> list[str]:
        async with aiohttp.ClientSession() as s:
            out = []
            async with s.ws_connect(cp.url + "/ws/worker", headers={"Authorization": "Bearer nope"}) as ws:
                await ws.send_str('{"version": "x"}')
                out.append((await ws.receive(timeout=10)).data)
            return out
    msgs = asyncio.run(go())
    assert "unknown_credential" in msgs[0]
    assert cp.call("GET", "/api/health", expect=200)["status"] == "ok"


def test_enrollment_rate_limited_per_address(tmp_path):
    """Enrollment attempts are rate limited per source address (429 with a hint)."""
    cp = make_server(tmp_path, CODEFYUI_ENROLL_RATE_PER_MIN="3")
    try:
        codes = [cp.api("POST", "/api/workers/enroll", {"token": "abcdef.0123456789abcdef", "name": f"x{i}",
                                                        "devices": ["cpu"]}, token=False) for i in range(4)]
        assert [c for c, _ in codes[:3]] == [401, 401, 401]
        assert codes[3][0] == 429 and "try again" in codes[3][1]["error"]["hint"]
    finally:
        cp.stop()


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdui", *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.long
def test_acceptance_two_user_data_dirs_with_the_cli(tmp_path):
    """Issue acceptance: cdui start; cdui workers token; cdui agent start (background) --name w1 --devices cpu;
    cdui run graph.json --target w1 --wait succeeds and the run names w1; cdui agent stop; cdui stop."""
    from procs import free_port, track_log
    port = free_port()
    cp_env = env_for(tmp_path / "cp", tmp_path / "cp-data")
    ag_env = env_for(tmp_path / "ag", tmp_path / "ag-data")
    track_log(tmp_path / "cp" / "cdui.log", "control plane")
    track_log(tmp_path / "ag" / "agent.log", "agent")
    r = _cli(["start", "--port", str(port)], cp_env)
    assert r.returncode == 0, r.stderr
    try:
        r = _cli(["workers", "token"], cp_env)
        assert r.returncode == 0, r.stderr
        tok, cmd = r.stdout.splitlines()[0], r.stdout.splitlines()[-1]
        assert f"--token {tok}" in cmd and cmd.startswith("cdui agent start --control http://")
        r = _cli(["agent", "start", "--control", f"http://127.0.0.1:{port}", "--token", tok, "--name", "w1",
                  "--devices", "cpu"], ag_env)
        assert r.returncode == 0 and "connected" in r.stdout, (r.stdout, r.stderr)
        r = _cli(["run", str(REPO_ROOT / "examples" / "iris_train.json"), "--target", "w1", "--wait", "--json"],
                 cp_env)
        assert r.returncode == 0, r.stderr[-3000:]
        run = json.loads(r.stdout)
        assert run["status"] == "succeeded" and run["worker_id"] == "w1", run
        r = _cli(["workers", "list"], cp_env)
        assert r.returncode == 0 and "w1" in r.stdout and "online" in r.stdout, r.stdout
        # A restart of the agent needs no token: the stored credential is used.
        assert _cli(["agent", "stop"], ag_env).returncode == 0
        r = _cli(["agent", "start", "--control", f"http://127.0.0.1:{port}"], ag_env)
        assert r.returncode == 0 and "connected" in r.stdout, (r.stdout, r.stderr)
        assert _cli(["agent", "stop"], ag_env).returncode == 0
        assert _cli(["agent", "forget", f"http://127.0.0.1:{port}"], ag_env).returncode == 0
        r = _cli(["agent", "start", "--control", f"http://127.0.0.1:{port}"], ag_env)
        assert r.returncode == 4 and "no stored credential" in r.stderr, r.stderr
    finally:
        _cli(["agent", "stop"], ag_env)
        _cli(["stop"], cp_env)


def test_second_agent_with_a_connected_name_is_refused_and_listed(cp, tmp_path):
    """An agent trying to use a connected worker's name is refused and listed with its address."""
    a = Agent(tmp_path, cp.url, token=token(cp))
    a.spawn()
    wait_online(cp, agent=a)
    twin_ud = tmp_path / "twin"
    shutil.copytree(a.user_data, twin_ud, ignore=shutil.ignore_patterns("*.pid", "agent-status.json"))
    twin = Agent(tmp_path, cp.url, "w1", user_data=twin_ud)
    twin.log_path = tmp_path / "twin.log"
    twin.spawn()
    try:
        def listed():
            return [r for r in cp.call("GET", "/api/workers", expect=200)["rejected"]
                    if r["name"] == "w1" and "already connected" in r["reason"]]
        rej = wait_for(listed, 60, 0.2, "the twin to be listed under rejected connections")
        assert rej[0]["address"] == "127.0.0.1"
        assert twin.alive, "a name-in-use refusal is retried, not fatal"
        assert worker(cp, "w1")["online"]
    finally:
        twin.stop()
        a.stop()


def test_long_outage_replays_thousands_of_events_in_order(tmp_path):
    """After an outage with many unacknowledged events, the replay (in bounded messages) leaves the
    log complete: every tick once, in order, gapless."""
    with proxied_worker(tmp_path) as (cp, proxy, a):
        ticks = 3000
        run = cp.submit(ticker_graph(ticks, 0.002), {"target": {"worker": "w1"}})
        wait_for(lambda: len(progress_ticks(cp, run["id"])) >= 50, 60, 0.1, "some ticks")
        proxy.cut()
        wait_run(cp, run["id"], {"disconnected"}, 60)
        wait_spooled_beyond(a, cp, run["id"], 1000, "unacknowledged events to pile up in the worker's spool")
        proxy.restore()
        assert wait_run(cp, run["id"], timeout=300)["status"] == "succeeded"
        assert_complete_log(cp, run["id"], ticks)

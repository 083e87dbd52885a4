"""One-shot agents as processes against a real control plane: every exit code, SIGTERM
before and during a run, two instances that share one enrollment token.

Real server, real agent processes, real run subprocesses (torch): the e2e tier. The routing
rules themselves are tested in process (tests/inproc/test_oneshot_routing.py).
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from procs import Proc, ServerProc, csv_print_graph, env_for, long_training_graph, wait_for, wait_run

pytestmark = pytest.mark.e2e


def make_server(tmp: Path, **env: str) -> ServerProc:
    return ServerProc(tmp, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1",
                                      "CODEFYUI_MACHINE_ID": "the-control-plane", **env}).start()


def token(server: ServerProc, uses: int = 1) -> str:
    return server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": uses}, expect=201)["token"]


def one_shot(tmp: Path, control: str, *flags: str, name: str = "w1", tok: str | None = None,
             user_data: Path | None = None, label: str | None = None, env: dict[str, str] | None = None) -> Proc:
    """``cdui agent start --one-shot`` as its own process (another machine: its own machine id)."""
    ud = user_data or tmp / f"agent-{name}"
    cmd = [sys.executable, "-m", "cdui", "agent", "start", "--one-shot", "--control", control, "--name", name,
           "--devices", "cpu", *flags]
    if tok:
        cmd += ["--token", tok]
    extra = {"CODEFYUI_MACHINE_ID": f"machine-{label or name}", **(env or {})}
    p = Proc(cmd, env_for(ud, tmp / f"agent-{name}-data", extra), tmp / f"agent-{label or name}.log",
             name=f"agent-{label or name}")
    p.spawn()
    return p


def exit_code(p: Proc, timeout: float = 240) -> int:
    assert p.proc is not None
    try:
        return p.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{p.name} did not exit within {timeout:.0f} s:\n{p.log_tail(40)}") from None


def pool(server: ServerProc, g: dict[str, Any] | None = None) -> str:
    run = server.submit(g or csv_print_graph(), {"target": {"pool": "one-shot"}, "device": "cpu"})
    return str(run["id"])


def test_bad_flags_exit_2_before_anything(tmp_path):
    for flags in (["--instance"], ["--run-id", "abc"]):
        cmd = [sys.executable, "-m", "cdui", "agent", "start", "--control", "http://127.0.0.1:9", *flags]
        p = subprocess.run(cmd, env=env_for(tmp_path / "ud"), capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert "only for one-shot agents" in p.stderr


def test_exit_codes_0_1_2_3_4(tmp_path):
    cp = make_server(tmp_path)
    try:
        # 4: enrollment failed (a token this control plane never issued).
        bad = one_shot(tmp_path, cp.url, tok="abcdef.0123456789abcdef", name="nobody")
        assert exit_code(bad) == 4
        assert "enrollment failed" in bad.log_text()

        # 0: its run succeeded and was recorded; the worker shows one-shot, offline, with its run.
        ok_run = pool(cp)
        a = one_shot(tmp_path, cp.url, tok=token(cp))
        assert exit_code(a) == 0, a.log_tail(40)
        assert wait_run(cp, ok_run)["status"] == "succeeded"
        w = next(x for x in cp.call("GET", "/api/workers")["workers"] if x["name"] == "w1")
        assert (w["one_shot"], w["online"], w["one_shot_run"]) == (True, False, ok_run)

        # 1: its run failed (the column it asks for is not in the file).
        broken = csv_print_graph()
        next(n for n in broken["nodes"] if n["id"] == "csv")["data"]["params"]["target_column"] = "no_such_column"
        failing = pool(cp, broken)
        b = one_shot(tmp_path, cp.url)
        assert exit_code(b) == 1, b.log_tail(40)
        assert wait_run(cp, failing)["status"] == "failed"

        # 2: its --run-id is not waiting for it.
        c = one_shot(tmp_path, cp.url, "--run-id", ok_run)
        assert exit_code(c) == 2
        assert f"--run-id {ok_run}: this agent cannot take that run" in c.log_text()

        # 3: SIGTERM before any run arrived.
        d = one_shot(tmp_path, cp.url)
        wait_for(lambda: next(x for x in cp.call("GET", "/api/workers")["workers"] if x["name"] == "w1")["online"],
                 120, 0.2, "the one-shot agent online", detail=lambda: d.log_tail(20))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        assert exit_code(d) == 3
    finally:
        cp.stop()


def test_sigterm_during_the_run_interrupts_it_with_a_checkpoint_and_exits_1(tmp_path):
    cp = make_server(tmp_path)
    try:
        run_id = pool(cp, long_training_graph())
        a = one_shot(tmp_path, cp.url, tok=token(cp))

        def training() -> bool:
            return any(e["kind"] == "metric" for e in cp.events(run_id))
        wait_for(training, 180, 0.2, "the run to report its first epoch", detail=lambda: a.log_tail(20))
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        assert exit_code(a) == 1, a.log_tail(40)
        r = wait_run(cp, run_id)
        assert r["status"] == "interrupted", r
        assert "one-shot agent was stopped" in r["error"]
        logs = [e["data"].get("message", "") for e in cp.events(run_id) if e["kind"] == "log"]
        assert any("checkpoints/interrupt.pt" in m for m in logs), logs
    finally:
        cp.stop()


def test_two_instances_enroll_with_one_token_use_and_each_takes_one_run(tmp_path):
    cp = make_server(tmp_path)
    shared = tmp_path / "shared-user-data"
    try:
        runs = [pool(cp), pool(cp)]
        tok = token(cp, uses=1)
        agents = [one_shot(tmp_path, cp.url, "--instance", f"t{i}", tok=tok, user_data=shared, label=f"t{i}",
                           name="arr") for i in range(2)]
        assert [exit_code(a) for a in agents] == [0, 0], [a.log_tail(30) for a in agents]
        done = [wait_run(cp, r) for r in runs]
        assert [r["status"] for r in done] == ["succeeded", "succeeded"]
        assert sorted(r["worker_id"] for r in done) == ["arr.t0", "arr.t1"]
        toks = cp.call("GET", "/api/workers/tokens")
        assert [(t["uses_total"], t["uses_left"]) for t in toks] == [(1, 0)]
        assert not (shared / "agent-instances" / "t0").exists() and not (shared / "agent-instances" / "t1").exists()
        card = next(x for x in cp.call("GET", "/api/workers")["workers"] if x["name"] == "arr")
        assert sorted(d["name"] for d in card["instances"]["departed"]) == ["arr.t0", "arr.t1"]
        assert card["one_shot"] is False  # instances leave the credential's own record alone
    finally:
        cp.stop()


def test_removing_the_credential_revokes_its_instances_and_a_stale_folder_is_swept(tmp_path):
    import os
    cp = make_server(tmp_path)
    shared = tmp_path / "shared-user-data"
    stale = shared / "agent-instances" / "killed-long-ago"
    (stale / "spool").mkdir(parents=True)
    old = os.stat(stale).st_mtime - 25 * 3600
    for p in (stale / "spool", stale):
        os.utime(p, (old, old))
    try:
        a = one_shot(tmp_path, cp.url, "--instance", "a", tok=token(cp), user_data=shared, label="a", name="arr")
        wait_for(lambda: (next((x for x in cp.call("GET", "/api/workers")["workers"] if x["name"] == "arr"), None)
                          or {}).get("instances", {}).get("connected") == 1,
                 120, 0.2, "instance arr.a connected", detail=lambda: a.log_tail(20))
        assert not stale.exists()  # its ID is held by nobody and nothing changed in it for 24 h
        waiting = cp.submit(csv_print_graph(), {"target": {"worker": "arr.b"}, "device": "cpu"})["id"]
        cp.call("DELETE", "/api/workers/arr")
        assert exit_code(a) == 2, a.log_tail(30)  # revoked before a run arrived
        r = wait_run(cp, waiting)
        assert (r["status"], r["error"]) == ("failed", "worker arr was removed before the run started")
        assert not (shared / "agent-instances" / "a").exists()
    finally:
        cp.stop()

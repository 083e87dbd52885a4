"""Run lifecycle on a real server with real run subprocesses: stop (honoured
and ignored), crash isolation, the queue, delete, and what a server restart
or a graceful server stop does to runs."""
from __future__ import annotations

import hashlib
import json
import sqlite3
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdui.plane.store.event_chunks import event_rows
from procs import (
    ServerProc,
    csv_print_graph,
    long_training_graph,
    pid_alive,
    start_then,
    wait_event,
    wait_for,
    wait_run,
)

# Every test here starts real cdui processes (servers, agents or run subprocesses) and checks what
# they do on the machine: the e2e tier.
pytestmark = pytest.mark.e2e

CUSTOM_NODES = textwrap.dedent('''
    """Nodes that misbehave on purpose, for cdui's own tests."""
    import os
    import signal
    import time

    from cdui.nodes.base import Node, Param


    class IgnoreStopNode(Node):
        NODE_NAME = "TestIgnoreStop"

        @classmethod
        def define_params(cls):
            return [Param("rounds", "int", 1000)]

        def execute(self, inputs, params, ctx):
            ctx.log("sleeping, and ignoring stop requests")
            for _ in range(int(params["rounds"])):
                time.sleep(0.5)  # never looks at ctx.should_stop()
            return {}


    class ExitNode(Node):
        NODE_NAME = "TestExit"

        @classmethod
        def define_params(cls):
            return [Param("code", "int", 3)]

        def execute(self, inputs, params, ctx):
            ctx.log("about to exit the run process")
            os._exit(int(params["code"]))


    class SelfKillNode(Node):
        NODE_NAME = "TestSelfKill"

        def execute(self, inputs, params, ctx):
            ctx.log("about to SIGKILL the run process")
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
            return {}
''')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("runs"), name="runs-server")
    (s.data_dir / "custom_nodes").mkdir(parents=True)
    (s.data_dir / "custom_nodes" / "misbehaving.py").write_text(CUSTOM_NODES)
    try:
        s.start()
        cat = s.call("GET", "/api/nodes")
        assert cat["load_errors"] == [], cat["load_errors"]
        types = {n["type"] for n in cat["nodes"]}
        assert {"TestIgnoreStop", "TestExit", "TestSelfKill"} <= types
        yield s
    finally:
        s.stop()


BUSY_CPU = "waiting: all slots of local cpu are in use"


def run_pid(server: ServerProc, run_id: str) -> int:
    for e in server.events(run_id):
        if e["kind"] == "status" and e["data"].get("status") == "running" and e["data"].get("pid"):
            return int(e["data"]["pid"])
    raise AssertionError(f"run {run_id} has no running status event with a pid")


def statuses(server: ServerProc, run_id: str) -> list[str]:
    return [e["data"]["status"] for e in server.events(run_id) if e["kind"] == "status"]


def assert_gapless(server: ServerProc, run_id: str) -> list[dict[str, Any]]:
    evs = server.events(run_id)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    return evs


def first_epoch(server: ServerProc, run_id: str) -> dict[str, Any]:
    return wait_event(server, run_id, lambda e: e["kind"] == "progress" and e["data"].get("event") == "epoch",
                      what="a training epoch")


# -- stop ----------------------------------------------------------------------------------------
def test_stop_training_ends_cancelled_with_checkpoint(server: ServerProc) -> None:
    """With one CPU slot a second run waits with a
    queue_reason; stopping it while queued cancels it before it starts;
    stopping the training run ends it `cancelled` with an interrupt checkpoint
    artifact whose size and sha256 match the file; its process is gone; a
    terminal run can be deleted."""
    a = server.submit(long_training_graph())
    first_epoch(server, a["id"])
    b = server.submit(long_training_graph())
    # A new run's queue_reason is "waiting for the scheduler" from the start: wait
    # for the reason the scheduler gives once it has looked at this run.
    queued = wait_for(lambda: (lambda r: r if r["queue_reason"] == BUSY_CPU else None)(server.run(b["id"])),
                      60, 0.2, f"the second run to wait with {BUSY_CPU!r}", detail=lambda: server.run(b["id"]))
    assert queued["status"] == "queued"

    stopped_b = server.call("POST", f"/api/runs/{b['id']}/stop")
    assert stopped_b["status"] == "cancelled", stopped_b
    assert "before it started" in stopped_b["error"]
    assert statuses(server, b["id"]) == ["queued", "cancelled"]

    pid = run_pid(server, a["id"])
    assert pid_alive(pid)
    server.call("POST", f"/api/runs/{a['id']}/stop")
    run = wait_run(server, a["id"])
    assert run["status"] == "cancelled", run
    assert run["stop_requested"] is True
    evs = assert_gapless(server, a["id"])
    assert [e["data"]["status"] for e in evs if e["kind"] == "status"] == ["queued", "running", "cancelled"]
    assert evs[-1]["kind"] == "status"
    wait_for(lambda: not pid_alive(pid), 60, 0.1, f"run process {pid} to exit")

    arts = server.call("GET", f"/api/runs/{a['id']}/artifacts")
    ckpt = [x for x in arts if x["kind"] == "checkpoint"]
    assert ckpt, arts
    path = Path(ckpt[0]["path"])
    assert path.is_file() and path.name == "interrupt.pt"
    assert server.data_dir.resolve() in path.resolve().parents
    data = path.read_bytes()
    assert ckpt[0]["size"] == len(data) and ckpt[0]["sha256"] == hashlib.sha256(data).hexdigest()
    # Stopping a finished run changes nothing.
    assert server.call("POST", f"/api/runs/{a['id']}/stop")["status"] == "cancelled"

    assert server.call("DELETE", f"/api/runs/{a['id']}") == {"deleted": a["id"]}
    st, body = server.api("GET", f"/api/runs/{a['id']}")
    assert st == 404 and body["error"]["code"] == "not_found"
    st, _ = server.api("GET", f"/api/runs/{a['id']}/events")
    assert st == 404


def test_run_ignoring_stop_is_killed_after_grace(server: ServerProc) -> None:
    """A node that ignores the stop request is killed after the 10 s
    grace; the run ends `interrupted` and its process is gone. A running run
    cannot be deleted (409)."""
    run = server.submit(start_then("TestIgnoreStop", "sleeper"))
    wait_event(server, run["id"], lambda e: e["kind"] == "log" and "ignoring stop" in e["data"].get("message", ""),
               what="the sleeper node to start")
    pid = run_pid(server, run["id"])
    st, body = server.api("DELETE", f"/api/runs/{run['id']}")
    assert st == 409 and body["error"]["code"] == "run_active", body
    server.call("POST", f"/api/runs/{run['id']}/stop")
    assert server.run(run["id"])["status"] == "running", "the run ended before its grace"
    done = wait_run(server, run["id"], timeout=90)
    assert done["status"] == "interrupted", done
    assert "did not stop within 10 s" in done["error"]
    evs = assert_gapless(server, run["id"])
    assert evs[-1]["kind"] == "status" and evs[-1]["data"]["status"] == "interrupted"
    wait_for(lambda: not pid_alive(pid), 30, 0.1, f"run process {pid} to be gone")


# -- crashes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("node_type, code", [("TestExit", "3"), ("TestSelfKill", "-9")])
def test_crashing_run_fails_alone(server: ServerProc, node_type: str, code: str) -> None:
    """A run whose process dies (os._exit(3), SIGKILL) ends
    `failed` with `run subprocess exited with code N`; the server stays healthy
    and the next run succeeds."""
    run = wait_run(server, server.submit(start_then(node_type, "crash"))["id"])
    assert run["status"] == "failed"
    assert run["error"] == f"run subprocess exited with code {code}"
    evs = assert_gapless(server, run["id"])
    assert any(e["kind"] == "log" and "about to" in e["data"].get("message", "") for e in evs), \
        "the node did not run before the crash"
    assert server.alive
    st, health = server.api("GET", "/api/health", token=False)
    assert st == 200 and health["status"] == "ok"
    after = wait_run(server, server.submit(csv_print_graph())["id"])
    assert after["status"] == "succeeded", after["error"]


# -- server restarts -------------------------------------------------------------------------------
@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path, name="restart-server")
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_kill9_restart_interrupts_running_keeps_queued(fresh_server: ServerProc) -> None:
    """Queued runs survive a restart (a choice of ours, docs/architecture.md): after the
    server is killed (SIGKILL) and restarted, the run that was executing on it
    ends `interrupted` with a message, its orphaned process is gone, its events
    stay gapless; the queued run is still queued and then runs."""
    s = fresh_server
    a = s.submit(long_training_graph())
    first_epoch(s, a["id"])
    pid = run_pid(s, a["id"])
    b = s.submit(long_training_graph())
    wait_for(lambda: s.run(b["id"])["queue_reason"] == BUSY_CPU, 60, 0.2,
             f"the second run to wait with {BUSY_CPU!r}", detail=lambda: s.run(b["id"]))
    s.kill9()
    # Without its server the run process loses its pipe and must end by itself.
    wait_for(lambda: not pid_alive(pid), 90, 0.2, f"orphaned run process {pid} to exit")
    restarted_at = time.time()
    s.start()
    ra = wait_run(s, a["id"], timeout=60)
    assert ra["status"] == "interrupted", ra
    assert "restarted" in ra["error"], ra["error"]
    evs = assert_gapless(s, a["id"])
    assert evs[-1]["kind"] == "status" and evs[-1]["data"]["status"] == "interrupted"

    rb = wait_run(s, b["id"], {"running"} | {"succeeded", "failed", "cancelled", "interrupted"}, timeout=60)
    assert rb["status"] == "running", rb
    first_epoch(s, b["id"])
    assert statuses(s, b["id"]) == ["queued", "running"]
    from datetime import datetime
    started = datetime.fromisoformat(rb["started_at"].replace("Z", "+00:00")).timestamp()
    assert started >= restarted_at - 1, "the queued run started before the restart"
    s.call("POST", f"/api/runs/{b['id']}/stop")
    assert wait_run(s, b["id"])["status"] == "cancelled"


def test_graceful_stop_ends_running_runs(fresh_server: ServerProc) -> None:
    """A graceful stop (SIGTERM) of the server stops its
    running run, which honours the stop and is recorded `cancelled` (never left
    `running`) before the server exits, and its process is gone."""
    s = fresh_server
    a = s.submit(long_training_graph())
    first_epoch(s, a["id"])
    pid = run_pid(s, a["id"])
    rc = s.stop()
    assert rc == 0, f"the server exited with {rc} on SIGTERM"
    assert not pid_alive(pid), "the run process outlived a graceful server stop"
    conn = sqlite3.connect(f"file:{s.db_path}?mode=ro", uri=True)
    try:
        status, error = conn.execute("SELECT status, error FROM runs WHERE id=?", (a["id"],)).fetchone()
        kinds = [(seq, kind, json.dumps(data)) for seq, _src, _s, kind, data, _at in event_rows(conn, a["id"])]
    finally:
        conn.close()
    assert (status, error) == ("cancelled", "stopped on request")
    assert [k[0] for k in kinds] == list(range(1, len(kinds) + 1))
    assert kinds[-1][1] == "status" and status in kinds[-1][2]

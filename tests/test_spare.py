"""Warm spare run processes (cdui/run/spare.py) through the real launcher, and on a real agent and server.

Every run here is a real ``cdui.run.runproc`` subprocess importing torch, so the
whole module is e2e. A test compares a warm run with a cold one where it can:
the warm start must change when the process was started, nothing else.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cdui.core.layout import Layout
from cdui.run import runner
from cdui.run.spare import SparePool
from cdui.wire.job import Job
from procs import ServerProc, graph, node, pid_alive, trig, wait_for, wait_run

pytestmark = pytest.mark.e2e

REPORTER = textwrap.dedent('''
    """Reports what the run process sees, as one log line of JSON; waits for stop when told to."""
    import json
    import os
    import sys
    import time

    import torch

    from cdui.graph.context import RunStopped
    from cdui.nodes.base import Node, Param


    VERSION = 1


    class ReportNode(Node):
        NODE_NAME = "TestSpareReport"

        @classmethod
        def define_params(cls):
            return [Param("mode", "string", "report")]

        def execute(self, inputs, params, ctx):
            ctx.log("spare-report " + json.dumps({
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "cards": torch.cuda.device_count(),
                "device": ctx.device, "version": VERSION, "extra": os.environ.get("CDUI_TEST_SPARE_EXTRA"),
                "umask": os.umask(0o022), "cwd": os.getcwd(), "pgid_is_pid": os.getpgid(0) == os.getpid()}))
            print("spare-stderr", file=sys.stderr, flush=True)
            if params["mode"] == "crash":
                os._exit(3)
            if params["mode"] == "wait":
                while True:
                    if ctx.should_stop():
                        raise RunStopped()
                    time.sleep(0.02)
            return {}
''')


def job(tmp_path: Path, run_id: str, slot: str = "cpu", mode: str = "report") -> Job:
    custom = tmp_path / "custom_nodes"
    return Job(run_id=run_id, graph=graph([node("start", "Start"), node("r", "TestSpareReport", mode=mode)],
                                          [trig("start", "r")]),
               slot_device=slot, layout=Layout.for_data_dir(tmp_path).to_json(), custom_nodes_dir=str(custom))


def install_reporter(tmp_path: Path, version: int = 1) -> None:
    (tmp_path / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (tmp_path / "custom_nodes" / "report.py").write_text(REPORTER.replace("VERSION = 1", f"VERSION = {version}"))


class Ran:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    @property
    def statuses(self) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e["kind"] == "status"]

    @property
    def pid(self) -> int:
        return int(self.statuses[0]["pid"])

    @property
    def report(self) -> dict[str, Any]:
        found = [json.loads(e["data"]["message"].split(" ", 1)[1]) for e in self.events
                 if e["kind"] == "log" and e["data"]["message"].startswith("spare-report ")]
        assert len(found) == 1, self.events
        return found[0]


async def run(j: Job, pool: SparePool | None, log: Path,
              during: Callable[[runner.RunHandle], Awaitable[None]] | None = None) -> Ran:
    events: list[dict[str, Any]] = []

    async def sink(batch: list[dict[str, Any]]) -> None:
        events.extend(batch)
    handle = await runner.launch(j, sink, log, spares=pool)
    if during is not None:
        await during(handle)
    await asyncio.wait_for(handle.wait(), 120)
    return Ran(events)


def test_a_warm_run_sees_what_a_cold_one_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spare was started under the launcher's ``1,0``; the run on slot ``cuda:1`` must see only card
    ``0``, as a fresh process does. Were CUDA initialised before the handover, a GPU machine would count
    0 cards here instead of 1. The custom node is rewritten after the spare started: the run loads the new one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    install_reporter(tmp_path, version=1)

    async def main() -> tuple[int | None, Ran, Ran, int | None]:
        pool, off = SparePool(), SparePool(enabled=False)
        runner.prime_spare(pool)
        spare = await pool.settled()
        install_reporter(tmp_path, version=2)
        warm = await run(job(tmp_path, "warm", "cuda:1"), pool, tmp_path / "warm.log")
        cold = await run(job(tmp_path, "cold", "cuda:1"), off, tmp_path / "cold.log")
        await pool.close()
        return spare, warm, cold, await off.settled()

    spare, warm, cold, off_spare = asyncio.run(main())
    assert spare is not None and warm.pid == spare, "the run takes the spare"
    assert off_spare is None and cold.pid != spare, "a disabled pool starts every run fresh and keeps none"
    assert warm.statuses[-1] == {"status": "succeeded", "error": None}, warm.events
    assert warm.report["version"] == 2
    assert warm.report["visible"] == "0"
    assert warm.report == cold.report  # cards, device, umask, working folder, own process group
    assert warm.report["pgid_is_pid"] is True
    logs = [e["data"]["message"] for e in warm.events if e["kind"] == "log"]
    assert "running 2 nodes on cuda:1 (cuda:0 in the run's process)" in logs
    assert "spare-stderr" in (tmp_path / "warm.log").read_text().splitlines(), "stderr is the run's log"


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_a_run_with_another_environment_gets_a_fresh_process(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    install_reporter(tmp_path)

    async def main() -> tuple[int | None, Ran, int | None, bool, dict[str, str]]:
        pool = SparePool()
        runner.prime_spare(pool)
        old = await pool.settled()
        monkeypatch.setenv("CDUI_TEST_SPARE_EXTRA", "changed")
        changed = await run(job(tmp_path, "changed"), pool, tmp_path / "changed.log")
        new = await pool.settled()
        old_alive = old is not None and pid_alive(old)
        new_env = environ_of(new) if new is not None else {}
        await pool.close()
        return old, changed, new, old_alive, new_env

    old, changed, new, old_alive, new_env = asyncio.run(main())
    assert old is not None and changed.pid != old, "a spare built without the variable is not used"
    assert changed.report["extra"] == "changed"
    assert not old_alive, "the spare of the old environment is ended"
    assert new is not None and new not in (old, changed.pid)
    assert new_env.get("CDUI_TEST_SPARE_EXTRA") == "changed", "the next spare is built as the last run was"


def test_spare_lifecycle_death_crash_stop_close(tmp_path: Path) -> None:
    """A spare killed while idle is replaced; a run that crashes in a spare ends alone; a warm run stops
    on request; closing the pool ends its spare, and a closed pool starts runs fresh and keeps none."""
    install_reporter(tmp_path)

    async def main() -> dict[str, Any]:
        pool = SparePool()
        runner.prime_spare(pool)
        dead = await pool.settled()
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        await asyncio.to_thread(wait_for, lambda: pool.idle_pid not in (None, dead), 120, 0.05,
                                "a replacement spare")
        replacement = pool.idle_pid
        crash = await run(job(tmp_path, "crash", mode="crash"), pool, tmp_path / "crash.log")
        next_spare = await pool.settled()

        async def stop_once_started(h: runner.RunHandle) -> None:
            log = tmp_path / "wait.log"
            await asyncio.to_thread(wait_for, lambda: log.exists() and "spare-stderr" in log.read_text(),
                                    120, 0.05, "the run's first output")
            h.stop(30)
        stopped = await run(job(tmp_path, "wait", mode="wait"), pool, tmp_path / "wait.log", stop_once_started)
        left = await pool.settled()
        await pool.close()
        left_alive = left is not None and pid_alive(left)
        proc, handover = await pool.process(*runner.process_shape(), dict(os.environ))
        fresh_cmd = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert proc.stdin is not None
        proc.stdin.close()
        await proc.wait()
        return {"dead": dead, "replacement": replacement, "crash": crash, "next": next_spare,
                "stopped": stopped, "left": left, "left_alive": left_alive, "handover": handover,
                "fresh_cmd": fresh_cmd, "after_close": await pool.settled()}

    r = asyncio.run(main())
    assert r["replacement"] not in (None, r["dead"])
    assert r["crash"].pid == r["replacement"]
    assert r["crash"].statuses[-1] == {"status": "failed", "error": "run subprocess exited with code 3"}
    assert r["stopped"].pid == r["next"] and r["next"] != r["replacement"]
    assert r["stopped"].statuses[-1] == {"status": "cancelled", "error": "stopped on request"}
    assert r["left"] is not None and not r["left_alive"], "closing the pool ends its spare"
    assert r["handover"] is None and b"--spare" not in r["fresh_cmd"] and r["after_close"] is None


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def spares_of(parent: int) -> set[int]:
    """The idle spare processes ``parent`` started (its children started with --spare)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == parent and stat[0] not in ("Z", "X") and \
                    proc_cmdline(int(entry)).endswith("-m cdui.run.runproc --spare "):
                out.add(int(entry))
    return out


WAIT_GRAPH = graph([node("start", "Start"), node("r", "TestSpareReport", mode="wait")], [trig("start", "r")])


def run_and_see_its_process(server: ServerProc, target: Any) -> str:
    """Start a waiting run on ``target``, read its process's command line while it runs, then stop it."""
    r = server.submit(WAIT_GRAPH, {"target": target})

    def pid() -> int | None:
        for e in server.events(r["id"]):
            if e["kind"] == "log" and e["data"]["message"].startswith("spare-report "):
                return next(int(s["data"]["pid"]) for s in server.events(r["id"])
                            if s["kind"] == "status" and s["data"].get("status") == "running")
        return None
    cmd = proc_cmdline(wait_for(pid, 120, 0.1, "the run's report"))
    server.call("POST", f"/api/runs/{r['id']}/stop", {})
    assert wait_run(server, r["id"])["status"] == "cancelled"
    return cmd


def test_agent_and_server_runs_start_warm_and_leave_no_spare(tmp_path: Path) -> None:
    """The first run of each owner starts cold, the next takes the spare; stopping the agent and the
    server ends their spares."""
    from test_workers import Agent, token, wait_online
    server = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"})
    install_reporter(server.data_dir)
    server.start()
    agent = Agent(tmp_path, server.url, token=token(server))
    install_reporter(agent.data_dir)
    agent.spawn()
    try:
        wait_online(server, agent=agent)
        for target in ({"worker": "w1"}, "local"):
            assert "cdui.run.runproc --spare" not in run_and_see_its_process(server, target)
            assert "cdui.run.runproc --spare" in run_and_see_its_process(server, target)
        assert agent.pid is not None and server.pid is not None
        agent_spares = wait_for(lambda: spares_of(agent.pid), 120, 0.1, "the agent's spare")  # type: ignore[arg-type]
        server_spares = wait_for(lambda: spares_of(server.pid), 120, 0.1, "the server's spare")  # type: ignore[arg-type]
        assert len(agent_spares) == 1 and len(server_spares) == 1
    finally:
        agent.stop()
        server.stop()
    assert not any(pid_alive(p) for p in agent_spares | server_spares), "no spare outlives its owner"

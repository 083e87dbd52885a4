"""Warm run processes forked by a zygote (cdui/run/spare.py, cdui/run/zygote.py), through the real
launcher, and on a real agent and server.

Every run here is a real ``cdui.run.runproc`` process importing torch (a zygote or a fresh one), so the
whole module is e2e. A test compares a forked run with a fresh one where it can: the warm start must
change when the process was started, nothing else.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cdui.core.layout import Layout
from cdui.run import runner
from cdui.run.spare import SparePool
from cdui.wire.job import Job
from procs import REPO_ROOT, ServerProc, graph, node, pid_alive, trig, wait_for, wait_run

pytestmark = pytest.mark.e2e

SECRET = "zygote-test-secret-5b1f"
REPORTER = textwrap.dedent('''
    """Reports what the run process sees, as one log line of JSON; then crashes, waits or ignores a stop."""
    import json
    import os
    import sys
    import time

    import torch

    from cdui.graph.context import RunStopped
    from cdui.nodes.base import Node, Param


    VERSION = 1
    SECRET = "zygote-test-secret-5b1f"


    class ReportNode(Node):
        NODE_NAME = "TestSpareReport"

        @classmethod
        def define_params(cls):
            return [Param("mode", "string", "report")]

        def execute(self, inputs, params, ctx):
            ctx.log("spare-report " + json.dumps({
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "cards": torch.cuda.device_count(),
                "device": ctx.device, "version": VERSION, "extra": os.environ.get("CDUI_TEST_SPARE_EXTRA"),
                "umask": os.umask(0o022), "cwd": os.getcwd(), "pgid_is_pid": os.getpgid(0) == os.getpid(),
                "sid_is_pid": os.getsid(0) == os.getpid(),
                "secret_in_environ": any(SECRET in k + v for k, v in os.environ.items()),
                "secret_in_argv": any(SECRET in a for a in sys.argv)}))
            print("spare-stderr", file=sys.stderr, flush=True)
            mode = params["mode"]
            if mode == "crash":
                os._exit(3)
            while mode != "report":
                if ctx.should_stop():
                    if mode == "crash_on_stop":
                        os._exit(3)
                    if mode == "wait":
                        raise RunStopped()
                time.sleep(0.02)
            return {}
''')


def job(tmp_path: Path, run_id: str, slot: str = "cpu", mode: str = "report") -> Job:
    custom = tmp_path / "custom_nodes"
    return Job(run_id=run_id, graph=graph([node("start", "Start"), node("r", "TestSpareReport", mode=mode)],
                                          [trig("start", "r")]),
               slot_device=slot, layout=Layout.for_data_dir(tmp_path).to_json(), custom_nodes_dir=str(custom),
               secrets=(((), SECRET),))


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


def reported(log: Path) -> Callable[[runner.RunHandle], Awaitable[None]]:
    """Wait for the run's report (its stderr line), then leave it to ``then``."""
    async def wait(h: runner.RunHandle) -> None:
        await asyncio.to_thread(wait_for, lambda: log.exists() and "spare-stderr" in log.read_text(),
                                120, 0.05, "the run's report")
    return wait


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def holds_secret(pid: int) -> bool:
    """The secret in the process's command line or the environment it was started with."""
    return any(SECRET.encode() in Path(f"/proc/{pid}/{what}").read_bytes() for what in ("cmdline", "environ"))


def test_a_forked_run_sees_what_a_fresh_one_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote was started under the launcher's ``1,0``; the run on slot ``cuda:1`` must see only card
    ``0``, as a fresh process does. Were CUDA initialised before the fork, a GPU machine would count 0
    cards here instead of 1. The custom node is rewritten after the zygote started: the run loads the new
    one. The secret, sent on the run's stdin only, is in no command line or environment."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    install_reporter(tmp_path, version=1)
    seen: dict[str, Any] = {}

    def looking(name: str, zygote: int | None) -> Callable[[runner.RunHandle], Awaitable[None]]:
        async def look(h: runner.RunHandle) -> None:
            await reported(tmp_path / f"{name}.log")(h)
            assert h.proc is not None
            seen[name] = {"parent": parent_of(h.proc.pid), "secret": holds_secret(h.proc.pid),
                          "zygote_secret": zygote is not None and holds_secret(zygote)}
            h.stop(30)
        return look

    async def main() -> tuple[int | None, Ran, Ran, int | None]:
        pool, off = SparePool(), SparePool(enabled=False)
        runner.prime_spare(pool)
        zygote = await pool.settled()
        install_reporter(tmp_path, version=2)
        warm = await run(job(tmp_path, "warm", "cuda:1", "wait"), pool, tmp_path / "warm.log",
                         looking("warm", zygote))
        cold = await run(job(tmp_path, "cold", "cuda:1", "wait"), off, tmp_path / "cold.log", looking("cold", None))
        await pool.close()
        return zygote, warm, cold, await off.settled()

    zygote, warm, cold, off_zygote = asyncio.run(main())
    assert zygote is not None and seen["warm"]["parent"] == zygote, "the zygote forks the run"
    assert off_zygote is None and seen["cold"]["parent"] == os.getpid(), "a disabled pool starts runs fresh"
    for ran in (warm, cold):
        assert ran.statuses[-1] == {"status": "cancelled", "error": "stopped on request"}, ran.events
    assert warm.report["version"] == 2
    assert warm.report["visible"] == "0"
    assert warm.report == cold.report  # cards, device, umask, working folder, own session, no secret
    assert warm.report["pgid_is_pid"] is True and warm.report["sid_is_pid"] is True
    assert warm.report["secret_in_environ"] is False and warm.report["secret_in_argv"] is False
    assert seen["warm"]["secret"] is False and seen["warm"]["zygote_secret"] is False
    logs = [e["data"]["message"] for e in warm.events if e["kind"] == "log"]
    assert "running 2 nodes on cuda:1 (cuda:0 in the run's process)" in logs
    assert "spare-stderr" in (tmp_path / "warm.log").read_text().splitlines(), "stderr is the run's log"


def test_a_run_with_another_environment_gets_a_zygote_of_its_own(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    install_reporter(tmp_path)

    async def main() -> tuple[int | None, Ran, int | None, dict[str, str]]:
        pool = SparePool()
        runner.prime_spare(pool)
        old = await pool.settled()
        assert old is not None
        monkeypatch.setenv("CDUI_TEST_SPARE_EXTRA", "changed")
        changed = await run(job(tmp_path, "changed"), pool, tmp_path / "changed.log")
        new = await pool.settled()
        await asyncio.to_thread(wait_for, lambda: not pid_alive(old), 120, 0.05, "the old zygote to exit")
        new_env = environ_of(new) if new is not None else {}
        await pool.close()
        return old, changed, new, new_env

    old, changed, new, new_env = asyncio.run(main())
    assert changed.report["extra"] == "changed"
    assert changed.statuses[-1] == {"status": "succeeded", "error": None}
    assert new is not None and new not in (old, changed.pid)
    assert new_env.get("CDUI_TEST_SPARE_EXTRA") == "changed", "the new zygote is built as the run was"


def test_zygote_lifecycle_death_crash_stop_kill_close(tmp_path: Path) -> None:
    """A zygote killed while idle is replaced; a forked run that crashes ends alone and the zygote forks
    the next; a forked run stops on request, and one that ignores the stop is killed with its group; a
    run whose zygote died still stops and ends (its exit code is lost with the zygote); closing the pool
    ends its zygote, and a closed pool starts runs fresh and keeps none."""
    install_reporter(tmp_path)

    async def main() -> dict[str, Any]:
        pool = SparePool()
        runner.prime_spare(pool)
        dead = await pool.settled()
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        await asyncio.to_thread(wait_for, lambda: pool.idle_pid not in (None, dead), 120, 0.05,
                                "a replacement zygote")
        zygote = pool.idle_pid
        assert zygote is not None
        crash = await run(job(tmp_path, "crash", mode="crash"), pool, tmp_path / "crash.log")

        parents: dict[str, int] = {}

        async def stop(h: runner.RunHandle) -> None:
            await reported(Path(str(h.log_path)))(h)
            assert h.proc is not None
            parents["stopped"] = parent_of(h.proc.pid)
            h.stop(30)
        stopped = await run(job(tmp_path, "wait", mode="wait"), pool, tmp_path / "wait.log", stop)

        async def stop_soon(h: runner.RunHandle) -> None:
            await reported(Path(str(h.log_path)))(h)
            assert h.proc is not None
            parents["killed"] = parent_of(h.proc.pid)
            h.stop(1)
        killed = await run(job(tmp_path, "ignore", mode="ignore"), pool, tmp_path / "ignore.log", stop_soon)

        async def orphan(h: runner.RunHandle) -> None:
            await reported(Path(str(h.log_path)))(h)
            os.kill(zygote, signal.SIGKILL)
            await asyncio.to_thread(wait_for, lambda: not pid_alive(zygote), 60, 0.05, "the zygote's end")
            h.stop(30)
        orphaned = await run(job(tmp_path, "orphan", mode="crash_on_stop"), pool, tmp_path / "orphan.log", orphan)
        left = await asyncio.to_thread(wait_for, lambda: pool.idle_pid not in (None, zygote) and pool.idle_pid,
                                       120, 0.05, "a zygote after the killed one")
        await pool.close()
        left_alive = pid_alive(left)
        proc = await pool.process(*runner.process_shape(), dict(os.environ))
        fresh_cmd = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert proc.stdin is not None
        proc.stdin.close()
        await proc.wait()
        return {"dead": dead, "zygote": zygote, "parents": parents, "crash": crash, "stopped": stopped,
                "killed": killed,
                "orphaned": orphaned, "left_alive": left_alive, "fresh_cmd": fresh_cmd,
                "after_close": await pool.settled()}

    r = asyncio.run(main())
    assert r["zygote"] != r["dead"]
    assert r["crash"].statuses[-1] == {"status": "failed", "error": "run subprocess exited with code 3"}
    assert r["parents"] == {"stopped": r["zygote"], "killed": r["zygote"]}, "a crash ends only its own run"
    assert r["stopped"].statuses[-1] == {"status": "cancelled", "error": "stopped on request"}
    assert r["killed"].statuses[-1] == {"status": "interrupted",
                                        "error": "the run did not stop within 1 s and was killed"}
    assert r["orphaned"].statuses[-1] == {
        "status": "failed", "error": "run subprocess exited; its exit code was lost with the zygote that forked it"}
    assert not r["left_alive"], "closing the pool ends its zygote"
    assert b"--zygote" not in r["fresh_cmd"] and r["after_close"] is None


OWNER = textwrap.dedent('''
    import asyncio, json, sys
    from cdui.run import runner
    from cdui.run.spare import SparePool
    from cdui.wire.job import Job

    async def main():
        pool = SparePool()
        async def sink(batch):
            pass
        h = await runner.launch(Job.from_json(sys.argv[1]), sink, None, spares=pool)
        print(json.dumps({"zygote": pool.idle_pid, "run": h.proc.pid}), flush=True)
        await asyncio.sleep(3600)
    asyncio.run(main())
''')


def test_no_zygote_outlives_an_owner_killed_outright(tmp_path: Path) -> None:
    """An owner killed with SIGKILL cannot close anything: its zygote sees the control socket end and
    its run sees its stdin end; the run stops, and the zygote exits once it is gone."""
    install_reporter(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, job(tmp_path, "orphan", mode="wait").to_json()],
                             cwd=str(REPO_ROOT), stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert owner.stdout is not None
        pids = json.loads(owner.stdout.readline())
        wait_for(lambda: (tmp_path / "custom_nodes").exists(), 5, 0.05, "the node folder")
        assert parent_of(pids["run"]) == pids["zygote"]
        owner.kill()
        owner.wait()
        wait_for(lambda: not pid_alive(pids["run"]), 120, 0.1, "the orphaned run to stop")
        wait_for(lambda: not pid_alive(pids["zygote"]), 60, 0.1, "the zygote to exit")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def zygotes_of(parent: int) -> set[int]:
    """The zygotes ``parent`` started (its children started with --zygote)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == parent and stat[0] not in ("Z", "X") and \
                    proc_cmdline(int(entry)).endswith("-m cdui.run.runproc --zygote "):
                out.add(int(entry))
    return out


WAIT_GRAPH = graph([node("start", "Start"), node("r", "TestSpareReport", mode="wait")], [trig("start", "r")])


def run_and_see_its_parent(server: ServerProc, target: Any) -> int:
    """Start a waiting run on ``target``, read its process's parent while it runs, then stop it."""
    r = server.submit(WAIT_GRAPH, {"target": target})

    def pid() -> int | None:
        for e in server.events(r["id"]):
            if e["kind"] == "log" and e["data"]["message"].startswith("spare-report "):
                return next(int(s["data"]["pid"]) for s in server.events(r["id"])
                            if s["kind"] == "status" and s["data"].get("status") == "running")
        return None
    parent = parent_of(wait_for(pid, 120, 0.1, "the run's report"))
    server.call("POST", f"/api/runs/{r['id']}/stop", {})
    assert wait_run(server, r["id"])["status"] == "cancelled"
    return parent


def test_agent_and_server_runs_are_forked_and_leave_no_zygote(tmp_path: Path) -> None:
    """Each owner starts its zygote at its first run, which it forks, and forks the next from the same
    one; stopping the agent and the server ends their zygotes."""
    from test_workers import Agent, token, wait_online
    server = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"})
    install_reporter(server.data_dir)
    server.start()
    agent = Agent(tmp_path, server.url, token=token(server))
    install_reporter(agent.data_dir)
    agent.spawn()
    zygotes: set[int] = set()
    try:
        wait_online(server, agent=agent)
        assert agent.pid is not None and server.pid is not None
        for target, owner in (({"worker": "w1"}, agent.pid), ("local", server.pid)):
            first, second = run_and_see_its_parent(server, target), run_and_see_its_parent(server, target)
            assert first == second and zygotes_of(owner) == {first}
            zygotes.add(first)
    finally:
        agent.stop()
        server.stop()
    assert len(zygotes) == 2 and not any(pid_alive(p) for p in zygotes), "no zygote outlives its owner"

"""The real agent, in-process, against the real control plane, on one fake clock.

Each test builds :class:`cdui.agent.agent.Agent` as ``cdui agent start`` does,
but with its clock (the control plane's :class:`FakeClock`), its stop event (what
SIGTERM sets) and its connector (a :class:`harness.Link` the test can cut) given
from here, against :class:`harness.Plane` on a loopback port. Nothing of cdui is
mocked: its runs execute in real run subprocesses (the Ticker node), its events go
through its spool, its reconnects back off on the fake clock, so the test steps
time instead of waiting for it. buildkite's ``agent_worker_test.go`` is the model,
with the real server instead of a fake one.

The tests whose agent runs a run start a run subprocess (an interpreter that
imports torch): they are in the e2e tier (``CDUI_TEST_TIER=all``), so the default
tier stays quick; the refusals need no run and stay in the default tier. What
needs a real agent *process* stays with the process tests: the signal handlers
themselves, ``cdui agent start``'s background start, a version mismatch (the
version is the installed package's), the launcher.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Link, Plane, eventually

from cdui import __version__
from cdui.agent.agent import Agent
from cdui.agent.oneshot_agent import OneShot
from cdui.core import exit_codes
from cdui.core.clock import FakeClock
from cdui.core.config import load
from cdui.nodes.registry import build_registry
from cdui.run import catalog
from procs import edge, graph, install_ticker, node, ticker_graph, trig

# A run subprocess costs an interpreter start with torch (seconds): those tests are e2e.
runs_a_run = pytest.mark.e2e

# How long a run subprocess, the agent's catalog helper or a clean stop may take, in real time
# (a loaded 2-core machine starts an interpreter with torch slowly); never a wait for time to pass.
SLOW_S = 120.0


@pytest.fixture(autouse=True)
def _no_leaked_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent tells its runs which accelerator it saw through the environment (as its process
    # does); here that is the test process's, so it is put back afterwards.
    monkeypatch.delenv(catalog.SEEN_ACCELERATOR_ENV, raising=False)


def control_plane(tmp_path: Path, **settings: str) -> Plane:
    install_ticker(tmp_path / "cp-data")
    return Plane(tmp_path / "cp", tmp_path / "cp-data", **settings)


async def enroll(cp: Plane, name: str) -> str:
    tok = (await cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201))["token"]
    return str((await cp.call("POST", "/api/workers/enroll", {
        "token": tok, "name": name, "devices": ["cpu"], "version": __version__, "machine_id": f"machine-{name}"},
        expect=201))["credential"])


def probe_here(custom: Path | None, plugins: Path | None) -> catalog.Probe:
    """The node catalog helper's answer, read in this process (the helper is a subprocess so that
    a plugin crashing at import cannot take the agent with it; here the test is the process)."""
    registry = build_registry(custom, plugins)
    return catalog.Probe(catalog.node_catalog(registry), catalog.fingerprint(custom, plugins))


def agent_for(cp: Plane, tmp_path: Path, credential: str, name: str = "w1", link: Link | None = None,
              one_shot: OneShot | None = None) -> Agent:
    """The agent ``cdui agent start --control URL --name NAME --devices cpu`` builds, on the control
    plane's clock, in its own user data and data folders (another machine: its own machine id)."""
    ud, data = tmp_path / f"agent-{name}", tmp_path / f"agent-{name}-data"
    install_ticker(data)
    ud.mkdir(mode=0o700, parents=True, exist_ok=True)  # as `cdui agent start` has it before the agent starts
    cfg = load({"CODEFYUI_USER_DATA_DIR": str(ud), "CODEFYUI_DATA_DIR": str(data)})
    return Agent(cp.url, credential, name, ["cpu"], ud, f"machine-{name}", status_file=ud / "agent-status.json",
                 config=cfg, one_shot=one_shot, clock=cp.clock, connector=(lambda: link) if link else None,
                 catalog_probe=probe_here)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[int]]:
    """The agent's main loop as a task; stopped (as SIGTERM does) and awaited at the end, whatever happened."""
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        if not task.done():
            agent.stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), SLOW_S)
            except TimeoutError:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise


async def exit_code(task: asyncio.Task[int]) -> int:
    """The agent's exit code, once it ended by itself (no clock step is made meanwhile)."""
    return await asyncio.wait_for(asyncio.shield(task), SLOW_S)


async def online(cp: Plane, name: str, task: asyncio.Task[int]) -> None:
    async def check() -> bool:
        assert not task.done(), f"the agent ended with {task.result()}"
        w = await cp.worker(name)
        return bool(w and w["online"])
    await eventually(check, f"worker {name} online", SLOW_S)


async def step_until(clock: FakeClock, pred: Callable[[], Any], what: str, step: float = 0.5) -> None:
    """Let agent time pass in steps until ``pred()``: a backoff wait ends when the clock passes it."""
    async def stepped() -> Any:
        if pred():
            return True
        await clock.advance(step)
        return pred()
    await eventually(stepped, what, SLOW_S)


async def submit(cp: Plane, graph: dict[str, Any], options: dict[str, Any]) -> str:
    return str((await cp.call("POST", "/api/runs", {"graph": graph, "options": options}, expect=201))["id"])


async def ticks(cp: Plane, run_id: str) -> list[int]:
    return [e["data"]["tick"] for e in await cp.events(run_id) if e["kind"] == "progress"]


def status_file(agent: Agent) -> dict[str, Any]:
    assert agent.status_file is not None
    try:
        return dict(json.loads(agent.status_file.read_text()))
    except (OSError, ValueError):
        return {}


@runs_a_run
async def test_a_cut_link_leaves_events_in_the_spool_and_the_reconnect_replays_each_once_in_order(
        tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        link = Link()
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"), link=link)
        async with running(agent) as task:
            await online(cp, "w1", task)
            n = 40
            run_id = await submit(cp, ticker_graph(n, 0.05), {"target": {"worker": "w1"}})
            await eventually(lambda: _at_least(ticks(cp, run_id), 5), "a few ticks stored", SLOW_S)
            link.cut()
            r = await cp.wait_status(run_id, "disconnected", timeout=SLOW_S)
            assert r["worker_status"]["state"] == "disconnected", r
            # The run ticks on: its events go to the spool, not acknowledged.
            await eventually(lambda: run_id in agent.runs and agent.runs[run_id].spool.unacked_events() >= 10,
                             "10 events spooled while the link is down", SLOW_S)
            assert agent.ws is None
            # Down: the agent's tries fail and it backs off on the clock; up again, the next try gets through.
            await cp.clock.advance(2.0)
            link.restore()
            await step_until(cp.clock, lambda: agent.ws is not None, "the agent to reconnect")
            done = await cp.wait_status(run_id, "succeeded", timeout=SLOW_S)
            assert done["worker_id"] == "w1", done
            evs = await cp.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "a gapless event log"
            assert await ticks(cp, run_id) == list(range(1, n + 1)), "every tick once, in order"
            starts = [e["data"]["node_id"] for e in evs
                      if e["kind"] == "node_status" and e["data"].get("status") == "running"]
            assert starts == ["start", "tick", "print"], "each node started once"
            warnings = [e["data"]["kind"] for e in evs if e["kind"] == "run_warning"]
            assert warnings == ["worker_disconnected", "worker_reconnected"], warnings
            # Everything acknowledged: the spool is emptied.
            await eventually(lambda: not agent.runs, "the spool emptied after the acknowledgements", SLOW_S)


ODD_EVENTS = '''
from cdui.nodes.base import Node, Port


class OddEvents(Node):
    """Emits two events no control plane takes as such, then logs (test only)."""
    NODE_NAME = "OddEvents"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return []

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        deep = {}
        for _ in range(20):
            deep = {"x": deep}
        ctx.emit("k" * 200, {"m": 1})
        ctx.emit("progress", {"deep": deep})
        ctx.log("after the odd events")
        return {"value": 1.0}
'''


@runs_a_run
async def test_events_a_control_plane_refuses_do_not_hold_back_the_rest_of_a_worker_run(tmp_path: Path) -> None:
    """A node's ctx.emit with a kind too long or data nested too deep: sent as such, the control plane refused
    its events message, and every later one after that gap, so the run's later log and its ending were never
    stored. The agent records each as a warning, and the run ends with everything after it."""
    for data in (tmp_path / "cp-data", tmp_path / "agent-w1-data"):
        (data / "custom_nodes").mkdir(parents=True, exist_ok=True)
        (data / "custom_nodes" / "odd_events.py").write_text(ODD_EVENTS)
    async with control_plane(tmp_path) as cp:
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"))
        async with running(agent) as task:
            await online(cp, "w1", task)
            g = graph([node("start", "Start"), node("odd", "OddEvents"), node("print", "Print", label="v")],
                      [trig("start", "odd"), edge("odd", "value", "print", "value")], name="odd events")
            run_id = await submit(cp, g, {"target": {"worker": "w1"}})
            done = await cp.wait_status(run_id, "succeeded", "failed", timeout=SLOW_S)
            assert done["status"] == "succeeded", done
            evs = await cp.events(run_id)
            assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "a gapless event log"
            logs = [e["data"]["message"] for e in evs if e["kind"] == "log"]
            assert "after the odd events" in logs, logs
            refused = [m for m in logs if "not an event a control plane takes" in m]
            assert len(refused) == 2, logs
            assert "is 200 characters long" in refused[0] and "nests deeper than 16" in refused[1], refused


async def _at_least(values: Any, k: int) -> bool:
    return len(await values) >= k


async def test_a_removed_worker_is_refused_and_its_agent_ends_with_2_without_retrying(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"))
        async with running(agent) as task:
            await online(cp, "w1", task)
            await cp.call("DELETE", "/api/workers/w1")
            # Ended without a clock step: no backoff wait came between the refusal and the exit.
            assert await exit_code(task) == exit_codes.REFUSED
            assert await cp.worker("w1") is None
            state = status_file(agent)
            assert state["state"] == "refused" and "was removed" in state["message"], state


async def test_a_superseded_credential_ends_the_agent_but_an_unknown_one_is_retried(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        old = await enroll(cp, "w1")
        reissue = await cp.call("POST", "/api/workers/w1/reissue", {}, expect=201)
        await cp.call("POST", "/api/workers/enroll", {"token": reissue["token"], "name": "w1", "devices": ["cpu"],
                                                      "version": __version__, "machine_id": "machine-w1"}, expect=201)
        superseded = agent_for(cp, tmp_path, old)
        async with running(superseded) as task:
            assert await exit_code(task) == exit_codes.REFUSED
            assert "superseded" in status_file(superseded)["message"]
        # A credential this control plane does not know may be another server's behind the same
        # address, or a database being restored: retried (with advice) until stopped.
        stranger = agent_for(cp, tmp_path, "0123456789abcdef0123456789abcdef", name="w2")
        async with running(stranger) as task:
            await eventually(lambda: "does not know" in status_file(stranger).get("message", ""),
                             "the first refusal", SLOW_S)
            assert status_file(stranger)["state"] == "connecting"
            assert stranger.status_file is not None
            stranger.status_file.unlink()
            await step_until(cp.clock, lambda: status_file(stranger).get("state") == "connecting", "a second try")
            assert not task.done()
            stranger.stop.set()
            assert await exit_code(task) == exit_codes.OK


@runs_a_run
async def test_a_one_shot_agent_runs_one_run_and_exits_with_its_result(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as cp:
        run_id = await submit(cp, ticker_graph(3, 0.01), {"target": {"pool": "one-shot"}, "device": "cpu"})
        other = await submit(cp, ticker_graph(3, 0.01), {"target": {"pool": "one-shot"}, "device": "cpu"})
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"), one_shot=OneShot())
        async with running(agent) as task:
            assert await exit_code(task) == exit_codes.OK
        done = await cp.run(run_id)
        assert (done["status"], done["worker_id"]) == ("succeeded", "w1"), done
        assert (await cp.run(other))["status"] == "queued", "a one-shot agent takes one run only"
        w = await cp.worker("w1")
        assert w is not None and (w["one_shot"], w["online"], w["one_shot_run"]) == (True, False, run_id), w
        assert not agent.runs, "its result was acknowledged: nothing is left in the spool"


@runs_a_run
@pytest.mark.parametrize("one_shot,status,code", [
    (False, "cancelled", exit_codes.OK),      # a service manager's stop: the run is cancelled
    (True, "interrupted", exit_codes.FAILED),  # a batch job's time limit: the run is interrupted
])
async def test_a_stop_while_a_run_goes_ends_it_as_sigterm_does(tmp_path: Path, one_shot: bool, status: str,
                                                               code: int, caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    async with control_plane(tmp_path) as cp:
        options: dict[str, Any] = ({"target": {"pool": "one-shot"}, "device": "cpu"} if one_shot
                                   else {"target": {"worker": "w1"}})
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"), one_shot=OneShot() if one_shot else None)
        async with running(agent) as task:
            if not one_shot:
                await online(cp, "w1", task)
            run_id = await submit(cp, ticker_graph(100000, 0.05, token=secret), options)
            await eventually(lambda: _at_least(ticks(cp, run_id), 1), "the run ticking", SLOW_S)
            agent.stop.set()
            assert await exit_code(task) == code
        r = await cp.run(run_id)
        assert r["status"] == status, r
        assert not agent.runs, "its last events were acknowledged before it exited"
    # The run's secret lived in memory only: nothing the agent or its run wrote holds it.
    for root in (agent.user_data, agent.config.layout.data_dir):
        for p in root.rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), f"secret found in {p}"
    assert secret not in caplog.text


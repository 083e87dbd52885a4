"""Two agents of two control planes on one user data folder (real processes).

Every SSH worker on a shared lab account uses the account's default folder, so two
people's control planes adding the same GPU account start two agents there. Each
must keep to its own runs: an agent that adopted the other's unfinished spool and
was told to drop it deleted it, and the other's run never reported its end.
"""
from __future__ import annotations

import pytest

from procs import ServerProc, install_ticker, ticker_graph, wait_for, wait_run
from tcpproxy import TcpProxy
from test_workers import Agent, progress_ticks, token, wait_online

# Real control planes and agents: the e2e tier.
pytestmark = pytest.mark.e2e


def test_two_control_planes_agents_on_one_folder_keep_their_runs(tmp_path):
    """The first agent's link stalls while the second starts, so none of its events is
    acknowledged meanwhile: a spool folder taken from under it then loses events for good
    (an acknowledgement would have made the folder again and hidden the loss)."""
    shared = tmp_path / "lab-account"
    # Heartbeats far apart: the stalled link is not given up during the stall.
    cps = [ServerProc(tmp_path / n, name=n, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "30"}) for n in ("cp1", "cp2")]
    proxy: TcpProxy | None = None
    agents: list[Agent] = []
    try:
        for cp in cps:
            install_ticker(cp.data_dir)
            cp.start()
        proxy = TcpProxy(cps[0].port)
        first = Agent(tmp_path, proxy.url, "w1", token(cps[0]), user_data=shared)
        first.spawn()
        agents.append(first)
        wait_online(cps[0], "w1", first)
        long_run = cps[0].submit(ticker_graph(100000, 0.05), {"target": {"worker": "w1"}})
        wait_for(lambda: progress_ticks(cps[0], long_run["id"]), 60, 0.1, "the first run ticking")

        proxy.freeze()
        # The second control plane's agent starts while the first one's run is unfinished.
        second = Agent(tmp_path, cps[1].url, "w2", token(cps[1]), user_data=shared)
        second.spawn()
        agents.append(second)
        wait_online(cps[1], "w2", second)
        # Run after the welcome was handled: by then that agent has done whatever it does to the spool.
        short_run = cps[1].submit(ticker_graph(5, 0.05), {"target": {"worker": "w2"}})
        assert wait_run(cps[1], short_run["id"])["status"] == "succeeded"
        proxy.restore()

        cps[0].call("POST", f"/api/runs/{long_run['id']}/stop", expect=200)
        assert wait_run(cps[0], long_run["id"], timeout=60)["status"] == "cancelled"
        ticks = progress_ticks(cps[0], long_run["id"])
        assert ticks == list(range(1, len(ticks) + 1))  # every event of it arrived, in order
        for cp in cps:
            assert [(r["id"], r["status"]) for r in cp.call("GET", "/api/runs", expect=200)
                    if r["status"] not in ("succeeded", "cancelled")] == []
    finally:
        for a in agents:
            a.stop()
        if proxy is not None:
            proxy.close()
        for cp in cps:
            cp.stop()

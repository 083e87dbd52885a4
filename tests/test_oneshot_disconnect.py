"""A one-shot agent's result across a dropped connection: delivered after a reconnect, or
left in the spool (exit 1) and delivered by the next agent on the same user data folder.

Real control plane, real agent processes behind a loopback TCP proxy the test cuts, real
run subprocesses: the e2e tier.
"""
from __future__ import annotations

import pytest

from procs import ServerProc, install_ticker, spool_dir, ticker_graph, wait_for, wait_run
from tcpproxy import TcpProxy
from test_oneshot import exit_code, one_shot, token

pytestmark = pytest.mark.e2e
POOL_CPU = {"target": {"pool": "one-shot"}, "device": "cpu"}


def _server(tmp_path, grace: str) -> ServerProc:
    s = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1", "CODEFYUI_WORKER_RESUME_GRACE_S": grace})
    install_ticker(s.data_dir)
    return s.start()


def _ticks(cp: ServerProc, run_id: str) -> list[int]:
    return [e["data"]["tick"] for e in cp.events(run_id) if e["kind"] == "progress"]


def test_the_result_is_delivered_after_a_disconnect_and_the_agent_exits_0(tmp_path):
    cp = _server(tmp_path, "120")
    proxy = TcpProxy(cp.port)
    try:
        run_id = cp.submit(ticker_graph(ticks=30, interval=0.1), POOL_CPU)["id"]
        install_ticker(tmp_path / "agent-w1-data")
        a = one_shot(tmp_path, proxy.url, tok=token(cp))
        wait_for(lambda: len(_ticks(cp, run_id)) >= 3, 180, 0.1, "three ticks", detail=lambda: a.log_tail(20))
        proxy.cut()
        wait_for(lambda: cp.run(run_id)["status"] == "disconnected", 60, 0.1, "the run to be disconnected")
        proxy.restore()
        assert exit_code(a) == 0, a.log_tail(40)
        r = wait_run(cp, run_id)
        assert r["status"] == "succeeded"
        assert _ticks(cp, run_id) == list(range(1, 31))
    finally:
        proxy.close()
        cp.stop()


def test_back_before_the_control_plane_noticed_the_drop_the_run_goes_on(tmp_path):
    """The agent's side of the connection is reset while the control plane's side stays open
    and silent (a laptop that changed networks): the agent reconnects at once, long before the
    control plane's heartbeat watchdog (3 heartbeats of 5 s) gives up on the old connection.
    Its new connection replaces the old one; the run is never even `disconnected`."""
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "5",
                                         "CODEFYUI_WORKER_RESUME_GRACE_S": "30"})
    install_ticker(cp.data_dir)
    cp.start()
    proxy = TcpProxy(cp.port)
    try:
        run_id = cp.submit(ticker_graph(ticks=30, interval=0.1), POOL_CPU)["id"]
        install_ticker(tmp_path / "agent-w1-data")
        a = one_shot(tmp_path, proxy.url, tok=token(cp))
        wait_for(lambda: len(_ticks(cp, run_id)) >= 3, 180, 0.1, "three ticks", detail=lambda: a.log_tail(20))
        proxy.sever()
        assert exit_code(a) == 0, a.log_tail(40)
        assert wait_run(cp, run_id)["status"] == "succeeded"
        assert _ticks(cp, run_id) == list(range(1, 31))
        assert [e["data"]["kind"] for e in cp.events(run_id) if e["kind"] == "run_warning"] == []
        assert "replacing that one" in cp.log_text()
    finally:
        proxy.close()
        cp.stop()


def test_an_unacknowledged_result_stays_in_the_spool_and_the_next_agent_delivers_it(tmp_path):
    cp = _server(tmp_path, "3")
    proxy = TcpProxy(cp.port)
    try:
        first = cp.submit(ticker_graph(ticks=30, interval=0.1), POOL_CPU)["id"]
        install_ticker(tmp_path / "agent-w1-data")
        a = one_shot(tmp_path, proxy.url, tok=token(cp))
        wait_for(lambda: len(_ticks(cp, first)) >= 3, 180, 0.1, "three ticks", detail=lambda: a.log_tail(20))
        proxy.cut()  # and it stays cut past the grace after the run's end
        assert exit_code(a) == 1, a.log_tail(40)
        spool = spool_dir(tmp_path / "agent-w1", first)
        assert (spool / "events.jsonl").is_file()
        assert "its end was not acknowledged" in a.log_text()
        r = wait_run(cp, first)
        assert r["status"] == "interrupted" and r["late_result"] is None
        proxy.restore()
        second = cp.submit(ticker_graph(ticks=2, interval=0.1), POOL_CPU)["id"]
        b = one_shot(tmp_path, proxy.url, label="w1-next")
        assert exit_code(b) == 0, b.log_tail(40)
        assert wait_run(cp, second)["status"] == "succeeded"
        late = cp.run(first)["late_result"]
        assert (late["status"], late["worker_id"]) == ("succeeded", "w1")
        assert not spool.exists()
    finally:
        proxy.close()
        cp.stop()

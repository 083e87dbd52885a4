"""The agent's spool in a user data folder that several agents share: one spool per control
plane, held by one agent at a time, and an older agent's runs moved in only when their owner
is certain. Files and locks only: no process, no server."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from cdui.agent.agent import Agent, credential_key
from cdui.agent.spool import RunSpool, SpoolLock, live_run_ids
from cdui.core.config import load
from cdui.core.errors import CduiError

CP1, CP2 = "http://cp-3f9a12c4.invalid:18000", "http://cp-77aa01be.invalid:18000"


def _spool_a_running_run(root: Path, run_id: str) -> RunSpool:
    """What an agent leaves in its spool while its run runs: the start state and a few events."""
    sp = RunSpool(root, run_id)
    sp.write_state({"run_id": run_id, "finished": False})
    sp.append([{"src_seq": i, "kind": "progress", "at": 0.0, "data": {"tick": i}} for i in (1, 2, 3)])
    return sp


def _agent(user_data: Path, control: str, name: str) -> Agent:
    cfg = load({"CODEFYUI_USER_DATA_DIR": str(user_data), "CODEFYUI_RUN_WARM_SPARE": "0"})
    return Agent(control, "cred", name, ["cpu"], user_data, "m1", config=cfg)


def test_an_agent_reads_only_its_own_control_planes_spool(tmp_path: Path) -> None:
    """The second control plane's agent starting on the folder neither adopts nor ends the first's
    running run (it used to mark it interrupted, and drop it when its control plane did not know it)."""
    first = _spool_a_running_run(tmp_path / "spool" / credential_key(CP1), "r1")
    other = _agent(tmp_path, CP2, "w2")
    assert other.runs == {}
    assert other.spool_root == tmp_path / "spool" / "cp-77aa01be.invalid-18000"
    assert [json.loads(line)["src_seq"] for line in first.events_path.read_text().splitlines()] == [1, 2, 3]
    # The first control plane's own agent, restarted, does adopt it: its run died with it.
    again = _agent(tmp_path, CP1, "w1")
    assert list(again.runs) == ["r1"]
    assert again.runs["r1"].spool.unacked()[-1]["data"]["status"] == "interrupted"


def test_one_agent_per_control_plane_and_folder(tmp_path: Path) -> None:
    one = SpoolLock.take(tmp_path, credential_key(CP1), "worker w1 of " + CP1)
    two = SpoolLock.take(tmp_path, credential_key(CP2), "worker w2 of " + CP2)  # another control plane's: fine
    try:
        with pytest.raises(CduiError) as err:
            SpoolLock.take(tmp_path, credential_key(CP1), "worker w1 of " + CP1)
        assert err.value.code == "agent_running"
        assert err.value.message == (f"another agent (pid {os.getpid()}) already runs for worker w1 of {CP1} "
                                     f"from {tmp_path}")
        one.release()
        SpoolLock.take(tmp_path, credential_key(CP1), "worker w1 of " + CP1).release()  # free once released
    finally:
        one.release()
        two.release()


def test_an_older_agents_runs_move_in_only_when_the_folder_has_one_credential(tmp_path: Path, caplog) -> None:
    """Before spools were per control plane, runs lay right under spool/. Whose they are is certain
    only when the folder holds a single credential."""
    _spool_a_running_run(tmp_path / "spool", "old1")
    with caplog.at_level(logging.WARNING, "cdui.agent.agent"):
        held = SpoolLock.take(tmp_path, credential_key(CP1), "w1", sole_credential=False)
    held.release()
    assert (tmp_path / "spool" / "old1" / "events.jsonl").is_file()
    assert "left where they are" in caplog.text
    held = SpoolLock.take(tmp_path, credential_key(CP1), "w1", sole_credential=True)
    held.release()
    assert not (tmp_path / "spool" / "old1").exists()
    assert (held.root / "old1" / "events.jsonl").is_file()


def test_live_runs_are_those_of_every_spool(tmp_path: Path) -> None:
    """An agent pruning old run folders keeps every run any agent of the folder still spools."""
    _spool_a_running_run(tmp_path / "spool" / credential_key(CP1), "r1")
    _spool_a_running_run(tmp_path / "spool" / credential_key(CP2), "r2")
    _spool_a_running_run(tmp_path / "spool", "old1")
    SpoolLock.take(tmp_path, credential_key(CP1), "w1").release()  # its lock file is no run
    assert live_run_ids(tmp_path) == {"r1", "r2", "old1"}

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
from cdui.wire import protocol

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


def test_the_holders_pid_is_named_even_when_it_is_written_just_after_the_lock(tmp_path: Path, monkeypatch) -> None:
    # An agent takes the lock, then writes its pid: one started in that moment found the file empty
    # (or holding a dead agent's pid) and named no pid. It now reads again until the pid shows (for 2 s;
    # here for a minute, so that a loaded machine cannot make the test fail: it ends when the pid shows).
    import fcntl
    import threading

    from cdui.agent import spool
    monkeypatch.setattr(spool, "HOLDER_PID_WAIT_S", 60.0)

    base = tmp_path / "spool"
    base.mkdir()
    path = base / f"{credential_key(CP1)}.lock"
    path.write_text("999999999\n")  # a dead agent's pid: never named
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write_pid() -> None:
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.ftruncate(fd, len(f"{os.getpid()}\n"))

    timer = threading.Timer(0.3, write_pid)
    timer.start()
    try:
        with pytest.raises(CduiError) as err:
            SpoolLock.take(tmp_path, credential_key(CP1), "worker w1 of " + CP1)
        assert err.value.message == (f"another agent (pid {os.getpid()}) already runs for worker w1 of {CP1} "
                                     f"from {tmp_path}")
    finally:
        timer.join()
        os.close(fd)


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


def test_the_spools_lines_are_the_messages_events(tmp_path: Path) -> None:
    """An event is encoded once: the line the spool writes is what the events message carries, strict
    JSON (a NaN or infinity as a string, a key that is not a string as one), and a restarted agent
    reads back what was written."""
    sp = RunSpool(tmp_path, "r1")
    events = [{"src_seq": 1, "kind": "log", "at": 1.7e9, "data": {"message": "é ok", "level": "info"}},
              {"src_seq": 2, "kind": "metric", "at": 1.7e9, "data": {"loss": float("nan"), "top": float("inf")}},
              {"src_seq": 3, "kind": "progress", "at": None, "data": {1: "one", "path": Path("/x")}}]
    lines = sp.append([dict(e) for e in events])
    assert sp.append([]) == []
    assert sp.events_path.read_text(encoding="utf-8").splitlines() == lines
    strict = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not strict JSON")) for line in lines]
    assert strict[0] == events[0]
    assert strict[1]["data"] == {"loss": "nan", "top": "inf"}
    assert strict[2]["data"] == {"1": "one", "path": "/x"}
    assert protocol.encode_events("r1", events, encoded=lines) == protocol.encode_events("r1", events)
    msg = protocol.parse_agent_message(protocol.encode_events("r1", events, encoded=lines)[0])
    assert isinstance(msg, protocol.Events) and msg.events == strict
    again = RunSpool(tmp_path, "r1")
    assert again.last_seq == 3 and again.unacked() == strict


def test_the_acked_file_is_written_every_so_many_events_and_once_all_are_acknowledged(tmp_path: Path) -> None:
    """A flood's acknowledgements do not each replace the ``acked`` file: it is written once
    ACK_FILE_EVERY more events are acknowledged, and when everything is. A restart in between reads
    the older mark and sends again what followed it (the control plane stores each src_seq once)."""
    from cdui.agent import spool
    sp = RunSpool(tmp_path, "r1")
    n = spool.ACK_FILE_EVERY + 10
    sp.append([{"src_seq": i, "kind": "log", "at": 1.7e9, "data": {"message": f"event {i}"}} for i in range(1, n + 1)])
    acked_file = sp.dir / "acked"
    sp.ack(5)
    assert sp.acked == 5 and sp.unacked()[0]["src_seq"] == 6 and not acked_file.exists()
    assert RunSpool(tmp_path, "r1").unacked()[0]["src_seq"] == 1  # the file still says nothing is acknowledged
    sp.ack(spool.ACK_FILE_EVERY)
    assert acked_file.read_text() == str(spool.ACK_FILE_EVERY)
    sp.ack(spool.ACK_FILE_EVERY + 3)
    assert acked_file.read_text() == str(spool.ACK_FILE_EVERY)
    again = RunSpool(tmp_path, "r1")
    assert again.acked == spool.ACK_FILE_EVERY and [e["src_seq"] for e in again.unacked()] == list(
        range(spool.ACK_FILE_EVERY + 1, n + 1))
    sp.ack(n)
    assert acked_file.read_text() == str(n) and sp.unacked() == []
    assert RunSpool(tmp_path, "r1").unacked() == []


def test_a_batch_too_big_for_one_message_is_split_alike_whether_or_not_its_lines_are_given(tmp_path: Path) -> None:
    """The spool's lines sent as is make the same messages as encoding the events: one message when the
    batch fits, split by size and by count (MAX_EVENTS) when it does not."""
    sp = RunSpool(tmp_path, "r1")
    events = [{"src_seq": i, "kind": "log", "at": 1.7e9, "data": {"message": f"événement {i}" * 3}}
              for i in range(1, protocol.MAX_EVENTS + 2)]
    lines = sp.append([dict(e) for e in events])
    # (events, byte limit, how many messages): fits; split by size (about 100 bytes an event, 4,000 a
    # message); split by count
    for batch, limit, count in ((100, protocol.MAX_MESSAGE, 1), (100, 4000, 4),
                                (protocol.MAX_EVENTS + 1, protocol.MAX_MESSAGE, 2)):
        made = protocol.encode_events("r1", events[:batch], limit=limit, encoded=lines[:batch])
        assert made == protocol.encode_events("r1", events[:batch], limit=limit)
        assert len(made) == count and all(len(m.encode()) <= limit for m in made)
        got = [e["src_seq"] for m in made for e in json.loads(m)["events"]]
        assert got == list(range(1, batch + 1))


def test_a_run_s_events_file_stays_open_while_it_spools_and_is_closed_when_it_goes(tmp_path: Path) -> None:
    """The spool appends every batch to one open file (an open per batch cost the agent more than the write):
    one descriptor per spooling run, each batch durable and read back in order, and none left once the
    run's spool is removed or let go."""
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    sp = RunSpool(tmp_path, "r1")
    for i in range(1, 51):
        sp.append([{"src_seq": i, "kind": "progress", "at": 0.0, "data": {"tick": i}}])
    sp.append_lines(protocol.Lines("r1", 51, b'{"kind": "log", "data": {"message": "a"}}\n{"kind": "x"}', 2))
    assert open_fds() == before + 1
    again = RunSpool(tmp_path, "r1")  # what an agent that restarted reads
    assert again.last_seq == 52 and len(again.unacked()) == 51 and again.unacked_events() == 52
    sp.remove()
    assert open_fds() == before and not (tmp_path / "r1").exists()
    other = RunSpool(tmp_path, "r2")
    other.append([{"src_seq": 1, "kind": "progress", "at": 0.0, "data": {}}])
    assert open_fds() == before + 1
    del other
    assert open_fds() == before

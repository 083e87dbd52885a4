"""The one-shot rules as tables: the hello's one-shot fields, flags, queue deadlines, which
run --run-id may take, and the agent's exit code for each way its run can end."""
from __future__ import annotations

import json

import pytest

from cdui import __version__
from cdui.agent.oneshot_agent import OneShot
from cdui.plane.oneshot import flag_problem, queue_deadline, run_id_problem
from cdui.plane.store import Run
from cdui.wire import protocol
from cdui.wire.target import AnyWorker, Local, Pool, Worker


def _hello(**fields) -> protocol.Hello:
    obj = protocol.hello(__version__, "w1", ["cpu"], {}, "m", [], fields.pop("one_shot", True),
                         fields.pop("instance", None))
    obj.update(fields)
    msg = protocol.parse_agent_message(json.dumps(obj))
    assert isinstance(msg, protocol.Hello)
    return msg


def test_the_hello_carries_run_id_and_bounds_it():
    assert _hello(run_id="abc123").run_id == "abc123"
    with pytest.raises(protocol.ProtocolError, match="hello.run_id"):
        _hello(run_id="x" * (protocol.MAX_NAME + 1))
    with pytest.raises(protocol.ProtocolError, match="run_id"):
        _hello(run_id=5)


@pytest.mark.parametrize("fields, problem", [
    ({}, None),
    ({"instance": "4242-0"}, None),
    ({"one_shot": False, "instance": "1"}, "--instance is only for one-shot agents"),
    ({"one_shot": False, "run_id": "r"}, "--run-id is only for one-shot agents"),
    ({"instance": "a.b"}, "is not valid"),
    ({"instance": "../x"}, "is not valid"),
])
def test_flags(fields, problem):
    got = flag_problem(_hello(**fields))
    assert (got is None) if problem is None else (problem in (got or ""))


POOL = Pool()


@pytest.mark.parametrize("target, since, instance, timeout, expected", [
    (POOL, None, False, 100, 1100),
    (POOL, None, False, 0, None),                 # 0 waits forever
    (Worker("w1"), None, False, 100, None),   # an ordinary worker: waits for it as long as it takes
    (Worker("w1"), 1050, False, 100, 1150),   # its last agent was one-shot, known since 1050 (a restart)
    (Worker("w1"), 900, False, 100, 1100),
    (Worker("slurm.7-0"), None, True, 100, 1100),
    (AnyWorker(), None, False, 100, None),
    (Local(), None, False, 100, None),
])
def test_queue_deadline(target, since, instance, timeout, expected):
    assert queue_deadline(target, 1000.0, timeout, since, instance) == expected


def _run(status, target, worker=None, device="cpu") -> Run:
    return Run(id="r1", name=None, status=status, target=target, options={"device": device}, graph=None,
               created_at=0.0, worker_id=worker)


@pytest.mark.parametrize("run, held, problem", [
    (None, set(), "no run with that id"),
    (_run("queued", POOL), set(), None),
    (_run("queued", POOL, device="cuda"), set(), "which this agent does not offer"),
    (_run("queued", Worker("w1")), set(), None),
    (_run("queued", Worker("w2")), set(), "not for the one-shot pool or worker w1"),
    (_run("queued", AnyWorker()), set(), "not for the one-shot pool"),
    (_run("running", POOL, "w2"), set(), "it is running on worker w2"),
    (_run("running", POOL, "w1"), set(), None),          # its own, on a reconnect
    (_run("interrupted", POOL, "w1"), {"r1"}, None),     # ended meanwhile; it still delivers its result
    (_run("succeeded", POOL, "w1"), set(), "it is succeeded"),
])
def test_which_run_run_id_may_take(run, held, problem):
    got = run_id_problem(run, "w1", ["cpu"], held)
    assert (got is None) if problem is None else (problem in (got or ""))


@pytest.mark.parametrize("events, expected", [
    ([], 3),                                  # stopped before a run arrived
    (["take", "succeeded", "acked"], 0),
    (["take", "failed", "acked"], 1),
    (["take", "cancelled", "acked"], 1),
    (["take", "signal", "cancelled", "acked"], 1),
    (["take", "refused"], 1),                 # refused after taking its run: not recorded
    (["refused"], 2),
])
def test_exit_codes(events, expected):
    o = OneShot()
    code = None
    for ev in events:
        if ev == "take":
            assert o.accept("r1") and not o.accept("r2")
        elif ev == "signal":
            code = o.on_signal()
        elif ev == "refused":
            code = o.on_refused()
        elif ev == "acked":
            code = o.on_delivered()
        else:
            o.final = ev
    if not events:
        code = o.on_signal()
    assert code == expected


def test_a_stop_by_the_batch_system_ends_the_run_interrupted():
    o = OneShot()
    o.accept("r1")
    o.on_signal()
    evs = [{"kind": "status", "data": {"status": "cancelled", "error": None}}, {"kind": "log", "data": {}}]
    o.final_event(evs)
    assert evs[0]["data"]["status"] == "interrupted"
    assert "batch job's time limit" in evs[0]["data"]["error"]

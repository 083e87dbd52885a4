"""A run's target, options and events, parsed once where they arrive: each accepted form and refusal, as tables."""
from __future__ import annotations

import json
from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.wire.event import Event
from cdui.wire.runopts import RunOptions, parse_run_options
from cdui.wire.target import AnyWorker, Local, Pool, Target, Worker, parse_target, target_json, worker_name

HINT = 'use "local", "any", {"worker": NAME} or {"pool": "one-shot"}'


@pytest.mark.parametrize("raw, target, stored", [
    (None, Local(), "local"),
    ("local", Local(), "local"),
    ("any", AnyWorker(), "any"),
    ("one-shot", Pool(), {"pool": "one-shot"}),
    ("gpu-box", Worker("gpu-box"), {"worker": "gpu-box"}),
    ("slurm.7-0", Worker("slurm.7-0"), {"worker": "slurm.7-0"}),   # an instance's name
    ({"worker": "w1"}, Worker("w1"), {"worker": "w1"}),
    ({"worker": "any"}, Worker("any"), {"worker": "any"}),          # a worker may be named like a keyword
    ({"pool": "one-shot"}, Pool(), {"pool": "one-shot"}),
    ({"worker": "w1", "pool": "one-shot"}, Worker("w1"), {"worker": "w1"}),  # the worker wins
    ({"worker": "", "pool": "one-shot"}, Pool(), {"pool": "one-shot"}),
    ({"worker": "w1", "extra": 1}, Worker("w1"), {"worker": "w1"}),  # other keys are ignored
])
def test_every_accepted_target_form(raw: object, target: Target, stored: object) -> None:
    """The target JSON forms (docs/remote-workers.md#sending-runs-to-workers), stored as they always were."""
    assert parse_target(raw) == target
    assert target_json(target) == stored
    assert parse_target(stored) == target  # what the database holds reads back as the same target


@pytest.mark.parametrize("raw, message", [
    ("", "target '' is not valid"),
    ({"worker": ""}, "target {'worker': ''} is not valid"),
    ({"worker": 3}, "target {'worker': 3} is not valid"),
    ({"pool": "other"}, "target {'pool': 'other'} is not valid"),
    ({"x": 1}, "target {'x': 1} is not valid"),
    ({}, "target {} is not valid"),
    (3, "target 3 is not valid"),
    (True, "target True is not valid"),
    (["w1"], "target ['w1'] is not valid"),
])
def test_every_refused_target(raw: object, message: str) -> None:
    with pytest.raises(CduiError) as err:
        parse_target(raw)
    assert (err.value.code, err.value.message, err.value.hint, err.value.status) == ("bad_target", message, HINT, 400)


@pytest.mark.parametrize("target, name", [
    (Local(), None), (AnyWorker(), None), (Pool(), None), (Worker("w1"), "w1"),
])
def test_worker_name(target: Target, name: str | None) -> None:
    assert worker_name(target) == name


@pytest.mark.parametrize("raw, options", [
    (None, RunOptions()),
    ({}, RunOptions(Local(), "auto", False, 1, None)),
    ({"target": None, "device": None}, RunOptions()),
    ({"device": ""}, RunOptions()),
    ({"target": "any", "device": "cuda:1"}, RunOptions(AnyWorker(), "cuda:1")),
    ({"target": {"worker": "w1"}, "device": "mps", "record_outputs": True}, RunOptions(Worker("w1"), "mps", True)),
    ({"target": "one-shot", "device": "cuda"}, RunOptions(Pool(), "cuda")),
    ({"device": "cuda", "devices": 2}, RunOptions(Local(), "cuda", devices=2)),
    ({"device": "cpu", "devices": 1}, RunOptions(Local(), "cpu")),               # a set of one is one device
    ({"device": "cuda:0", "devices": 1}, RunOptions(Local(), "cuda:0")),
    ({"memory_mb": 2048}, RunOptions(memory_mb=2048)),
    ({"target": "one-shot", "memory_mb": 512}, RunOptions(Pool(), memory_mb=512)),
    ({"unknown": 1, "files": "x"}, RunOptions()),                                # other keys are ignored
])
def test_run_options_accepted(raw: Any, options: RunOptions) -> None:
    assert parse_run_options(raw) == options


@pytest.mark.parametrize("raw, code, message", [
    ([], "bad_options", "options must be an object, got list"),
    ("local", "bad_options", "options must be an object, got str"),
    ({"target": 3}, "bad_target", "target 3 is not valid"),
    ({"device": "cuda:-1"}, "bad_device", "device 'cuda:-1' is not valid"),
    ({"device": "cpu:x"}, "bad_device", "device 'cpu:x' is not valid"),
    ({"device": "cuda:1000"}, "bad_device", "device 'cuda:1000' is not valid"),
    ({"device": 3}, "bad_device", "device 3 is not valid"),
    ({"record_outputs": "yes"}, "bad_options", "record_outputs='yes' is not true or false"),
    ({"record_outputs": None}, "bad_options", "record_outputs=None is not true or false"),
    ({"devices": 0}, "bad_devices", "devices 0 is not valid: it must be a whole number from 1 to 64"),
    ({"devices": True}, "bad_devices", "devices True is not valid: it must be a whole number from 1 to 64"),
    ({"memory_mb": 0}, "bad_memory_mb", "memory_mb 0 is not valid: it must be a whole number from 1 to 16777216"),
    ({"device": "cuda:0", "devices": 2}, "bad_devices", "a set of 2 devices cannot be on the one device 'cuda:0'"),
    ({"target": "one-shot", "devices": 2}, "bad_devices", "device sets are not offered to the one-shot pool"),
    # The first bad option is the one named, in the order target, device, record_outputs, devices, memory_mb.
    ({"target": 3, "device": "x"}, "bad_target", "target 3 is not valid"),
    ({"device": "x", "record_outputs": 1}, "bad_device", "device 'x' is not valid"),
    ({"record_outputs": 1, "devices": 0}, "bad_options", "record_outputs=1 is not true or false"),
    ({"devices": 0, "memory_mb": 0}, "bad_devices", "devices 0 is not valid: it must be a whole number from 1 to 64"),
    ({"memory_mb": 0, "device": "cuda:0", "devices": 2}, "bad_memory_mb",
     "memory_mb 0 is not valid: it must be a whole number from 1 to 16777216"),
])
def test_run_options_refused(raw: Any, code: str, message: str) -> None:
    with pytest.raises(CduiError) as err:
        parse_run_options(raw)
    assert (err.value.code, err.value.message) == (code, message)


def test_stored_options_are_key_for_key_as_before() -> None:
    """The run's options column: the same keys in the same order as every earlier version wrote them."""
    plain = parse_run_options({"target": {"worker": "w1"}})
    assert json.dumps(plain.stored({"uses": False}, False, 500)) == (
        '{"target": {"worker": "w1"}, "device": "auto", "record_outputs": false, "files": {"uses": false}, '
        '"has_secrets": false, "graph_max_nodes": 500}')
    a_set = parse_run_options({"device": "cuda", "devices": 2, "memory_mb": 100, "record_outputs": True})
    assert json.dumps(a_set.stored({}, True, 9)) == (
        '{"target": "local", "device": "cuda", "record_outputs": true, "files": {}, "has_secrets": true, '
        '"graph_max_nodes": 9, "devices": 2, "memory_mb": 100}')


@pytest.mark.parametrize("wire, event, back", [
    # A recorder's event (a local run's, or an agent's): numbered at its source.
    ({"src_seq": 3, "kind": "log", "data": {"message": "hi"}, "at": 1.7e9}, Event("log", {"message": "hi"}, 1.7e9, 3),
     {"kind": "log", "data": {"message": "hi"}, "at": 1.7e9, "src_seq": 3}),
    # No data and no time: stored as {} and at the time it is stored, as before.
    ({"src_seq": 1, "kind": "status"}, Event("status", {}, None, 1), {"kind": "status", "data": {}, "at": None,
                                                                      "src_seq": 1}),
    ({"src_seq": 1, "kind": "status", "data": None}, Event("status", {}, None, 1),
     {"kind": "status", "data": {}, "at": None, "src_seq": 1}),
    # Born on the control plane: the store numbers it.
    ({"kind": "run_warning", "data": {"kind": "requeued"}, "at": 5.0}, Event("run_warning", {"kind": "requeued"}, 5.0),
     {"kind": "run_warning", "data": {"kind": "requeued"}, "at": 5.0}),
])
def test_an_event_reads_and_writes_the_recorders_object(wire: dict[str, Any], event: Event,
                                                        back: dict[str, Any]) -> None:
    assert Event.from_wire(wire) == event
    assert event.to_wire() == back

"""The pure parts of device sets and share by memory, as tables."""
from __future__ import annotations

from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.plane.dispatch import lane_of
from cdui.plane.http.share_memory import updated
from cdui.plane.sched import device_fit as fit
from cdui.plane.sched.queue import parse_caps
from cdui.plane.store import Run
from cdui.run.runner import run_env
from cdui.wire import devicesets as ds
from cdui.wire.protocol import ProtocolError, parse_memory_report
from cdui.wire.target import AnyWorker


class Ex:
    def __init__(self, name: str, devices: list[str]) -> None:
        self.name = name
        self._devices = devices

    def devices(self) -> list[str]:
        return list(self._devices)


CARDS = Ex("w1", ["cuda:0", "cuda:1", "cuda:2", "cpu"])


@pytest.mark.parametrize(("wanted", "count", "used", "caps", "expected"), [
    ("cuda", 2, {}, "", "cuda:0,cuda:1"),
    ("cuda", 2, {("w1", "cuda:0"): 1}, "", "cuda:1,cuda:2"),
    ("cuda", 3, {("w1", "cuda:1"): 1}, "", None),
    ("cuda", 2, {("w1", "cuda:0"): 1}, "cuda=2", "cuda:0,cuda:1"),  # a card with a second slot still counts once
    ("auto", 2, {}, "", "cuda:0,cuda:1"),
    ("auto", 4, {}, "cpu=4", "cpu,cpu,cpu,cpu"),  # three cards are too few: the CPU's four slots
    ("cpu", 2, {}, "", None),                       # one slot by default
    ("cpu", 2, {}, "w1/cpu=2", "cpu,cpu"),
    ("cpu", 2, {("w1", "cpu"): 1}, "w1/cpu=2", None),
    ("cuda", 1, {("w1", "cuda:0"): 1}, "", "cuda:1"),
])
def test_choose_a_set(wanted: str, count: int, used: dict[Any, int], caps: str, expected: str | None) -> None:
    assert fit.choose(CARDS, wanted, used, parse_caps(caps), fit.Ask(count)) == expected


def test_shared_card_admits_by_memory_and_each_member_needs_it() -> None:
    cap = {("w1", "cuda:0"): 4000, ("w1", "cuda:1"): 4000}
    ask = fit.Ask(1, 1500, cap, {("w1", "cuda:0"): 3000})
    # Slots are full on cuda:0 but it is shared: 3000 + 1500 > 4000, so cuda:1.
    assert fit.choose(CARDS, "cuda", {("w1", "cuda:0"): 5}, parse_caps(""), ask) == "cuda:1"
    ask = fit.Ask(2, 2000, cap, {("w1", "cuda:0"): 2000, ("w1", "cuda:1"): 2000})
    assert fit.choose(CARDS, "cuda", {}, parse_caps(""), ask) == "cuda:0,cuda:1"
    two = Ex("w1", ["cuda:0", "cuda:1"])
    assert fit.choose(two, "cuda", {}, parse_caps(""), fit.Ask(2, 2001, cap, {("w1", "cuda:0"): 2000})) is None
    # cuda:2 is not shared: its one free slot makes the set with cuda:1.
    assert fit.choose(CARDS, "cuda", {}, parse_caps(""), fit.Ask(2, 2001, cap, {("w1", "cuda:0"): 2000})) == (
        "cuda:1,cuda:2")
    # A shared device whose worker reported no memory admits nothing.
    assert fit.choose(Ex("w1", ["cuda:0"]), "cuda", {}, parse_caps(""), fit.Ask(1, 1, {("w1", "cuda:0"): None})) is None


def test_slots_used_counts_each_member() -> None:
    used = ds.slots_used([("w1", "cuda:0,cuda:1"), ("w1", "cuda:1"), ("local", "cpu,cpu")])
    assert used == {("w1", "cuda:0"): 1, ("w1", "cuda:1"): 2, ("local", "cpu"): 2}


@pytest.mark.parametrize(("slot", "inherited", "device", "visible"), [
    ("cuda:0,cuda:1", None, "cuda:0", "0,1"),
    ("cuda:1,cuda:2", "4,6,7", "cuda:0", "6,7"),
    ("cuda:2,cuda:0", "GPU-a,GPU-b,GPU-c", "cuda:0", "GPU-c,GPU-a"),
    ("cpu,cpu", "4,6", "cpu", None),
])
def test_a_set_narrows_cuda_visible_devices_to_its_cards(slot: str, inherited: str | None, device: str,
                                                        visible: str | None) -> None:
    base = {} if inherited is None else {"CUDA_VISIBLE_DEVICES": inherited}
    env, dev = run_env(slot, base)
    assert (dev, env.get("CUDA_VISIBLE_DEVICES")) == (device, visible if visible is not None else inherited)


def test_a_set_naming_a_card_that_is_not_there_fails() -> None:
    with pytest.raises(CduiError, match="names card 2"):
        run_env("cuda:0,cuda:2", {"CUDA_VISIBLE_DEVICES": "4,6"})


@pytest.mark.parametrize(("options", "stored"), [
    ({}, {}),
    ({"devices": 1}, {}),
    ({"devices": 2}, {"devices": 2}),
    ({"devices": 2, "memory_mb": 512}, {"devices": 2, "memory_mb": 512}),
    ({"memory_mb": 100}, {"memory_mb": 100}),
])
def test_submit_options(options: dict[str, Any], stored: dict[str, Any]) -> None:
    assert ds.submit_options(options, "cuda", pool=False) == stored


@pytest.mark.parametrize(("options", "device", "pool", "code"), [
    ({"devices": 0}, "cuda", False, "bad_devices"),
    ({"devices": 65}, "cuda", False, "bad_devices"),
    ({"devices": "2"}, "cuda", False, "bad_devices"),
    ({"devices": 2.0}, "cuda", False, "bad_devices"),
    ({"devices": 2}, "cuda:0", False, "bad_devices"),
    ({"devices": 2}, "cuda", True, "bad_devices"),
    ({"memory_mb": 0}, "cuda", False, "bad_memory_mb"),
    ({"memory_mb": True}, "cuda", False, "bad_memory_mb"),
])
def test_submit_options_refused(options: dict[str, Any], device: str, pool: bool, code: str) -> None:
    with pytest.raises(CduiError) as err:
        ds.submit_options(options, device, pool)
    assert err.value.code == code


def test_a_plain_runs_lane_key_is_unchanged() -> None:
    run = Run(id="r", name=None, status="queued", target=AnyWorker(), options={"device": "cuda"}, created_at=0.0)
    assert lane_of(run) == '["any", "cuda", "none"]'
    assert lane_of(Run(id="r", name=None, status="queued", target=AnyWorker(), created_at=0.0,
                       options={"device": "cuda", "devices": 2})) == '["any", "cuda", "none", {"devices": 2}]'


def test_memory_report_is_bounded() -> None:
    ok = {"cuda:0": {"total_mb": 81920, "free_mb": 80000}}
    assert parse_memory_report(ok) == ok
    assert parse_memory_report(None) is None
    for bad in ([1], {"cuda:0": {"total_mb": -1, "free_mb": 0}}, {"cuda:0": {"total_mb": 1.5, "free_mb": 0}},
                {"x" * 200: {"total_mb": 1, "free_mb": 1}}, {f"d{i}": {"total_mb": 1, "free_mb": 1} for i in range(65)},
                {"cuda:0": {"total_mb": ds.MAX_MEMORY_MB + 1, "free_mb": 0}}, {"cuda:0": "big"}):
        with pytest.raises(ProtocolError):
            parse_memory_report(bad)


def test_system_memory_from_meminfo() -> None:
    text = "MemTotal:       16384000 kB\nMemFree:         1024000 kB\nMemAvailable:    8192000 kB\n"
    assert ds.system_memory(text) == {"total_mb": 16000, "free_mb": 8000}
    assert ds.system_memory("nothing") is None


def test_share_setting_updates() -> None:
    assert updated(None, True, None) == frozenset({"*"})
    assert updated(frozenset({"*"}), False, None) is None
    assert updated(None, True, "cuda:0") == frozenset({"cuda:0"})
    assert updated(frozenset({"cuda:0", "cuda:1"}), False, "cuda:0") == frozenset({"cuda:1"})
    assert updated(frozenset({"cuda:0"}), False, "cuda:0") is None
    with pytest.raises(CduiError, match="cannot be turned off"):
        updated(frozenset({"*"}), False, "cuda:0")


def test_ddp_world_size_comes_from_the_set() -> None:
    from cdui.nodes.builtin._ddp import world_devices
    assert world_devices(0, "cpu", ["cpu", "cpu"]) == ["cpu", "cpu"]
    assert world_devices(0, "cpu", ["cpu"]) == ["cpu"]
    assert world_devices(3, "cpu", ["cpu", "cpu"]) == ["cpu", "cpu", "cpu"]  # an explicit count wins
    assert ds.process_devices("cuda:3,cuda:5", "cuda:0") == ["cuda:0", "cuda:1"]
    assert ds.process_devices("cpu,cpu", "cpu") == ["cpu", "cpu"]
    assert ds.process_devices("cuda:3", "cuda:0") == ["cuda:0"]

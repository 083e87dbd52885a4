"""GPU runs use the card they were placed on (CONN device slots, SLURM/docker).

The mapping of a slot to ``CUDA_VISIBLE_DEVICES`` is a pure function, tested
as a table. The run subprocess's own view is tested with a real subprocess
started through :func:`cdui.run.runner.launch` under a fake inherited device list:
a custom node reports the environment and the device it was told, so the
check needs no CUDA on the machine running the tests."""
from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.core.layout import Layout
from cdui.run import runner
from cdui.wire.job import Job
from procs import graph, node, trig

UUID_A = "GPU-8f1c2a4e-1111-2222-3333-444455556666"
MIG_B = "MIG-5c0e8d6a-aaaa-bbbb-cccc-ddddeeeeffff"


@pytest.mark.parametrize("slot, inherited, device, visible", [
    ("cpu", None, "cpu", None),            # CPU runs leave the environment alone
    ("cpu", "2,3", "cpu", None),
    ("mps", None, "mps", None),
    ("cuda:0", None, "cuda:0", "0"),       # nothing inherited: the slot number is the physical card
    ("cuda:1", None, "cuda:0", "1"),
    ("cuda", None, "cuda:0", "0"),
    ("cuda:0", "2,3", "cuda:0", "2"),      # slot N is the N-th inherited entry
    ("cuda:1", "2,3", "cuda:0", "3"),
    ("cuda:1", " 2 , 3 ", "cuda:0", "3"),
    ("cuda:1", f"{UUID_A},{MIG_B}", "cuda:0", MIG_B),  # UUIDs and MIG ids pass through as written
    ("cuda:0", UUID_A, "cuda:0", UUID_A),
])
def test_map_slot_device(slot: str, inherited: str | None, device: str, visible: str | None) -> None:
    assert runner.map_slot_device(slot, inherited) == (device, visible)


@pytest.mark.parametrize("slot, inherited, shown", [
    ("cuda:0", "", "no card"),                 # an empty list hides every card
    ("cuda:0", "-1", "no card"),               # CUDA stops reading at the first invalid entry
    ("cuda:1", "4,-1,5", "1 card(s): 4"),
    ("cuda:2", "2,3", "2 card(s): 2, 3"),
])
def test_map_slot_device_refuses_a_card_that_is_not_visible(slot: str, inherited: str, shown: str) -> None:
    with pytest.raises(CduiError) as info:
        runner.map_slot_device(slot, inherited)
    err = info.value
    assert err.code == "device_not_visible"
    assert err.message == (f"run slot {slot!r} names card {int(slot.split(':')[1])}, but "
                           f"CUDA_VISIBLE_DEVICES={inherited!r} leaves this process {shown}")
    assert "--devices" in (err.hint or "")


def test_map_slot_device_refuses_a_malformed_slot() -> None:
    with pytest.raises(CduiError) as info:
        runner.map_slot_device("cuda:x", None)
    assert info.value.code == "bad_device" and "'cuda:x'" in info.value.message


def test_run_env_narrows_the_inherited_list_and_keeps_the_rest() -> None:
    base = {"CUDA_VISIBLE_DEVICES": "5,7", "PATH": "/usr/bin", "CODEFYUI_AGENT_TOKEN": "t"}
    env, device = runner.run_env("cuda:1", base)
    assert device == "cuda:0"
    assert env == {"CUDA_VISIBLE_DEVICES": "7", "PATH": "/usr/bin", "PYTHONUNBUFFERED": "1"}
    assert base["CUDA_VISIBLE_DEVICES"] == "5,7"  # the caller's environment is not changed


REPORTER = textwrap.dedent('''
    """Reports what the run process was given, as one log line of JSON."""
    import json
    import os

    from cdui.nodes.base import Node


    class ReportDeviceNode(Node):
        NODE_NAME = "TestReportDevice"

        def execute(self, inputs, params, ctx):
            ctx.log("device-report " + json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                   "device": ctx.device}))
            return {}
''')


def launch_and_collect(tmp_path: Path, slot: str) -> list[dict[str, Any]]:
    """Run the reporter graph on ``slot`` through the real launcher; return its events."""
    custom = tmp_path / "custom_nodes"
    custom.mkdir(exist_ok=True)
    (custom / "report.py").write_text(REPORTER)
    job = Job(run_id="run-dev", graph=graph([node("start", "Start"), node("r", "TestReportDevice")],
                                            [trig("start", "r")]),
              slot_device=slot, layout=Layout.for_data_dir(tmp_path).to_json(), custom_nodes_dir=str(custom))
    events: list[dict[str, Any]] = []

    async def sink(batch: list[dict[str, Any]]) -> None:
        events.extend(batch)

    async def main() -> None:
        handle = await runner.launch(job, sink, tmp_path / "run.log")
        await asyncio.wait_for(handle.wait(), 120)
    asyncio.run(main())
    return events


@pytest.mark.e2e  # starts a run subprocess
def test_run_subprocess_gets_the_inherited_card_as_cuda0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slot cuda:1 under an inherited 5,7 is physical card 7: the run process sees
    only that card and is told cuda:0; the events still name the slot."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    events = launch_and_collect(tmp_path, "cuda:1")
    statuses = [e["data"] for e in events if e["kind"] == "status"]
    assert statuses[-1] == {"status": "succeeded", "error": None}, events
    assert statuses[0]["status"] == "running" and statuses[0]["device"] == "cuda:1"
    reports = [json.loads(e["data"]["message"].split(" ", 1)[1]) for e in events
               if e["kind"] == "log" and e["data"]["message"].startswith("device-report ")]
    assert reports == [{"visible": "7", "device": "cuda:0"}]
    logs = [e["data"]["message"] for e in events if e["kind"] == "log"]
    assert "running 2 nodes on cuda:1 (cuda:0 in the run's process)" in logs


def test_run_on_a_card_that_is_not_visible_fails_with_the_reason(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    events = launch_and_collect(tmp_path, "cuda:1")
    assert [e["data"] for e in events if e["kind"] == "status"] == [{
        "status": "failed",
        "error": "run slot 'cuda:1' names card 1, but CUDA_VISIBLE_DEVICES='5' leaves this process 1 card(s): 5 "
                 "(offer only the cards this process can see (--devices), or start it with a "
                 "CUDA_VISIBLE_DEVICES that lists the card)"}]

"""A stop waits for a run's recorded-output writes, up to their timeout.

The launcher (cdui/run/runner.py) is real; the run process is a stand-in that
speaks the launcher's stdout protocol and takes seconds to write its
outputs after a stop, which a real run cannot be made to do on cue. A real
run sends the same ``outputs_writing`` line from cdui/run/outputs.py's
``recording`` when it leaves the executor.
"""
from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cdui.core.layout import Layout
from cdui.run import outputs, runner
from cdui.wire.job import Job
from procs import stand_in_python

STAND_IN = textwrap.dedent('''
    import json, sys, time
    def emit(kind, data):
        sys.stdout.write(json.dumps({"kind": kind, "data": data, "at": time.time()}) + "\\n")
        sys.stdout.flush()
    sys.stdin.readline()                # the job
    emit("log", {"message": "ready"})   # the test stops it only now: its start-up is not timed
    for line in sys.stdin:              # until the launcher says stop
        if line.strip() == "stop":
            break
    emit("outputs_writing", {})
    time.sleep(8.0)                     # writing recorded outputs, longer than the stop grace
    emit("result", {"status": "cancelled", "error": "stopped on request"})
''')


def _final_after_stop(tmp_path: Path, options: dict[str, Any]) -> dict[str, Any]:
    job = Job(run_id="r1", graph={"nodes": [], "edges": []}, slot_device="cpu", options=options,
              layout=Layout.for_data_dir(tmp_path).to_json())

    async def main() -> dict[str, Any]:
        events: list[dict[str, Any]] = []

        async def sink(batch: list[dict[str, Any]]) -> None:
            events.extend(batch)
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])
        await handle.start(job, python=stand_in_python(tmp_path, STAND_IN))
        # The stop grace (3 s) is far longer than the stand-in takes to answer the stop on a busy machine
        # (it is reading stdin by then), and far shorter than its 8 s of writing.
        def ready() -> bool:
            return any(e["kind"] == "log" and e["data"].get("message") == "ready" for e in events)
        for _ in range(6000):
            if ready():
                break
            await asyncio.sleep(0.01)
        assert ready(), events
        handle.stop(3.0)
        final = await asyncio.wait_for(handle.wait(), 60)
        assert not any(e["kind"] == "outputs_writing" for e in events), "the launcher's own line was stored"
        return final
    return asyncio.run(main())


def test_a_stop_waits_for_recorded_outputs_being_written(tmp_path: Path) -> None:
    final = _final_after_stop(tmp_path, {"record_outputs": True, outputs.OPT_TIMEOUT: 30.0})
    assert (final["status"], final["error"]) == ("cancelled", "stopped on request")


def test_without_a_write_timeout_the_stop_grace_still_kills(tmp_path: Path) -> None:
    final = _final_after_stop(tmp_path, {})
    assert final["status"] == "interrupted"
    assert final["error"] == "the run did not stop within 3 s and was killed"


# -- a real run process that fails on its way out of a stop ------------------------------------
STOP_FAILS = '''
import time
from cdui.nodes.base import Node, Port


class StopFails(Node):
    """Waits for a stop, then fails to write its interrupt checkpoint (as a run of a worker that may not
    write the control plane's folders did)."""
    NODE_NAME = "StopFails"
    CATEGORY = "test"

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        ctx.progress(tick=1)
        while not ctx.should_stop():
            time.sleep(0.05)
        raise PermissionError(13, "Permission denied", "data/models/iris/interrupt.pt")
'''


@pytest.mark.e2e
def test_a_run_that_fails_while_stopping_ends_cancelled(tmp_path: Path) -> None:
    """Stopped (Stop, a worker disabled mid-run, SIGTERM), a run whose node then fails on its way out
    ends ``cancelled``, as the stop asked; the failure stays in its error. A real run process."""
    nodes = tmp_path / "custom_nodes"
    nodes.mkdir()
    (nodes / "stop_fails.py").write_text(STOP_FAILS)
    g = {"format_version": 1, "name": "stop fails", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "n", "type": "StopFails", "position": {"x": 0, "y": 0}, "data": {"params": {}}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "n", "targetHandle": None,
                   "type": "trigger"}]}
    job = Job(run_id="r2", graph=g, slot_device="cpu", options={}, custom_nodes_dir=str(nodes),
              layout=Layout.for_data_dir(tmp_path / "data").to_json())

    async def main() -> dict[str, Any]:
        running = asyncio.Event()

        async def sink(batch: list[dict[str, Any]]) -> None:
            if any(e["kind"] == "progress" for e in batch):
                running.set()
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])
        await handle.start(job)
        await asyncio.wait_for(running.wait(), 120)
        handle.stop(30.0)
        return await asyncio.wait_for(handle.wait(), 120)
    final = asyncio.run(main())
    assert final["status"] == "cancelled", final
    assert final["error"] == ("stopped on request; while stopping: node 'n' (StopFails) failed: PermissionError: "
                              "[Errno 13] Permission denied: 'data/models/iris/interrupt.pt'"), final


# -- a run process that cannot be started -------------------------------------------------------
def test_a_run_whose_process_cannot_be_started_ends_failed_with_the_reason(tmp_path: Path) -> None:
    """An interpreter this user may not run (seen: an agent of another OS user under a 0700 home) ends the
    run `failed` saying why; before, the exception escaped the launcher and the run stayed `running`."""
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o644)  # not executable
    job = Job(run_id="r1", graph={"nodes": [], "edges": []}, slot_device="cpu", options={},
              layout=Layout.for_data_dir(tmp_path).to_json())

    async def main() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []

        async def sink(batch: list[dict[str, Any]]) -> None:
            events.extend(batch)
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])
        await handle.start(job, python=str(exe))
        return await asyncio.wait_for(handle.wait(), 60), events
    final, events = asyncio.run(main())
    assert final["status"] == "failed"
    assert final["error"].startswith("the run process could not be started: [Errno 13] Permission denied"), final
    assert [e["data"]["status"] for e in events if e["kind"] == "status"] == ["failed"]

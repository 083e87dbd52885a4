"""A run's finishing step sees every event the run recorded, however slowly the sink takes them.

The agent queues an ``artifact`` event's file for upload when the event goes through its sink, and
its finishing step (the last uploads, before the end is reported) must find every such file queued.
When the link is slow or cut, the sink is held in its send while the run process has already
ended; the launcher then waits for the sink before the finishing step. Before it did, a run that
ended during a cut finished its uploads first and its checkpoint, queued later, was never sent
(the fault suite's lost ``checkpoint.bin``, docs/fault-injection.md).

The launcher (cdui/run/runner.py) is real; the run process is a stand-in that speaks its stdout
protocol: one artifact event, then its result, then it exits.
"""
from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

from cdui.core.layout import Layout
from cdui.run import runner
from cdui.wire.job import Job
from procs import stand_in_python

STAND_IN = textwrap.dedent('''
    import json, sys, time
    def emit(kind, data):
        sys.stdout.write(json.dumps({"kind": kind, "data": data, "at": time.time()}) + "\\n")
        sys.stdout.flush()
    sys.stdin.readline()  # the job
    emit("log", {"message": "started"})
    emit("artifact", {"kind": "checkpoint", "name": "checkpoint.bin", "path": "/nowhere/checkpoint.bin"})
    emit("result", {"status": "succeeded", "error": None})
''')


def test_the_finishing_step_waits_for_events_still_on_their_way(tmp_path: Path) -> None:
    job = Job(run_id="r1", graph={"nodes": [], "edges": []}, slot_device="cpu", options={},
              layout=Layout.for_data_dir(tmp_path).to_json())

    async def main() -> tuple[list[str], list[dict[str, Any]], dict[str, Any]]:
        delivered: list[dict[str, Any]] = []
        seen_by_finish: list[str] = []
        link_back = asyncio.Event()

        async def sink(batch: list[dict[str, Any]]) -> None:
            # A link that holds the sink in its send: the batch carrying the artifact is handed over
            # only after the run process has exited (the test opens the link then).
            if any(e["kind"] == "artifact" for e in batch):
                await link_back.wait()
            delivered.extend(batch)

        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])

        async def before_final(final: dict[str, Any]) -> dict[str, Any]:
            seen_by_finish.extend(e["kind"] for e in delivered)
            return final
        handle.before_final = before_final
        await handle.start(job, python=stand_in_python(tmp_path, STAND_IN))
        assert handle.proc is not None
        await asyncio.wait_for(handle.proc.wait(), 120)
        # The process is gone; the link stays held a while longer, as a cut's would.
        for _ in range(50):
            await asyncio.sleep(0.01)
        link_back.set()
        final = await asyncio.wait_for(handle.wait(), 120)
        return seen_by_finish, delivered, final

    seen_by_finish, delivered, final = asyncio.run(main())
    assert final["status"] == "succeeded", final
    assert "artifact" in seen_by_finish, f"the finishing step ran before the artifact event was delivered: " \
                                         f"it saw {seen_by_finish}"
    kinds = [e["kind"] for e in delivered]
    assert kinds.count("artifact") == 1 and kinds[-1] == "status", kinds
    assert delivered[-1]["data"]["status"] == "succeeded"

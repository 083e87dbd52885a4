"""A stop waits for a run's recorded-output writes, up to their timeout.

The launcher (cdui/runner.py) is real; the run process is a stand-in that
speaks the launcher's stdout protocol and takes seconds to write its
outputs after a stop, which a real run cannot be made to do on cue. A real
run sends the same ``outputs_writing`` line from cdui/outputs.py's
``recording`` when it leaves the executor.
"""
from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

from cdui import outputs, runner
from cdui.job import Job
from cdui.layout import Layout

STAND_IN = textwrap.dedent('''
    import json, sys, time
    def emit(kind, data):
        sys.stdout.write(json.dumps({"kind": kind, "data": data, "at": time.time()}) + "\\n")
        sys.stdout.flush()
    sys.stdin.readline()                # the job
    for line in sys.stdin:              # until the launcher says stop
        if line.strip() == "stop":
            break
    emit("outputs_writing", {})
    time.sleep(2.0)                     # writing recorded outputs, longer than the stop grace
    emit("result", {"status": "cancelled", "error": "stopped on request"})
''')


def _python(tmp_path: Path) -> str:
    """An interpreter path that runs the stand-in whatever arguments the launcher passes."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    exe.chmod(0o755)
    return str(exe)


def _final_after_stop(tmp_path: Path, options: dict[str, Any]) -> dict[str, Any]:
    job = Job(run_id="r1", graph={"nodes": [], "edges": []}, slot_device="cpu", options=options,
              layout=Layout.for_data_dir(tmp_path).to_json())

    async def main() -> dict[str, Any]:
        events: list[dict[str, Any]] = []

        async def sink(batch: list[dict[str, Any]]) -> None:
            events.extend(batch)
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])
        await handle.start(job, python=_python(tmp_path))
        handle.stop(0.3)
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
    assert final["error"] == "the run did not stop within 0 s and was killed"

"""Run retention (CODEFYUI_RUN_RETENTION_KEEP_LAST): only the newest N finished runs are kept, with their folders."""
from __future__ import annotations

import pytest

from procs import ServerProc, start_then, wait_for, wait_run

# Every test here starts real cdui processes (servers, agents or run subprocesses) and checks what
# they do on the machine: the e2e tier.
pytestmark = pytest.mark.e2e



def test_retention_keeps_the_newest_finished_runs(tmp_path):
    cp = ServerProc(tmp_path, extra_env={"CODEFYUI_RUN_RETENTION_KEEP_LAST": "2"}).start()
    try:
        ids = []
        for _ in range(3):
            run = cp.submit(start_then("TensorCreate"))
            assert wait_run(cp, run["id"])["status"] == "succeeded"
            (cp.data_dir / "runs" / run["id"]).mkdir(parents=True, exist_ok=True)
            (cp.data_dir / "runs" / run["id"] / "note.txt").write_text("run files")
            ids.append(run["id"])
        # Retention runs after each run ends; the oldest goes once the third has ended.
        fourth = cp.submit(start_then("TensorCreate"))
        wait_run(cp, fourth["id"])
        wait_for(lambda: cp.api("GET", f"/api/runs/{ids[0]}")[0] == 404, 60, 0.2, "the oldest run to be removed")
        assert not (cp.data_dir / "runs" / ids[0]).exists(), "its folder went with it"
        assert cp.api("GET", f"/api/runs/{fourth['id']}")[0] == 200
        kept = [r["id"] for r in cp.call("GET", "/api/runs", expect=200)]
        assert len(kept) == 2 and fourth["id"] in kept
    finally:
        cp.stop()

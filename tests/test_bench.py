"""bench/run_all --smoke: every benchmark script still runs and the table is written.

The benchmarks themselves never run in the test suite (they measure, they do
not check); this only keeps the scripts from rotting."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_run_all_smoke_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run_all"), "--smoke", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = out.read_text()
    assert "| benchmark | figure | measured | unit | goal | ratio | met? |" in text
    for bench in ("latency", "scale", "events", "transfer", "footprint", "store", "graphs"):
        assert f"\n| {bench} | " in text, f"no row of {bench} in the table:\n{text}"
    assert "smoke sizes" in text

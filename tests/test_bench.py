"""bench/run_all --smoke: every benchmark script still runs and the table is written.

The benchmarks themselves never run in the test suite (they measure, they do
not check); this only keeps the scripts from rotting. One test per benchmark
(``run_all --only NAME``), so that a parallel run (.ci/run) spreads them over
its workers instead of running them one after another."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# (the script, bench/NAME.py, as run_all --only names it; the benchmark column of its rows)
BENCHES = [("latency", "latency"), ("scale", "scale"), ("agents", "agents"), ("ws_floor", "agents"),
           ("events", "events"),
           ("transfer", "transfer"), ("footprint", "footprint"), ("store_growth", "store"), ("graph_list", "graphs"),
           ("canvas", "canvas"), ("canvas_rerun", "canvas"), ("canvas_stream", "canvas"),
           ("sweeps", "sweeps"), ("studies", "studies"), ("apps", "apps"), ("limits", "limits")]
# The machine's load beside a figure: "1-minute load average / other processes' share of all cores".
LOAD = re.compile(r"\| \d+\.\d / \d+ % \|$")


@pytest.mark.e2e
@pytest.mark.parametrize(("script", "bench"), BENCHES, ids=[s for s, _ in BENCHES])
def test_run_all_smoke_writes_its_table(tmp_path: Path, script: str, bench: str) -> None:
    out = tmp_path / "performance.md"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run_all"), "--smoke", "--only", script,
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = out.read_text()
    assert "| benchmark | figure | measured | unit | goal | ratio | met? | load |" in text
    if bench == "limits":  # the machine's limits have a table of their own
        rows = text.split("## Limits of this machine", 1)[1].split("\n## ", 1)[0].splitlines()
        rows = [r for r in rows if r.startswith("| ") and not r.startswith("| limit |")]
    else:
        rows = [r for r in text.splitlines() if r.startswith(f"| {bench} | ")]
    assert rows, f"no row of {bench} in the page:\n{text}"
    for row in rows:
        assert LOAD.search(row), f"no load beside the figure: {row}"
    assert "smoke sizes" in text


def test_every_benchmark_has_its_test() -> None:
    """run_all's list of benchmarks and the one above stay the same, so that none goes untested."""
    tree = ast.parse((REPO / "bench" / "run_all").read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == ["BENCHES"])
    assert [name for name, _ in ast.literal_eval(value)] == [s for s, _ in BENCHES]

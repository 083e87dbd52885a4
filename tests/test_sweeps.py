"""Sweeps (#27): one graph, many variants, each an ordinary run. A real server, two real agents, real torch
(the iris example with one or two epochs), the command line through `bin/cdui`.

- a bad axis value refuses the whole sweep with every error listed, and nothing is stored;
- a 6-variant grid on two agents: each run got exactly its own params (its stored graph and the metrics it
  emitted), GET /api/sweeps/{id} shows all six with their objective and the best marked, and max_running
  was never exceeded (read from the runs' stored creation and end times, not from timing);
- stop and retry; a kill -9 of the control plane in the middle of a sweep; --emit-sbatch's array.
"""
from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import REPO_ROOT, Proc, ServerProc, iris_example, lab_of, wait_for

pytestmark = pytest.mark.e2e

BIN = str(REPO_ROOT / "bin" / "cdui")
LIVE = ("queued", "running", "disconnected")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: Any) -> Iterator[tuple[ServerProc, list[Proc]]]:
    """A server and two agents (w1, w2), both online."""
    with lab_of(tmp_path_factory.mktemp("sweeps"), "sweeps-server", ("w1", "w2")) as got:
        yield got


def cdui(server: ServerProc, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN, *args], env=server.env, cwd=str(REPO_ROOT), text=True, capture_output=True,
                          timeout=600, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


def explain(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}"


def wait_sweep(server: ServerProc, sweep_id: str, statuses: tuple[str, ...] = ("finished",),
               timeout: float = 300) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        s: dict[str, Any] = server.call("GET", f"/api/sweeps/{sweep_id}")
        return s if s["status"] in statuses else None
    return wait_for(check, timeout, 0.3, f"sweep {sweep_id} to be {'/'.join(statuses)}",
                    detail=lambda: server.call("GET", f"/api/sweeps/{sweep_id}")["counts"])  # type: ignore[no-any-return]


def sweep_runs(server: ServerProc, sweep_id: str) -> list[dict[str, Any]]:
    runs = server.call("GET", "/api/runs?limit=1000")
    return [r for r in runs if (r.get("sweep") or {}).get("id") == sweep_id]


def params_of(server: ServerProc, run_id: str) -> dict[str, dict[str, Any]]:
    return {n["id"]: n["data"]["params"] for n in server.call("GET", f"/api/runs/{run_id}/graph")["graph"]["nodes"]}


def max_overlap(runs: list[dict[str, Any]]) -> int:
    """The most runs alive at once, from their stored creation and end times (a run holds its place in its
    sweep from its creation, queued, to its end)."""
    def at(text: str) -> str:
        return text  # ISO times with milliseconds, all UTC: their order is their text's order
    points = sorted([(at(r["created_at"]), 1) for r in runs] + [(at(r["finished_at"]), -1) for r in runs],
                    key=lambda p: (p[0], p[1]))  # an end at the same millisecond as a start counts first
    most = alive = 0
    for _, step in points:
        alive += step
        most = max(most, alive)
    return most


def test_a_bad_value_refuses_the_whole_sweep_listing_every_error(lab: Any) -> None:
    server, _ = lab
    status, body = server.api("POST", "/api/sweeps", {
        "graph": iris_example(), "options": {"target": "any"},
        "axes": {"optimizer.lr": [0.01, -1, "fast"], "train.epochs": [1, 0], "trian.seed": [1]}})
    assert status == 400, body
    assert body["error"]["code"] == "invalid_sweep", body
    messages = [e["message"] for e in body["error"]["details"]]
    text = "\n".join(messages)
    # Every error, each once however many variants share it: the mistyped node, and (for a grid without it)
    # nothing is left to validate, so the node's name alone comes first; then the values one by one.
    assert any("trian.seed=1: the graph has no node 'trian'; did you mean train?" in m for m in messages), text
    status, body = server.api("POST", "/api/sweeps", {
        "graph": iris_example(), "options": {"target": "any"},
        "axes": {"optimizer.lr": [0.01, -1, "fast"], "train.epochs": [1, 0]}})
    assert status == 400, body
    details = body["error"]["details"]
    bad = {(e.get("node_id"), e.get("param"), json.dumps(e.get("value"))) for e in details}
    assert ("optimizer", "lr", "-1") in bad and ("optimizer", "lr", '"fast"') in bad and \
        ("train", "epochs", "0") in bad, details
    assert all(e["variants"] for e in details), details
    # Nothing stored: no sweep, no run.
    assert server.call("GET", "/api/sweeps")["sweeps"] == []
    assert server.call("GET", "/api/runs") == []
    # The command line lists them too, one per line, and exits 1.
    g = Path(server.tmp) / "iris1.json"
    g.write_text(json.dumps(iris_example()))
    r2 = cdui(server, "sweep", str(g), "--param", "optimizer.lr=0.01,-1", "--param", "train.epochs=1,0")
    assert r2.returncode == 1, explain(r2)
    assert "error(s) in the sweep's variants; nothing was stored" in r2.stderr and \
        "node optimizer: " in r2.stderr and "node train: " in r2.stderr, explain(r2)
    assert server.call("GET", "/api/sweeps")["sweeps"] == []


def test_a_grid_sweep_on_two_agents_each_variant_its_own_params(lab: Any) -> None:
    server, _ = lab
    g = Path(server.tmp) / "iris-grid.json"
    g.write_text(json.dumps(iris_example()))
    r = cdui(server, "sweep", str(g), "--param", "optimizer.lr=0.1,0.03,0.01", "--param", "train.epochs=1:2:1",
             "--target", "any", "--max-running", "2", "--objective", "val_loss", "--min", "--wait")
    assert r.returncode == 0, explain(r)
    sweep_id = r.stdout.split()[1].rstrip(":")
    sweep = server.call("GET", f"/api/sweeps/{sweep_id}")
    assert sweep["status"] == "finished" and sweep["total"] == 6 and sweep["counts"] == {"succeeded": 6}, sweep
    grid = [{"optimizer.lr": lr, "train.epochs": ep} for lr, ep in itertools.product((0.1, 0.03, 0.01), (1, 2))]
    assert [v["params"] for v in sweep["variants"]] == grid
    # Plain lines off a terminal, then the table with the best marked.
    assert "variant 0 (optimizer.lr=0.1, train.epochs=1): succeeded" in r.stdout, explain(r)
    best = [v for v in sweep["variants"] if v["best"]]
    assert len(best) == 1 and best[0]["objective"] == min(v["objective"] for v in sweep["variants"]), sweep
    assert sweep["best"]["index"] == best[0]["index"]
    assert f"best: variant {best[0]['index']} (run {best[0]['run_id']})" in r.stdout, explain(r)
    marked = [line for line in r.stdout.splitlines() if line.startswith("* ")]
    assert len(marked) == 1 and best[0]["run_id"] in marked[0], explain(r)
    # Each run is an ordinary run carrying its sweep and params, and got exactly them: its stored graph and
    # the metrics it emitted (one val_loss per epoch; the lr it trained with).
    runs = sweep_runs(server, sweep_id)
    assert sorted(r["id"] for r in runs) == sorted(v["run_id"] for v in sweep["variants"])
    for v in sweep["variants"]:
        run = server.call("GET", f"/api/runs/{v['run_id']}")
        assert run["sweep"] == {"id": sweep_id, "variant": v["index"], "params": v["params"]}, run
        assert run["status"] == "succeeded" and run["worker_id"] in ("w1", "w2") and v["worker_id"] == run["worker_id"]
        p = params_of(server, v["run_id"])
        assert p["optimizer"]["lr"] == v["params"]["optimizer.lr"]
        assert p["train"]["epochs"] == v["params"]["train.epochs"]
        series = {s["name"]: s for s in server.call("GET", f"/api/runs/{v['run_id']}/metrics")["series"]}
        assert series["val_loss"]["count"] == v["params"]["train.epochs"], series["val_loss"]
        assert series["lr"]["last"]["value"] == pytest.approx(v["params"]["optimizer.lr"])
        assert v["objective"] == series["val_loss"]["last"]["value"] == v["metrics"]["val_loss"]
        # Every final metric the variant keeps (followed as the events were stored) is the run's last value.
        assert v["metrics"] == {name: s["last"]["value"] for name, s in series.items()}, (v["metrics"], series)
    # Spread over both agents, never more than max_running (2) alive at once.
    assert {v["worker_id"] for v in sweep["variants"]} == {"w1", "w2"}, sweep
    assert max_overlap(runs) <= 2, [(r["created_at"], r["finished_at"]) for r in runs]
    # Listed, shown by the command line.
    listed = server.call("GET", "/api/sweeps")["sweeps"]
    assert [s["id"] for s in listed if s["id"] == sweep_id] and listed[0]["counts"] == {"succeeded": 6}
    r = cdui(server, "sweep", "show", sweep_id)
    assert r.returncode == 0 and "sweep " + sweep_id + ": finished, 6 variants (6 succeeded)" in r.stdout, explain(r)
    r = cdui(server, "sweep", "list")
    line = next((x for x in r.stdout.splitlines() if x.startswith(sweep_id)), None)
    assert r.returncode == 0 and line is not None and "finished" in line and "6 variants (6 succeeded)" in line, \
        explain(r)
    r = cdui(server, "sweep", "lsit")
    assert r.returncode == 2 and "did you mean list?" in r.stderr, explain(r)
    r = cdui(server, "sweep", "show")
    assert r.returncode == 2 and "`cdui sweep show` needs the sweep's id" in r.stderr, explain(r)


def test_stop_then_retry(lab: Any) -> None:
    server, _ = lab
    # Variant 0 trains (practically) for ever; one at a time, so 1 and 2 wait in the sweep.
    sweep = server.call("POST", "/api/sweeps", {
        "graph": iris_example(), "mode": "list", "options": {"target": "any"}, "max_running": 1,
        "axes": {"train.epochs": [100000, 1, 1]}}, expect=201)
    sid = sweep["id"]
    assert sweep["variants"][0]["status"] in LIVE, sweep
    assert [v["status"] for v in sweep["variants"][1:]] == ["waiting", "waiting"], sweep
    first = sweep["variants"][0]["run_id"]
    wait_for(lambda: server.call("GET", f"/api/runs/{first}")["status"] == "running", 120, 0.2, "variant 0 running")
    r = cdui(server, "sweep", "stop", sid)
    assert r.returncode == 2 and "add --yes" in r.stderr, explain(r)  # off a terminal, --yes is needed
    r = cdui(server, "sweep", "stop", sid, "--yes")
    assert r.returncode == 0, explain(r)
    s = wait_sweep(server, sid, ("stopped",), 120)
    assert [v["status"] for v in s["variants"]] == ["cancelled", "cancelled", "cancelled"], s
    assert [v["run_id"] is not None for v in s["variants"]] == [True, False, False], s
    # Retry queues all three again, as new runs (the old one is remembered); a running sweep is not deleted.
    r = cdui(server, "sweep", "retry", sid)
    assert r.returncode == 0 and "3 variant(s) queued again" in r.stdout, explain(r)
    s = server.call("GET", f"/api/sweeps/{sid}")
    assert s["status"] == "running" and s["variants"][0]["previous_runs"] == [first], s
    again = s["variants"][0]["run_id"]
    assert again not in (None, first)
    assert server.api("DELETE", f"/api/sweeps/{sid}")[0] == 409
    # Stopping variant 0's run alone releases the next ones, which succeed.
    wait_for(lambda: server.call("GET", f"/api/runs/{again}")["status"] == "running", 120, 0.2, "variant 0 again")
    server.call("POST", f"/api/runs/{again}/stop")
    s = wait_sweep(server, sid, ("finished",), 300)
    assert [v["status"] for v in s["variants"]] == ["cancelled", "succeeded", "succeeded"], s
    assert len(sweep_runs(server, sid)) == 4  # variant 0 twice (its first run kept), 1 and 2 once
    r = cdui(server, "sweep", "delete", sid, "--yes")
    assert r.returncode == 0 and "4 run(s) deleted" in r.stdout, explain(r)
    assert server.api("GET", f"/api/sweeps/{sid}")[0] == 404
    assert sweep_runs(server, sid) == []


def test_a_killed_control_plane_finishes_the_sweep_each_variant_run_once(lab: Any) -> None:
    server, agents = lab
    sweep = server.call("POST", "/api/sweeps", {
        "graph": iris_example(), "options": {"target": "any"}, "max_running": 1,
        "axes": {"optimizer.lr": [0.1, 0.05, 0.02, 0.01]}}, expect=201)
    sid = sweep["id"]

    def second_running() -> bool:
        s = server.call("GET", f"/api/sweeps/{sid}")
        return s["variants"][1]["status"] in ("running", "succeeded")
    wait_for(second_running, 180, 0.1, "variant 1 running")
    server.kill9()
    server.start()
    s = wait_sweep(server, sid, ("finished",), 300)
    assert s["counts"] == {"succeeded": 4}, s
    runs = sweep_runs(server, sid)
    assert sorted(r["sweep"]["variant"] for r in runs) == [0, 1, 2, 3], runs  # each variant run exactly once
    assert all(v["previous_runs"] == [] for v in s["variants"])
    assert max_overlap(runs) <= 1
    assert all(a.alive for a in agents)


def test_emit_sbatch_sizes_the_array_to_the_variants(lab: Any) -> None:
    server, _ = lab
    g = Path(server.tmp) / "iris-oneshot.json"
    g.write_text(json.dumps(iris_example()))
    r = cdui(server, "sweep", str(g), "--param", "optimizer.lr=0.1,0.01", "--param", "train.epochs=1,2",
             "--target", "one-shot", "--device", "cpu", "--max-running", "3", "--emit-sbatch")
    assert r.returncode == 0, explain(r)
    lines = r.stdout.splitlines()
    assert lines[0] == "#!/bin/bash" and "#SBATCH --array=0-3%3" in lines, explain(r)
    assert any(line.startswith("#SBATCH --job-name=codefyui-sweep-") for line in lines)
    assert 'exec "$CDUI" agent start --one-shot --instance' in r.stdout
    sid = r.stderr.split()[1].rstrip(":")
    s = server.call("GET", f"/api/sweeps/{sid}")
    assert s["total"] == 4 and s["options"]["target"] == {"pool": "one-shot"}
    assert s["counts"] == {"queued": 3, "waiting": 1}, s
    r = cdui(server, "sweep", str(g), "--param", "optimizer.lr=0.1", "--emit-sbatch")
    assert r.returncode == 2 and "give --target one-shot" in r.stderr, explain(r)
    server.call("POST", f"/api/sweeps/{sid}/stop")
    wait_sweep(server, sid, ("stopped",), 60)

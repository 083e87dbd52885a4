"""Studies (#27): a sweep whose next variants Optuna chooses. A real server, two real agents, real torch: the
iris example, whose TrainingLoop reports the optimiser's learning rate as its ``lr`` metric at every epoch, so a
study of ``optimizer.lr`` with ``lr`` as its objective has a known minimum (the axis's low end) and every trial
streams it step by step for the pruner.

- a 12-trial TPE study with a fixed seed finds a better value than the best of its first 3 trials, and with
  the median pruner at least one clearly bad trial is pruned: marked, its run stopped, its metrics kept;
- a kill -9 of the control plane in the middle of a study (made with `cdui study`): it reaches n_trials,
  each trial with exactly one run; the best trial's graph is saved with `cdui study best-save`;
- without Optuna importable (hidden by a sitecustomize in the server's PYTHONPATH), the control plane starts,
  a study is refused naming the install command, and a sweep is still accepted.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import REPO_ROOT, Proc, ServerProc, iris_example, lab_of, wait_for

pytestmark = pytest.mark.e2e

BIN = str(REPO_ROOT / "bin" / "cdui")
LR = {"loguniform": [0.0001, 0.1]}
OBJECTIVE = {"metric": "lr", "goal": "min"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: Any) -> Iterator[tuple[ServerProc, list[Proc]]]:
    with lab_of(tmp_path_factory.mktemp("studies"), "studies-server", ("s1", "s2")) as got:
        yield got


def wait_study(server: ServerProc, sid: str, timeout: float = 400) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        s: dict[str, Any] = server.call("GET", f"/api/studies/{sid}")
        return s if s["status"] in ("finished", "stopped") else None
    return wait_for(check, timeout, 0.3, f"study {sid} to finish",  # type: ignore[no-any-return]
                    detail=lambda: server.call("GET", f"/api/studies/{sid}")["counts"])


def study_runs(server: ServerProc, sid: str) -> list[dict[str, Any]]:
    return [r for r in server.call("GET", "/api/runs?limit=1000") if (r.get("sweep") or {}).get("id") == sid]


def metric_steps(server: ServerProc, run_id: str, name: str) -> list[int]:
    evs = server.call("GET", f"/api/runs/{run_id}/events?limit=10000")
    evs = evs["events"] if isinstance(evs, dict) else evs
    return [e["data"]["step"] for e in evs if e["kind"] == "metric" and e["data"].get("name") == name]


def test_a_tpe_study_improves_on_its_first_trials_and_prunes_a_bad_one(lab: Any) -> None:
    server, _ = lab
    # a search axis naming no param of the graph: every error listed, nothing stored
    before = server.call("GET", "/api/studies")["studies"]
    status, body = server.api("POST", "/api/studies", {
        "graph": iris_example(1), "axes": {"optimzer.lr": LR, "train.epoch": [1, 2]}, "objective": OBJECTIVE})
    assert status == 400 and body["error"]["code"] == "invalid_study", body
    text = " ".join(e["message"] for e in body["error"]["details"])
    assert "did you mean optimizer?" in text and "did you mean epochs?" in text, text
    assert server.call("GET", "/api/studies")["studies"] == before
    epochs = 20
    s = server.call("POST", "/api/studies", {
        "graph": iris_example(epochs), "options": {"target": "any"}, "axes": {"optimizer.lr": LR},
        "objective": OBJECTIVE,
        "n_trials": 12, "parallelism": 2, "seed": 7, "sampler": {"name": "tpe", "startup_trials": 3},
        "pruner": {"name": "median", "startup_trials": 2}})
    # its parallelism's trials; none asked ahead before a trial has ended (docs/sweeps.md, "Trials asked ahead")
    assert s["kind"] == "study" and s["n_trials"] == 12 and s["total"] <= 2, s
    s = wait_study(server, s["id"])
    trials = s["trials"]
    assert s["status"] == "finished" and len(trials) == 12, s["counts"]
    assert [t["index"] for t in trials] == list(range(12))
    first = [t["objective"] for t in trials[:3] if t["state"] == "complete"]
    assert first and s["best"]["objective"] < min(first), (s["best"], first)
    assert s["best"]["index"] >= 3
    assert s["history"] and s["history"][-1]["best_so_far"] == s["best"]["objective"]
    # a trial's objective is its lr (what the TrainingLoop reports), the value the sampler chose
    for t in trials:
        if t["state"] == "complete":
            assert t["objective"] == pytest.approx(t["params"]["optimizer.lr"]), t
    pruned = [t for t in trials if t["pruned"]]
    assert pruned, [(t["index"], t["state"], t["params"]) for t in trials]
    done = [t["objective"] for t in trials if t["state"] == "complete"]
    for t in pruned:
        # its run was stopped, and ends as a stop ends a run (docs/sweeps.md, Studies)
        assert t["state"] == "pruned" and not t["best"] and t["status"] == "cancelled", t
        # clearly bad: worse than the best trial finished before it was pruned
        assert t["params"]["optimizer.lr"] > min(done), t
        assert server.call("GET", f"/api/runs/{t['run_id']}")["sweep"]["pruned"] is True
        steps = metric_steps(server, t["run_id"], "lr")
        assert steps and len(steps) < epochs, (t, steps[-3:])  # stopped early, its partial metrics kept
        log = server.call("GET", f"/api/runs/{t['run_id']}/events?limit=10000")
        log = log["events"] if isinstance(log, dict) else log
        assert any("pruned at step" in str(e["data"].get("message")) for e in log if e["kind"] == "log")
    assert s["counts"]["pruned"] == len(pruned)
    # one param has all the importance (fANOVA's shares add up to 1), from 4 complete trials on
    assert s["importances"] == ({"optimizer.lr": 1.0} if len(s["history"]) >= 4 else None), s["history"]
    listed = server.call("GET", "/api/studies")["studies"]
    assert s["id"] in [x["id"] for x in listed]


def cdui(server: ServerProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN, *args], env=server.env, cwd=str(REPO_ROOT), text=True, capture_output=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def test_a_study_survives_a_kill_9_of_the_control_plane(lab: Any) -> None:
    server, agents = lab
    g = Path(server.tmp) / "iris-study.json"
    g.write_text(json.dumps(iris_example(10)))
    r = cdui(server, "study", str(g), "--param", "optimizer.lr=loguniform:1e-4:1e-1", "--param",
             "train.epochs=5,10", "--n-trials", "6", "--parallelism", "2", "--seed", "3", "--objective", "lr", "--min",
             "--name", "kill-me")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()

    def some_done_some_running() -> bool:
        s = server.call("GET", f"/api/studies/{sid}")
        states = [t["state"] for t in s["trials"]]
        return "complete" in states and ("running" in states or "waiting" in states) and len(states) < 6
    wait_for(some_done_some_running, 300, 0.1, "a trial done and another in flight")
    server.kill9()
    server.start()
    s = wait_study(server, sid)
    assert s["status"] == "finished" and s["total"] == 6, s["counts"]
    runs = study_runs(server, sid)
    # every trial exactly once: one run each, none lost, none run twice
    assert sorted(r["sweep"]["variant"] for r in runs) == list(range(6)), [r["sweep"] for r in runs]
    assert all(t["previous_runs"] == [] for t in s["trials"])
    assert s["counts"].get("succeeded") == 6, s["counts"]
    assert all(a.alive for a in agents)
    r = cdui(server, "study", "show", sid)
    assert r.returncode == 0 and f"study {sid}: finished, 6 of 6 trials" in r.stdout, r.stdout + r.stderr
    r = cdui(server, "study", "list")
    line = next((x for x in r.stdout.splitlines() if x.startswith(sid)), None)
    assert r.returncode == 0 and line is not None and "6 of 6 trials (6 succeeded)" in line and "kill-me" in line, \
        r.stdout + r.stderr
    r = cdui(server, "study", "best-save", sid, "--name", "iris-best")
    assert r.returncode == 0 and f"with trial {s['best']['index']}'s params (optimizer.lr=" in r.stdout, r.stderr
    saved = server.call("GET", "/api/graphs/iris-best")
    saved = saved.get("graph", saved)
    lr = next(n for n in saved["nodes"] if n["id"] == "optimizer")["data"]["params"]["lr"]
    assert lr == s["best"]["params"]["optimizer.lr"]


HIDE_OPTUNA = '''
import sys
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "optuna" or name.startswith("optuna."):
            raise ModuleNotFoundError("No module named 'optuna'", name=name)
        return None
sys.meta_path.insert(0, _Hide())
'''


def test_without_optuna_a_study_is_refused_with_the_install_command(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_OPTUNA)
    server = ServerProc(tmp_path, name="no-optuna").start({"PYTHONPATH": str(hide)})
    try:
        status, body = server.api("POST", "/api/studies", {
            "graph": iris_example(1), "axes": {"optimizer.lr": LR}, "objective": OBJECTIVE,
            "options": {"target": "local"}})
        assert status == 501 and body["error"]["code"] == "studies_unavailable", body
        assert "bin/cdui start --extras studies" in body["error"]["hint"], body
        # a bad request is still told what is wrong first (it does not need Optuna to be judged)
        status, body = server.api("POST", "/api/studies", {"graph": iris_example(1), "axes": {"optimizer.lr": LR}})
        assert status == 400 and "needs an objective" in body["error"]["message"], body
        status, body = server.api("POST", "/api/sweeps", {
            "graph": iris_example(1), "axes": {"optimizer.lr": [0.01]}, "options": {"target": "local"}})
        assert status == 201, body
        # the studies' routes are the owner's, as the sweeps' are
        status, body = server.api("GET", "/api/studies", token=False)
        assert status == 401 and body["error"]["code"] == "unauthorized", body
    finally:
        server.stop()

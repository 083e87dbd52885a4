"""A sweep's and a study's status as `GET /api/sweeps/{id}` and `GET /api/studies/{id}` say it
(cdui/plane/sweeps.py `_summary`). `cdui sweep --wait` and `cdui study --wait` end on `finished`, so a
study must not read `finished` in the moment between its trials' ends and the sampler's next asks (no
trial waiting or live then); bench/studies.py with runs of 0.1 s saw that after its first 4 of 100 trials."""
from __future__ import annotations

from typing import Any

from cdui.plane.sweeps import _summary


def sweep(kind: str, state: str = "active", **spec: Any) -> dict[str, Any]:
    return {"id": "s1", "kind": kind, "name": "x", "state": state, "spec": spec, "max_running": 4,
            "options": {}, "created_at": 0.0, "stopped_at": None}


def test_a_study_with_trials_still_to_ask_is_running_between_its_trials() -> None:
    ended = {"succeeded": 4}
    assert _summary(sweep("study", n_trials=100), ended)["status"] == "running"
    assert _summary(sweep("study", n_trials=4), ended)["status"] == "finished"
    assert _summary(sweep("study", n_trials=4), {"succeeded": 3, "failed": 1})["status"] == "finished"
    # A stopped study asks nothing more: stopped, whatever it had still to ask.
    assert _summary(sweep("study", state="stopped", n_trials=100), ended)["status"] == "stopped"
    assert _summary(sweep("study", state="stopped", n_trials=100), {"running": 1})["status"] == "stopping"


def test_a_sweep_is_finished_once_no_variant_waits_or_runs() -> None:
    # A sweep has all its variants from creation: when none waits or runs, it is finished.
    assert _summary(sweep("sweep", mode="grid"), {"succeeded": 8})["status"] == "finished"
    assert _summary(sweep("sweep", mode="grid"), {"succeeded": 7, "waiting": 1})["status"] == "running"
    assert _summary(sweep("sweep", mode="grid"), {"succeeded": 7, "running": 1})["status"] == "running"

"""A study's request (cdui/wire/studyspec.py, #27): each malformed part refused with a message naming the
value and what to give instead; the command line's text forms. Pure: no server, no Optuna."""
from __future__ import annotations

from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.wire.studyspec import MAX_TRIALS, dim_from_text, parse_study

GRAPH: dict[str, Any] = {"nodes": []}
OK = {"graph": GRAPH, "axes": {"optimizer.lr": {"loguniform": [0.0001, 0.1]}}, "objective": "val_loss"}


def test_a_good_request_is_read_with_its_defaults() -> None:
    spec = parse_study({**OK, "axes": {"optimizer.lr": {"loguniform": [0.0001, 0.1]}, "train.epochs": [10, 20],
                                       "model.hidden": {"range": [32, 100, 32]}, "x.n": {"randint": [1, 4]}}})
    assert (spec.n_trials, spec.parallelism, spec.seed) == (20, 1, 0)
    assert spec.sampler == {"name": "tpe"} and spec.pruner == {"name": "none"}
    assert spec.objective == {"metric": "val_loss", "goal": "min"}
    dims = {d.key: d for d in spec.dims}
    assert dims["optimizer.lr"].log and dims["train.epochs"].choices == (10, 20)
    assert (dims["model.hidden"].kind, dims["model.hidden"].high, dims["model.hidden"].step) == ("int", 96, 32)
    assert spec.to_json()["axes"]["model.hidden"] == {"range": [32, 96, 32]}
    # the grid sampler runs each point once: n_trials is at most the grid's size
    assert parse_study({**OK, "axes": {"train.epochs": [10, 20]}, "sampler": "grid", "n_trials": 9}).n_trials == 2


@pytest.mark.parametrize(("change", "words"), [
    ({"objective": None}, "a study needs an objective"),
    ({"objective": {"metric": "val_loss", "goal": "up"}}, "is not a metric name and a goal (min or max)"),
    ({"axes": {}}, "a study needs axes"),
    ({"axes": {"lr": [1]}}, "axis name 'lr' is not NODE.PARAM"),
    ({"axes": {"o.lr": {"loguniform": [0, 1]}}}, "loguniform needs low > 0, got 0"),
    ({"axes": {"o.lr": {"uniform": [1, 1]}}}, "uniform needs [low, high] with low < high, got [1, 1]"),
    ({"axes": {"o.lr": {"range": [1, 5, 0]}}}, "needs low < high and a step above 0"),
    ({"axes": {"o.lr": [[1, 2]]}}, "value [1, 2] is not a number, text, true/false or null"),
    ({"axes": {"o.lr": [1, 1]}}, "repeat a value"),
    ({"sampler": "bayes"}, 'sampler "bayes" is not one of tpe, random, grid, cmaes'),
    ({"pruner": {"name": "median", "patience": 3}}, "pruner setting(s) patience are not known"),
    ({"n_trials": 0}, f"n_trials 0 is not an integer from 1 to {MAX_TRIALS}"),
    ({"parallelism": True}, "parallelism true is not an integer"),
    ({"seed": -1}, "seed -1 is not an integer from 0"),
    ({"sampler": "grid"}, "the grid sampler needs every axis as a list of values"),
    ({"trials": 5}, "unknown field(s) trials in the study"),
])
def test_a_bad_request_is_refused_naming_the_value(change: dict[str, Any], words: str) -> None:
    with pytest.raises(CduiError) as info:
        parse_study({**OK, **change})
    assert info.value.code == "bad_study" and words in info.value.message, info.value.message
    assert info.value.hint


def test_the_command_line_forms() -> None:
    assert dim_from_text("optimizer.lr=loguniform:1e-4:1e-1") == ("optimizer.lr", {"loguniform": [0.0001, 0.1]})
    assert dim_from_text("m.hidden=range:32:128:32") == ("m.hidden", {"range": [32, 128, 32]})
    assert dim_from_text("m.hidden=32:128:32") == ("m.hidden", {"range": [32, 128, 32]})
    assert dim_from_text("train.epochs=10,20") == ("train.epochs", {"values": [10, 20]})
    assert dim_from_text("opt.type=Adam,SGD") == ("opt.type", {"values": ["Adam", "SGD"]})
    with pytest.raises(CduiError, match="randint takes low:high"):
        dim_from_text("m.n=randint:1:2:3")
    with pytest.raises(CduiError, match="is not NODE.PARAM=SPEC"):
        dim_from_text("lr=0.1")

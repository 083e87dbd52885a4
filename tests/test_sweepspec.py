"""A sweep's request read and expanded (cdui/wire/sweepspec.py): pure, no server."""
from __future__ import annotations

import math
from typing import Any

import pytest

from cdui.core.errors import CduiError
from cdui.wire.sweepspec import MAX_VARIANTS, axis_from_text, expand, parse_spec


def variants(body: dict[str, Any]) -> list[dict[str, Any]]:
    return expand(parse_spec(body))


def test_grid_is_every_combination_in_order_and_ranges_include_their_stop() -> None:
    out = variants({"axes": {"train.lr": [0.1, 0.01], "model.hidden": {"range": [32, 128, 32]}}})
    assert len(out) == 8 and out[0] == {"train.lr": 0.1, "model.hidden": 32}
    assert out[-1] == {"train.lr": 0.01, "model.hidden": 128}
    assert variants({"axes": {"a.x": {"range": [0.1, 0.3, 0.1]}}}) == [{"a.x": 0.1}, {"a.x": 0.2}, {"a.x": 0.3}]
    assert variants({"axes": {"a.x": {"range": [3, 1, -1]}}}) == [{"a.x": 3}, {"a.x": 2}, {"a.x": 1}]


def test_list_mode_pairs_values_or_takes_explicit_variants() -> None:
    assert variants({"mode": "list", "axes": {"a.x": [1, 2], "b.y": ["p", "q"]}}) == \
        [{"a.x": 1, "b.y": "p"}, {"a.x": 2, "b.y": "q"}]
    explicit = [{"a.x": 1}, {"a.x": 5, "b.y": 2}]
    assert variants({"mode": "list", "variants": explicit}) == explicit
    with pytest.raises(CduiError, match="different lengths: a.x 2, b.y 1"):
        parse_spec({"mode": "list", "axes": {"a.x": [1, 2], "b.y": [1]}})


def test_random_mode_is_seeded_and_draws_within_bounds() -> None:
    body = {"mode": "random", "count": 50, "seed": 7,
            "axes": {"t.lr": {"loguniform": [1e-4, 1e-1]}, "t.n": {"randint": [1, 3]}, "t.opt": ["sgd", "adam"]}}
    a, b = variants(body), variants(body)
    assert a == b and len(a) == 50
    assert a != variants({**body, "seed": 8})
    assert all(1e-4 <= v["t.lr"] <= 1e-1 and v["t.n"] in (1, 2, 3) and v["t.opt"] in ("sgd", "adam") for v in a)
    assert {v["t.n"] for v in a} == {1, 2, 3}
    assert any(math.log10(v["t.lr"]) < -3 for v in a)  # log-uniform: the low decades are drawn too


@pytest.mark.parametrize(("body", "words"), [
    ({"axes": {}}, "at least one axis"),
    ({"axes": {"lr": [1]}}, "'lr' is not NODE.PARAM"),
    ({"axes": {"a.x": []}}, "non-empty list"),
    ({"axes": {"a.x": {"range": [1, 10, 0]}}}, "never reaches 10"),
    ({"axes": {"a.x": {"range": [1, 10, -1]}}}, "never reaches 10"),
    ({"axes": {"a.x": {"uniform": [0, 1]}}}, "only random mode draws from one"),
    ({"mode": "random", "axes": {"a.x": [1]}}, "random mode needs a count"),
    ({"mode": "random", "count": 2, "axes": {"a.x": {"loguniform": [0, 1]}}}, "loguniform needs low > 0"),
    ({"axes": {"a.x": [1]}, "count": 3}, "count is for random mode only"),
    ({"axes": {"a.x": [1]}, "mode": "bayes"}, "mode 'bayes' is not grid, list or random"),
    ({"axes": {"a.x": [1]}, "max_running": 0}, "max_running 0 is not a number"),
    ({"axes": {"a.x": [1]}, "objective": {"metric": "val_loss", "goal": "lowest"}}, "goal (min or max)"),
    ({"axes": {"a.x": list(range(200)), "b.y": list(range(200))}}, f"40000 variants, more than {MAX_VARIANTS}"),
])
def test_a_bad_request_is_refused_naming_what_is_wrong(body: dict[str, Any], words: str) -> None:
    with pytest.raises(CduiError) as exc:
        parse_spec(body)
    assert exc.value.code == "bad_sweep" and words in exc.value.message, exc.value.message
    assert exc.value.hint


def test_the_command_lines_text_forms() -> None:
    assert axis_from_text("train.lr=0.1,0.01,1e-3") == ("train.lr", {"values": [0.1, 0.01, 0.001]})
    assert axis_from_text("model.hidden=32:128:32") == ("model.hidden", {"range": [32, 128, 32]})
    assert axis_from_text("opt.type=Adam,SGD") == ("opt.type", {"values": ["Adam", "SGD"]})
    assert axis_from_text("dev.name=cuda:0") == ("dev.name", {"values": ["cuda:0"]})  # not a range: not numbers
    assert axis_from_text("t.lr=loguniform(1e-4, 0.1)") == ("t.lr", {"loguniform": [0.0001, 0.1]})
    with pytest.raises(CduiError, match="is not NODE.PARAM=VALUES"):
        axis_from_text("lr0.1")

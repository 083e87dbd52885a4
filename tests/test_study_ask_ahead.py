"""When a study asks trials ahead (docs/sweeps.md, "Trials asked ahead"): only while its recent trials are short,
where the sampler's time per trial would show in its wall time; a study of longer trials asks each trial when a
slot frees, with the results known then."""
from __future__ import annotations

from cdui.plane.studies import AHEAD_BELOW_S, ASK_AHEAD, _Live
from cdui.wire.studyspec import parse_study


def live() -> _Live:
    spec = parse_study({"graph": {}, "axes": {"n.value": {"uniform": [0.0, 1.0]}},
                        "objective": {"metric": "loss", "goal": "min"}, "n_trials": 20, "parallelism": 4})
    return _Live("s1", spec)


def test_no_trial_is_asked_ahead_before_one_has_ended() -> None:
    assert live().ahead() == 0


def test_short_trials_are_asked_ahead_and_long_ones_are_not() -> None:
    short = live()
    short.recent_s.extend([0.01, 0.02, 0.05])
    assert short.ahead() == ASK_AHEAD == 1
    long = live()
    long.recent_s.extend([0.01, AHEAD_BELOW_S * 30, AHEAD_BELOW_S * 40])
    assert long.ahead() == 0


def test_the_rule_follows_the_last_trials() -> None:
    s = live()
    s.recent_s.extend([0.01] * 8)
    assert s.ahead() == 1
    s.recent_s.extend([AHEAD_BELOW_S * 10] * 5)  # the last eight are kept: five long of them now
    assert s.ahead() == 0

"""When a read of a study fits its param importances again (cdui/plane/studies.py ``fit_due``): a study being
watched must not spend the control plane's CPU on fANOVA fits at every poll (docs/sweeps.md, Studies)."""
from __future__ import annotations

from cdui.plane.studies import IMPORTANCE_COST_SHARE, IMPORTANCE_EVERY_S, fit_due


def test_the_first_read_fits_unless_a_fit_is_running():
    assert fit_due(None, False, 4, 100.0) is True
    assert fit_due(None, True, 4, 100.0) is False


def test_the_same_trials_are_never_fitted_twice():
    last = (10, 0.0, {"a": 0.5, "b": 0.5}, 0.001)
    assert fit_due(last, False, 10, 10_000.0) is False


def test_a_tenth_more_trials_fits_again_once_the_last_fits_cost_allows():
    cost = 0.5  # CPU seconds of the last fit
    wait = cost / IMPORTANCE_COST_SHARE  # 10 s at a share of 5 %
    last = (40, 0.0, {"a": 0.7, "b": 0.3}, cost)
    assert fit_due(last, False, 44, wait - 0.01) is False  # a tenth more, but too soon after a costly fit
    assert fit_due(last, False, 44, wait) is True
    assert fit_due(last, True, 44, wait) is False  # one fit at a time


def test_fewer_new_trials_wait_for_the_interval():
    last = (40, 0.0, {"a": 0.7, "b": 0.3}, 0.0)
    assert fit_due(last, False, 43, IMPORTANCE_EVERY_S - 0.01) is False
    assert fit_due(last, False, 43, IMPORTANCE_EVERY_S) is True
    # small studies: one more trial is a tenth more
    assert fit_due((5, 0.0, None, 0.0), False, 6, 0.01) is True

"""A grid study rebuilt from its stored trials (cdui/plane/sampler_proc.py, #27): Optuna's grid sampler knows the
points already visited by each trial's grid id, which a trial rebuilt from the store does not carry; the
service rebuilds the sampler with the study's seed (trial N is the N-th point of its seeded order) and
gives each rebuilt trial its point's id, so after a restart the remaining points are asked, none twice.
Real Optuna, no server."""
from __future__ import annotations

import pytest

from cdui.plane.sampler_proc import grid_attrs

optuna = pytest.importorskip("optuna", reason="the studies extra (Optuna) is not installed")


def test_a_rebuilt_grid_study_asks_only_the_points_not_visited() -> None:
    space = {"train.epochs": [1, 2, 3], "optimizer.lr": [0.1, 0.01]}
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    first = optuna.create_study(sampler=optuna.samplers.GridSampler(space, seed=0))
    asked = [first.ask(dists).params for _ in range(4)]
    # The restart: a new sampler with the study's seed, the four trials rebuilt (one finished, three running).
    again = optuna.create_study(sampler=optuna.samplers.GridSampler(space, seed=0))
    for i, p in enumerate(asked):
        state = optuna.trial.TrialState.COMPLETE if i == 0 else optuna.trial.TrialState.RUNNING
        again.add_trial(optuna.trial.create_trial(state=state, value=1.0 if i == 0 else None, params=p,
                                                  distributions=dists,
                                                  system_attrs=grid_attrs(again, p)))
    rest = [again.ask(dists).params for _ in range(2)]
    points = {tuple(sorted(p.items())) for p in asked + rest}
    assert len(points) == 6, (asked, rest)  # every point of the 3 x 2 grid once

"""The two pieces of scikit-learn whose *exact* output CodefyUI graphs rely on.

CodefyUI's TrainTestSplit wraps ``sklearn.model_selection.train_test_split``
and its example notes quote results that follow from the precise rows a seed
puts in the test set ("30 predictions, about 93%, both mistakes versicolor
vs virginica"). cdui does not depend on numpy or scikit-learn, so the split is
reproduced here, bit for bit:

- numpy's legacy ``RandomState(seed)`` is MT19937 seeded with
  ``init_genrand(seed)``; Python's own ``random.Random`` is the same generator,
  so we build the 624-word state ourselves and hand it to ``setstate``;
- ``RandomState.permutation(n)`` is a Fisher-Yates shuffle from the end that
  draws with numpy's masked rejection sampler (``random_interval``);
- ``ShuffleSplit`` / ``StratifiedShuffleSplit`` consume that generator in a
  fixed order (documented at each function).

Pure Python, no imports beyond the standard library: it runs at graph
validation time as well as in the run subprocess.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence

_N = 624


class LegacyRandomState:
    """The subset of ``numpy.random.RandomState`` that sklearn's splits use."""

    def __init__(self, seed: int) -> None:
        if not 0 <= int(seed) <= 0xFFFFFFFF:
            raise ValueError(f"seed must be between 0 and 2**32 - 1, got {seed}")
        key = [0] * _N
        key[0] = int(seed) & 0xFFFFFFFF
        for i in range(1, _N):
            prev = key[i - 1]
            key[i] = (1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF
        self._rng = random.Random()
        # pos == 624 makes the next draw regenerate the whole block, exactly as
        # numpy's freshly seeded state does.
        self._rng.setstate((3, tuple(key) + (_N,), None))

    def _uint32(self) -> int:
        return self._rng.getrandbits(32)

    def _interval(self, maximum: int) -> int:
        """numpy's ``random_interval``: uniform in [0, maximum] by masked rejection."""
        if maximum == 0:
            return 0
        mask = maximum
        for shift in (1, 2, 4, 8, 16, 32):
            mask |= mask >> shift
        while True:
            value = self._uint32() & mask
            if value <= maximum:
                return value

    def shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self._interval(i)
            items[i], items[j] = items[j], items[i]

    def permutation(self, x: int | Sequence) -> list:
        items = list(range(x)) if isinstance(x, int) else list(x)
        self.shuffle(items)
        return items

    def choice_without_replacement(self, population: Sequence, size: int) -> list:
        # Legacy ``choice(a, size, replace=False)`` is ``permutation(len(a))[:size]``.
        idx = self.permutation(len(population))[:size]
        return [population[i] for i in idx]


def split_sizes(n_samples: int, test_size: float) -> tuple[int, int]:
    """sklearn's ``_validate_shuffle_split`` for a float ``test_size``."""
    n_test = math.ceil(test_size * n_samples)
    n_train = n_samples - n_test
    if n_train <= 0 or n_test <= 0:
        raise ValueError(
            f"test_size={test_size} with {n_samples} samples leaves an empty "
            f"train or test set; choose a test_size between 0 and 1 that leaves "
            f"at least one row on each side")
    return n_train, n_test


def _approximate_mode(class_counts: list[int], n_draws: int,
                      rng: LegacyRandomState) -> list[int]:
    """sklearn.utils.extmath._approximate_mode, same draws in the same order."""
    total = sum(class_counts)
    continuous = [c / total * n_draws for c in class_counts]
    floored = [math.floor(v) for v in continuous]
    need = int(n_draws - sum(floored))
    if need > 0:
        remainder = [c - f for c, f in zip(continuous, floored, strict=True)]
        for value in sorted(set(remainder), reverse=True):
            inds = [i for i, r in enumerate(remainder) if r == value]
            add_now = min(len(inds), need)
            for i in rng.choice_without_replacement(inds, add_now):
                floored[i] += 1
            need -= add_now
            if need == 0:
                break
    return floored


def shuffle_split(n_samples: int, test_size: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, test indices) as ``ShuffleSplit`` yields them."""
    n_train, n_test = split_sizes(n_samples, test_size)
    perm = LegacyRandomState(seed).permutation(n_samples)
    return perm[n_test:n_test + n_train], perm[:n_test]


def stratified_shuffle_split(labels: Sequence, test_size: float,
                             seed: int) -> tuple[list[int], list[int]]:
    """(train indices, test indices) as ``StratifiedShuffleSplit`` yields them."""
    n_samples = len(labels)
    n_train, n_test = split_sizes(n_samples, test_size)
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise ValueError("stratify needs at least two classes in labels; turn stratify off")
    index_of = {c: i for i, c in enumerate(classes)}
    y_idx = [index_of[v] for v in labels]
    counts = [0] * len(classes)
    for i in y_idx:
        counts[i] += 1
    if min(counts) < 2:
        rare = [str(classes[i]) for i, c in enumerate(counts) if c < 2]
        raise ValueError(
            f"stratify needs at least 2 rows per class; {rare} have fewer. "
            f"Turn stratify off or add rows")
    if n_train < len(classes) or n_test < len(classes):
        raise ValueError(
            f"stratify with {len(classes)} classes needs at least that many rows in "
            f"each split (train={n_train}, test={n_test}); change test_size")
    # np.argsort(kind="mergesort") is stable: each class keeps its row order.
    class_rows: list[list[int]] = [[] for _ in classes]
    for row, ci in enumerate(y_idx):
        class_rows[ci].append(row)

    rng = LegacyRandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    remaining = [c - n for c, n in zip(counts, n_i, strict=True)]
    t_i = _approximate_mode(remaining, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for ci in range(len(classes)):
        perm = rng.permutation(counts[ci])
        rows = [class_rows[ci][p] for p in perm]
        train.extend(rows[:n_i[ci]])
        test.extend(rows[n_i[ci]:n_i[ci] + t_i[ci]])
    return rng.permutation(train), rng.permutation(test)

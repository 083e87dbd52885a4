"""The cycle collector's young threshold in the long-running processes (cdui/core/collector.py)."""
from __future__ import annotations

import gc

from cdui.core import collector


def test_young_collections_are_made_less_often_and_the_older_thresholds_are_kept() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 3)
        collector.collect_young_less_often()
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 7, 3)
        assert collector.YOUNG_THRESHOLD > 700  # Python's default, which a flood's batches kept setting off
    finally:
        gc.set_threshold(*before)

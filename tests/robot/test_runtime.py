"""``qunbot run``'s process settings."""

from __future__ import annotations

import gc

from robot.runtime import YOUNG_THRESHOLD, tune_gc


def test_tune_gc_freezes_what_start_up_built_and_collects_the_young_generation_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0  # start-up's objects are out of the collector's passes
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle made after start is still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

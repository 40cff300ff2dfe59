"""Process-wide settings for a long-running bot process (``qunbot run`` applies them after start).

Python's cyclic garbage collector runs a young-generation pass every 700 container allocations
and, now and then, a full pass over every live object: the modules, pydantic's and the OpenAI
SDK's types, the plugins. A message makes thousands of short-lived dicts and models, so under
load those passes cost about as much CPU as the messages themselves (``bench/bench_scale.py``:
the model path went from about 1.9 to 1.3 ms of CPU per message). :func:`tune_gc` moves what
start-up built out of the collector's sight (``gc.freeze``) and lets the young generation grow
to 10,000 allocations before a pass: short-lived garbage is still freed by reference counting at
once, cycles a little later.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_gc"]

YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collect once, freeze what survived start-up, and collect the young generation less often.

    For a process's main program, after the bot has started: it is global (a library or a test
    suite should not call it).
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)

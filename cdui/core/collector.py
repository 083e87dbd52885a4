"""How often the cycle collector looks at young objects in the long-running processes (the control
plane, the agent).

Python collects its youngest generation once 700 more container objects have been made than freed.
Objects that die young are freed by their reference counts and never count, so what sets a
collection off is a pipeline holding thousands of live objects: a run logging flat out decodes
its event lines and messages a few hundred events at a time (an event is three or more dicts and
lists), each batch living until it is stored and acknowledged. At 700 a decode of one such batch
set off a few collections, each walking every object of the batch made so far (all of them alive),
and moved them on to older generations walked again later: measured with ``perf`` on a worker flood,
10 % of the agent's CPU and 5 % of the control plane's went to the collector. With the threshold at
:data:`YOUNG_THRESHOLD`, a local and a worker flood of 200,000 events each (bench/events.py's) set off
122 young collections in the control plane instead of 1,634 (0.09 s of collector time instead of
0.30 s) and 102 in the agent instead of 745 (0.07 s instead of 0.24 s): about 0.5 µs of CPU per event
less in each process. A young collection then walks at most a few tens of thousands of objects, about
a millisecond, and cyclic garbage waits as long for it as a few batches take to be made.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def collect_young_less_often() -> None:
    """Raise the youngest generation's threshold to :data:`YOUNG_THRESHOLD` (the older generations'
    thresholds are left as they are)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)

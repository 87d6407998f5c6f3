"""Incremental planning: ``plan()``'s results for a driver that plans again and again over
mostly the same jobs (the simulator), at a cost that follows what changed.

One seam: ``IncrementalPlanner`` (``planner``). It owns what is kept between cycles (the
per-job entries and states, ``memo``; the kept ranking, ``ranking``) and what may be left
out (decisions that change nothing; running jobs no plan can change, ``unchangeable``), and
says why each is exact. Its plans equal ``plan()``'s changes on any sequence of snapshots
(``tests/core/test_incremental.py``). It sits beside ``planning`` in the core's layers:
both decide through ``deciding`` and write through ``writing``, and neither imports the
other.
"""

from edl_scheduler.core.incremental.planner import IncrementalPlanner

__all__ = ["IncrementalPlanner"]

"""How a simulated cluster behaves: the simulator's settings, apart from the policy.

Every setting that only makes a run faster (``prune``, ``incremental``, ``hide``) leaves its
results as they are: the tests compare each with the run that has it off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated cluster behaves; times in seconds. ``tick_s = 0`` turns ticks off."""

    tick_s: float = 60.0
    plan_on_events: bool = True
    resize_pause_s: float = 10.0
    restart_pause_s: float = 30.0
    start_delay_s: float = 0.0
    #: Give the planner the throughput each job measured at the sizes it has run.
    report_throughput: bool = True
    #: Leave out of the snapshot waiting jobs that the policy provably cannot start now,
    #: and leave out a plan that provably changes nothing (``pruning.settled``: a policy
    #: that only starts rigid jobs, and no job below its size can start); results are
    #: identical, only faster.
    prune: bool = True
    #: Plan through an ``IncrementalPlanner`` (it keeps its per-job derivations from plan
    #: to plan and returns only changes) and, under LAS queues, keep a running job's
    #: snapshot Job until its queue changes; results are identical, only faster (False:
    #: ``plan()`` itself, the reference path, for tests).
    incremental: bool = True
    #: Leave out of the snapshot running jobs ranked above every job below its size, where
    #: no plan could change them (``leaving_out``); results are identical, only faster. Off by
    #: default: each snapshot then lacks those jobs (the plan gets their capacity apart),
    #: so a tool that records snapshots to replay them would replay partial ones
    #: (``edl-sim run`` records none and turns it on).
    hide: bool = False

"""How a simulated cluster behaves: the simulator's settings, apart from the policy.

Every setting that only makes a run faster (``prune``, ``incremental``, ``hide``) leaves its
results as they are: the tests compare each with the run that has it off.
"""

from __future__ import annotations

from dataclasses import dataclass

from edl_scheduler.core.policy import MEASURED_SUSPEND_COST_S


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated cluster behaves; times in seconds. ``tick_s = 0`` turns ticks off."""

    tick_s: float = 60.0
    plan_on_events: bool = True
    resize_pause_s: float = 10.0
    #: What a job resumed after suspension pays on top of ``start_delay_s``: its checkpoint
    #: saved and restored and its processes restarted, as measured on the runtime.
    restart_pause_s: float = MEASURED_SUSPEND_COST_S
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

    def describe(self) -> tuple[str, str]:
        """How plans are timed and what a change costs, as a report states them:
        (``"every 60 s and on events"``, ``"resize 10 s, restart 52 s, start 0 s"``)."""
        every = f"every {self.tick_s:g} s" if self.tick_s > 0 else ""
        events = "on events" if self.plan_on_events else ""
        timing = " and ".join(part for part in (every, events) if part) or "never"
        costs = (
            f"resize {self.resize_pause_s:g} s, restart {self.restart_pause_s:g} s, "
            f"start {self.start_delay_s:g} s"
        )
        return timing, costs


#: The engine's own settings, what a Philly, Tiresias or synthetic run gets unless told
#: otherwise: a plan every 60 s and at every arrival and completion, 10 s per resize (the
#: runtime's measured pause, rounded up), 52 s per resume after suspension (the runtime's
#: measured suspension and resume of a 1 GiB checkpoint).
ENGINE_DEFAULTS = SimConfig()
#: The Tiresias simulator's runs: no ticks, no pauses.
EVENT_DRIVEN = SimConfig(tick_s=0.0, resize_pause_s=0.0, restart_pause_s=0.0, start_delay_s=0.0)
#: The Pollux simulator's runs: 60 s rounds, 30 s at every start, restart and resize; what a
#: Pollux workload runs with unless told otherwise.
POLLUX_ROUNDS = SimConfig(
    tick_s=60.0, plan_on_events=False, resize_pause_s=30.0, restart_pause_s=0.0, start_delay_s=30.0
)

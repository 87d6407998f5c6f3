"""A waiting job that cannot start takes nothing: admission's quick reject and its failed
trials change no other decision.

Aspects:
- a statement that is discarded leaves the cluster as it found it: free counts and the
  order in which best-fit placement walks the nodes (seen to fail when a node given
  capacity and taken it back went last in its bucket);
- the quick reject (``Admitter._pool``: what the jobs ``may_shrink`` and ``may_suspend``
  allow could give up) rejects only trials that would fail: on generated snapshots under
  every preset, the plan equals the plan of an admission whose pools are so large that it
  tries every waiting job (seen to fail with suspension's pool counting only jobs that ran
  their minimum time, at every level);
- the reclaim pool counts the equals ranked above the waiting job (seen to fail with it
  counting those ranked below).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edl_scheduler.core import PRESETS, Node, Resources, Role, Snapshot, admitting, plan
from edl_scheduler.core.capacity import Cluster
from edl_scheduler.core.layout import layout_of
from edl_scheduler.core.session import Eligibility, Statement, job_state
from edl_scheduler.core.snapshot import Job, Replica, RoleSpec
from tests.core.strategies import (
    NOW,
    RECLAIMING_ONLY,
    SHRINKING_AFTER_MINIMUM,
    SHRINKING_EQUALS,
    snapshots,
)

_GIB = 2**30
CASES = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _state(cluster: Cluster) -> tuple[object, ...]:
    buckets = [sorted((g, list(b)) for g, b in c.items() if b) for c in cluster.buckets]
    return buckets, cluster.gpu, cluster.cpu, cluster.mem, cluster.class_free_gpu


def test_a_discarded_statement_leaves_the_cluster_as_it_was() -> None:
    tried = 0
    for seed in range(100):
        rng = random.Random(seed)
        count = rng.randint(2, 10)
        nodes = tuple(
            Node(f"n{i}", Resources(rng.choice([4, 8]), 64_000, 512 * _GIB)) for i in range(count)
        )
        worker = RoleSpec(1, 64, Resources(1, 1_000, 4 * _GIB))
        live = [Replica(f"w{i}", Role.WORKER, f"n{rng.randrange(count)}") for i in range(4)]
        job = Job(name="j", worker=worker, submit_time=0.0, replicas=tuple(live))
        layout = layout_of(nodes)
        cluster = Cluster(nodes, layout=layout)
        for r in live:
            cluster.take(cluster.index[r.node], worker.resources)
        js = job_state(job, PRESETS["edl"], Eligibility(layout))
        before = _state(cluster)
        stmt = Statement(cluster)
        for _ in range(rng.randint(1, 6)):
            left = [r for r in js.live_w if r not in js.removed_w]
            if left and rng.random() < 0.5:
                stmt.remove(js, left[0])
            else:
                stmt.add(js, Role.WORKER, rng.randrange(count))
        stmt.discard()
        assert _state(cluster) == before, seed
        for c, bucket in enumerate(cluster.buckets):
            for gpus, listed in bucket.items():  # each bucket in index order
                assert listed == [n for n in cluster.class_nodes[c] if cluster.gpu[n] == gpus]
        tried += 1
    assert tried == 100


class _TriesEverything(admitting.Admitter):
    """Admission without its quick reject: every waiting job's trial runs."""

    def refresh_pools(self) -> None:
        super().refresh_pools()
        huge = [1 << 40] * len(self.s.jobs)
        for pool, on in (
            ("shrinkable", self.shrink_ok),
            ("reclaimable", self.reclaim),
            ("suspendable", self.suspend_ok),
            ("ran_minimum", self.by_minimum),
            ("paid", self.by_paid),
        ):
            if on:
                setattr(self, pool, admitting._Suffixes(list(huge)))

    def _update_pools(self, js: admitting.JobState) -> None:
        pass  # (the pools stay huge)


#: Every preset, and ``edl`` variants under the other rules for shrinking equals.
_POLICIES = {
    **PRESETS,
    **{p.name: p for p in (SHRINKING_EQUALS, SHRINKING_AFTER_MINIMUM, RECLAIMING_ONLY)},
}


@pytest.mark.parametrize("name", sorted(_POLICIES))
@CASES
@given(data=st.data())
def test_the_quick_reject_rejects_only_trials_that_fail(name: str, data: st.DataObject) -> None:
    policy = _POLICIES[name]
    snap: Snapshot = data.draw(
        snapshots(rigid=not policy.elastic, priorities=st.integers(0, 2)), label="snapshot"
    )
    rejecting = plan(snap, policy, NOW)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("edl_scheduler.core.deciding.Admitter", _TriesEverything)
        trying = plan(snap, policy, NOW)
    assert trying.changes == rejecting.changes
    assert trying.reservations == rejecting.reservations


@pytest.mark.parametrize("name", ["edl-shrinking-equals", "edl-fulfillment"])
def test_an_equal_ranked_above_gives_back_its_borrowed_workers(name: str) -> None:
    """The reclaim pool counts the equals ranked *above* the waiting job: ``v`` came first
    and borrowed the whole node long ago; ``j``, of its priority, starts by taking two of
    its workers (seen to fail with that pool counting equals ranked below)."""
    gpu = Resources(1, 100, 2**20)
    v = Job(
        name="v",
        worker=RoleSpec(1, 4, gpu),
        submit_time=NOW - 9_000,
        start_time=NOW - 9_000,
        replicas=tuple(Replica(f"v-w{i}", Role.WORKER, "n0") for i in range(4)),
    )
    j = Job(name="j", worker=RoleSpec(2, 2, gpu), submit_time=NOW - 10)
    snap = Snapshot((Node("n0", Resources(4, 64_000, 2**36)),), (v, j))
    decided = plan(snap, _POLICIES[name], NOW)
    assert decided.decision("j").workers.target == 2, decided.describe()
    assert decided.decision("v").workers.target == 2
    assert decided.decision("v").for_job == "j"

"""A faulty network between a real worker process and its real coordinator process
(`proxy.FaultyProxy`), framework-free workers, exactly-once checked from their ledger files.

Aspects:
- a delay of 300 ms on every chunk, both ways, for every worker: the job finishes, every
  sample trained exactly once, and the delay is not taken for a departure (the generation
  never changes, though the liveness timeout is 4 s and each call takes 0.6 s or more);
- a partition (blackhole: nothing relayed, nothing closed) longer than the coordinator's
  liveness timeout (`--lease-timeout-s 2`), struck while the worker holds a shard: the
  coordinator declares the worker gone within about that timeout (its server pings each
  connection), the shard goes back and another worker trains it, the job goes on; when the
  partition heals, the cut-off worker's commit of that shard is refused, it stops as
  fenced (exit 3), and the job finishes with no sample lost or repeated;
- the same with the connections cut (closed) instead: the worker departs at once, and is
  fenced alike when it comes back.
"""

from __future__ import annotations

import json
import time

import pytest

from trainer_runtime.plain_worker import EXIT_FENCED

from .harness import Cluster, waiting_for
from .ledger_files import checking_exactly_once, reading
from .proxy import FaultyProxy

WORKER = ["-m", "trainer_runtime.plain_worker"]


def coordinator_args(samples: int, lease_timeout_s: float) -> list[str]:
    return [
        "--samples", str(samples), "--shard-size", "10", "--epochs", "1",
        "--mode", "independent", "--join-window-s", "0.1",
        "--lease-timeout-s", str(lease_timeout_s),
    ]  # fmt: skip


def worker(cluster: Cluster, name: str, step_time_s: float, via: str | None = None) -> None:
    ledger = cluster.root / f"{name}.ledger"
    argv = [*WORKER, "--step-time-s", str(step_time_s), "--ledger-file", str(ledger)]
    cluster.starting_worker(name, argv, coordinator=via)


def leases_of(cluster: Cluster, name: str) -> list[tuple[int, int, int, int]]:
    """(lease, epoch, start, stop) of every shard `name` holds, from the coordinator."""
    ledger = json.loads(cluster.client().snapshot())["ledger"]
    return [(int(i), int(e), int(a), int(b)) for i, h, e, a, b in ledger["leases"] if h == name]


def test_a_delayed_network_changes_nothing_but_speed(cluster: Cluster) -> None:
    samples = 300
    cluster.starting_coordinator(*coordinator_args(samples, lease_timeout_s=4.0))
    with FaultyProxy(("127.0.0.1", cluster.port)) as proxy:
        proxy.delaying(300)
        for name in ("w0", "w1", "w2"):
            worker(cluster, name, 0.05, via=proxy.address)
        client = cluster.client()
        waiting_for(lambda: len(client.progress().members) == 3, 60, "three workers")
        generation = client.progress().generation
        slow = cluster.client(proxy.address)
        slow.progress()  # connected
        started = time.monotonic()
        slow.progress()
        assert time.monotonic() - started >= 0.6, "the proxy did not delay the round trip"
        slow.close()
        generations: set[int] = set()

        def finished() -> bool:  # and, until then, the generation the three formed
            progress = client.progress()
            generations.add(progress.generation if not progress.finished else generation)
            return bool(progress.finished)

        waiting_for(finished, 120, "the job to finish")
        for name in ("w0", "w1", "w2"):
            assert cluster.waiting_exit(name, 30) == 0, cluster.log(name)
    assert generations == {generation}, "a delayed worker was taken as gone"
    assert "lost its connection" not in cluster.log("coordinator")
    checking_exactly_once(cluster.root, samples, 1)


@pytest.mark.parametrize("fault", ["blackholing", "cutting"])
def test_a_worker_cut_off_past_its_lease_is_fenced_and_nothing_repeats(
    cluster: Cluster, fault: str
) -> None:
    samples, lease_timeout_s = 3000, 2.0
    cluster.starting_coordinator(*coordinator_args(samples, lease_timeout_s))
    with FaultyProxy(("127.0.0.1", cluster.port)) as proxy:
        worker(cluster, "w0", 0.05)
        worker(cluster, "w1", 0.05)
        # the cut-off worker trains slowly, so that the fault strikes while it holds a shard
        worker(cluster, "far", 2.0, via=proxy.address)
        client = cluster.client()

        def members() -> set[str]:
            return {m.worker_id for m in client.progress().members}

        waiting_for(lambda: members() == {"w0", "w1", "far"}, 60, "three workers")
        waiting_for(lambda: bool(leases_of(cluster, "far")), 30, "the far worker's shard")
        ((lease, epoch, start, stop),) = leases_of(cluster, "far")
        getattr(proxy, fault)()
        struck = time.monotonic()
        done_before = client.progress().samples_done
        waiting_for(lambda: "far" not in members(), lease_timeout_s * 3, "the far worker to go")
        gone_s = time.monotonic() - struck
        assert not leases_of(cluster, "far"), "its shard did not go back"

        def trained_by_others() -> bool:
            paths = [cluster.root / "w0.ledger", cluster.root / "w1.ledger"]
            intents, done = reading(p for p in paths if p.exists())
            return any(intents[key] == (epoch, start, stop) for key in done & intents.keys())

        waiting_for(trained_by_others, 30, f"another worker to train samples {start}-{stop}")
        assert client.progress().samples_done > done_before, "the job stopped with the fault"
        assert not client.progress().finished, "heal before the end, while the others train"
        proxy.passing()
        assert cluster.waiting_exit("far", 30) == EXIT_FENCED, cluster.log("far")[-2000:]
    intents, done = reading([cluster.root / "far.ledger"])
    assert ("far", lease) in intents, "the far worker never tried to commit its shard"
    assert ("far", lease) not in done, "its late commit was kept: the shard counts twice"
    waiting_for(lambda: client.progress().finished, 90, "the job to finish")
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 30) == 0, cluster.log(name)
    checking_exactly_once(cluster.root, samples, 1)
    assert gone_s <= lease_timeout_s + 2.0, f"declared gone {gone_s:.1f} s after the fault"

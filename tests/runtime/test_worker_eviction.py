"""Workers sent SIGTERM, as the kubelet does when it evicts or deletes their pod: a drained
leave (see `trainer_runtime/agent.py`), under real processes.

Aspects:
- a framework-free worker sent SIGTERM while it holds a shard finishes that shard, commits
  it, leaves (no departure by a lost connection) and exits 0 within a bound; the job goes
  on with the others, and every sample is trained exactly once;
- PyTorch (gloo): a worker that is not rank 0, sent SIGTERM, leaves and exits 0 while the
  other trains on; then the last one, rank 0, sent SIGTERM as when the job's pods are all
  deleted, exits 0 with its last complete step committed (the coordinator's committed step
  is the step its state reached) and checkpointed; a fresh worker resumes from there, and
  every per-sample counter ends at exactly the number of epochs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer_runtime.torch.checkpointing import stored_steps

from .harness import Cluster, waiting_for
from .ledger_files import checking_exactly_once, reading
from .test_network_faults import leases_of
from .test_torch_elastic import coordinator_args, job_args

#: A bound on leaving after SIGTERM: the step in progress plus a commit and a goodbye,
#: well inside the kubelet's default grace period of 30 s.
LEAVE_S = 15


def test_a_plain_worker_sent_sigterm_commits_its_shard_and_leaves(cluster: Cluster) -> None:
    samples = 2000
    cluster.starting_coordinator(
        "--samples", str(samples), "--shard-size", "10", "--epochs", "1",
        "--mode", "independent", "--join-window-s", "0.1",
    )  # fmt: skip
    for name, step_time_s in (("w0", "0.05"), ("evicted", "2.0")):
        ledger = cluster.root / f"{name}.ledger"
        cluster.starting_worker(
            name,
            ["-m", "trainer_runtime.plain_worker", "--step-time-s", step_time_s,
             "--ledger-file", str(ledger)],
        )  # fmt: skip
    client = cluster.client()
    waiting_for(lambda: len(client.progress().members) == 2, 60, "two workers")
    waiting_for(lambda: bool(leases_of(cluster, "evicted")), 30, "a shard in the evicted's hands")
    ((lease, *_),) = leases_of(cluster, "evicted")
    cluster.terminating("evicted")
    assert cluster.waiting_exit("evicted", LEAVE_S) == 0, cluster.log("evicted")[-2000:]
    _, done = reading([cluster.root / "evicted.ledger"])
    assert ("evicted", lease) in done, "the shard it held was not committed"
    assert "SIGTERM" in cluster.log("evicted")
    assert "evicted lost its connection" not in cluster.log("coordinator"), "it died, not left"
    assert {m.worker_id for m in client.progress().members} == {"w0"}
    assert not client.progress().finished
    waiting_for(lambda: client.progress().finished, 90, "the job to finish")
    assert cluster.waiting_exit("w0", 30) == 0, cluster.log("w0")
    checking_exactly_once(cluster.root, samples, 1)


def steps_at(trace: Path, world: int) -> int:
    """Steps the workers traced at world size `world` (`step TIME gGEN WORLD PID` lines)."""
    lines = trace.read_text().splitlines() if trace.exists() else []
    return sum(1 for line in lines if line.startswith("step ") and line.split()[3] == str(world))


def test_torch_workers_sent_sigterm_leave_with_their_last_step_committed(
    cluster: Cluster,
) -> None:
    samples, epochs = 400, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out, checkpoints = cluster.root / "out", cluster.root / "checkpoints"
    trace = cluster.root / "trace"
    args = [*job_args("ledger", samples, out, batch=8, sleep_s=0.1), "--trace", str(trace)]
    extra = {"EDL_CHECKPOINT_DIR": str(checkpoints)}
    client = cluster.client()

    def step() -> int:
        return int(client.progress().committed_step)

    def advancing(by: int) -> None:
        target = step() + by
        waiting_for(lambda: step() >= target, 90, f"step {target}")

    for name in ("w0", "w1"):
        cluster.starting_worker(name, args, extra)
    waiting_for(lambda: len(client.progress().members) == 2, 90, "two workers")
    # past the pair's second step, where DDP rebuilds its buckets with a collective: a peer
    # gone then fails the survivor's forward, outside the session ("Found, not fixed" in
    # docs/runtime.md)
    waiting_for(lambda: steps_at(trace, world=2) >= 8, 90, "four steps of the pair")
    rank0, rank1 = (m.worker_id for m in client.progress().members)
    cluster.terminating(rank1)
    assert cluster.waiting_exit(rank1, LEAVE_S) == 0, cluster.log(rank1)[-3000:]
    waiting_for(lambda: len(client.progress().members) == 1, 30, "the survivor alone")
    advancing(5)
    assert not client.progress().finished
    cluster.terminating(rank0)  # the job's last worker: as when its pods are all deleted
    assert cluster.waiting_exit(rank0, LEAVE_S) == 0, cluster.log(rank0)[-3000:]
    reached = json.loads((out / f"{rank0}.json").read_text())["step"]
    assert step() == reached, "rank 0 left without committing the steps it applied"
    assert stored_steps(checkpoints)[0] == reached, "rank 0 left no checkpoint of its step"
    assert not client.progress().members and not client.progress().finished
    cluster.starting_worker("w2", args, extra)
    assert cluster.waiting_exit("w2", 120) == 0, cluster.log("w2")[-3000:]
    assert client.progress().finished
    counts = torch.load(Path(out / "w2.pt"))["counts"]
    assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))

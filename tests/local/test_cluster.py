"""The local cluster's observe-plan-act loop, in-process, on real worker processes.

Aspects tested:
- a high-priority job shrinks a low-priority one gracefully (survivors keep their PIDs), the
  low one grows back when the high one finished, and the coordinator's ledger counts every
  sample exactly once
- failed workers are replaced until failurePolicy.maxRestarts, then the job Fails, with the
  exit code and the worker's last log line in its Events; a failing coordinator is charged to
  the same budget
- bad requests (too many slots, no command, no dataset options or ones the coordinator
  refuses, PriorityClass, duplicate names, unknown jobs, min > max, a log outside the
  job's) are refused with the field and the fix, changing nothing
- delete stops a job's processes; a job submitted again under the same name runs afresh
  (not from its predecessor's ledger)
- a maximum lowered below what runs drains the surplus gracefully, and other jobs are
  planned meanwhile
(suspend/resume and adoption after a service restart are tested through edlctl, in
tests/cli/test_local_cli.py)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from edl_scheduler.api import JobPhase, load_training_job
from edl_scheduler.local.config import build_config
from edl_scheduler.local.controlling import ErrorKind, LocalCluster, LocalError
from edl_scheduler.local.processes import ProcessSupervisor
from edl_scheduler.local.storing import Store

from .jobs import plain_job

pytestmark = pytest.mark.slow


class Harness:
    def __init__(self, home: Path, slots: int = 4) -> None:
        self.home = home
        self.slots = slots
        self.open()

    def open(self) -> None:
        self.store = Store(self.home / "state.db")
        self.supervisor = ProcessSupervisor()
        self.cluster = LocalCluster(
            build_config(self.home, self.slots, None), self.store, self.supervisor
        )

    def submit(self, yaml_text: str) -> str:
        job = load_training_job(yaml_text)
        self.cluster.submit(job, str(self.home))
        return job.key

    def phase(self, key: str) -> JobPhase:
        return self.cluster.get(key).job.status.phase

    def pids(self, key: str, draining: bool = False) -> set[int]:
        return {
            w.pid for w in self.store.workers(key) if w.pid is not None and w.draining == draining
        }

    def until(self, what: str, predicate: Callable[[], bool], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.cluster.cycle()
            if predicate():
                return
            time.sleep(0.2)
        told = {r.key: self.store.events(r.key) for r in self.store.jobs()}
        first = min((e.time for rows in told.values() for e in rows), default=0.0)
        events = {  # with seconds since the first, to tell which step was slow
            key: [(round(e.time - first, 1), e.reason, e.message) for e in rows]
            for key, rows in told.items()
        }
        # Events tell only phase changes: what each job's last plan said of it (a job held
        # below its maximum says why), its worker rows and the throughput it planned on.
        now = {
            r.key: {
                "phase": r.job.status.phase.value,
                "replicas": r.job.status.replicas,
                "message": r.job.status.message,
                "workers": [
                    (w.name, w.pid, w.slots, w.draining) for w in self.store.workers(r.key)
                ],
                "throughput": [
                    (t.workers, round(t.samples_per_second)) for t in r.job.status.throughput
                ],
            }
            for r in self.store.jobs()
        }
        raise AssertionError(f"timed out waiting for {what}; events: {events}; now: {now}")

    def close(self) -> None:
        self.supervisor.close(grace_s=5)
        self.store.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "home")
    yield h
    h.close()


def members(h: Harness, key: str) -> int:
    progress = h.cluster.progress(key)
    return len(progress.members) if progress is not None else 0


SAMPLES = 30000


def test_priority_shrinks_gracefully_and_the_job_grows_back(harness: Harness) -> None:
    h = harness
    # Enough work that the low job outlasts the high one plus its cool-down however slow
    # the machine: the test takes about a minute here, and the job would take 95 s at 2
    # workers; with 12,000 samples a slow CI machine once saw it end before growing back.
    low = h.submit(plain_job("low", 1, 4, priority=10, samples=SAMPLES, step_time_s=0.1))
    h.until("low runs 4 workers", lambda: members(h, low) == 4)
    before = h.pids(low)
    assert len(before) == 4
    high = h.submit(plain_job("high", 2, 2, priority=100, samples=320))
    h.until("high starts", lambda: h.cluster.get(high).job.status.replicas == 2)
    survivors = h.pids(low)
    assert len(survivors) == 2 and survivors <= before  # shrunk without restarting anyone
    h.until("high succeeds", lambda: h.phase(high) is JobPhase.SUCCEEDED)
    h.until("low grows back", lambda: h.cluster.get(low).job.status.replicas == 4)
    assert survivors <= h.pids(low)
    h.until("low succeeds", lambda: h.phase(low) is JobPhase.SUCCEEDED, timeout_s=180)
    reasons = [e.reason for e in h.store.events(low)]
    assert reasons.index("Shrunk") < reasons.index("Grew")
    assert "WorkerFailed" not in reasons
    resizes = [(r.from_replicas, r.to_replicas) for r in h.store.resizes(low)]
    assert (4, 2) in resizes and (2, 4) in resizes
    done = h.cluster.get(low).job.status.progress
    assert done["samplesDone"] == SAMPLES and done["finished"]
    assert h.cluster.get(low).job.status.restarts == 0


def test_a_maximum_lowered_below_what_runs_drains_the_surplus(harness: Harness) -> None:
    """``scale --max`` below the live size: the newest worker drains at a step boundary, the
    survivor keeps its PID, no sample is lost, and a job submitted meanwhile is planned."""
    h = harness
    key = h.submit(plain_job("lr2", 1, 2, samples=6000, step_time_s=0.05))
    h.until("lr2 runs 2 workers", lambda: members(h, key) == 2)
    before = h.pids(key)
    h.cluster.scale(key, None, 1)
    other = h.submit(plain_job("other", 1, 1, samples=400))
    h.until("lr2 is down to 1 worker", lambda: members(h, key) == 1 and len(h.pids(key)) == 1)
    assert h.pids(key) < before  # the survivor was not restarted
    h.until("the other job succeeds", lambda: h.phase(other) is JobPhase.SUCCEEDED)
    h.until("lr2 succeeds", lambda: h.phase(key) is JobPhase.SUCCEEDED, timeout_s=180)
    status = h.cluster.get(key).job.status
    assert status.restarts == 0 and status.progress["samplesDone"] == 6000
    reasons = [e.reason for e in h.store.events(key)]
    assert "WorkerFailed" not in reasons and "SetAside" not in reasons
    assert [(r.from_replicas, r.to_replicas) for r in h.store.resizes(key)][-1] == (2, 1)


def test_failed_workers_are_replaced_until_the_budget_is_spent(harness: Harness) -> None:
    h = harness
    crash = [sys.executable, "-c", "import sys; print('bad input file'); sys.exit(3)"]
    key = h.submit(plain_job("crash", 1, 1, command=crash, max_restarts=2))
    h.until("the job fails", lambda: h.phase(key) is JobPhase.FAILED, timeout_s=90)
    failures = [e for e in h.store.events(key) if e.reason == "WorkerFailed"]
    assert len(failures) == 3
    assert all("exit code 3" in e.message and "bad input file" in e.message for e in failures)
    status = h.cluster.get(key).job.status
    assert status.restarts == 3 and "maxRestarts (2)" in status.message
    assert not h.store.workers(key)
    # The cluster carries on: another job runs to the end.
    other = h.submit(plain_job("other", 1, 2, samples=400))
    h.until("the other job succeeds", lambda: h.phase(other) is JobPhase.SUCCEEDED)


def test_a_coordinator_that_keeps_failing_spends_the_budget(harness: Harness) -> None:
    """Each crash of the coordinator (here SIGKILL) is charged like a worker's failure and
    it restarts from its state file, until the budget is spent: not restarted forever."""
    h = harness
    key = h.submit(plain_job("shaky", 1, 1, samples=10**7, max_restarts=1))
    killed: list[int] = []

    def kill_the_next_coordinator() -> bool:
        pid = h.cluster.get(key).coordinator_pid
        if pid is not None and pid not in killed and psutil.pid_exists(pid):
            psutil.Process(pid).kill()
            killed.append(pid)
        return h.phase(key) is JobPhase.FAILED

    h.until("the job fails", kill_the_next_coordinator, timeout_s=90)
    failures = [e for e in h.store.events(key) if e.reason == "CoordinatorFailed"]
    assert len(killed) == 2 and len(failures) == 2
    assert all("exit code" in e.message for e in failures)
    assert [e.message.rsplit(" ", 1)[1] for e in failures] == ["[1/1]", "[2/1]"]
    status = h.cluster.get(key).job.status
    assert status.restarts == 2 and "maxRestarts (1)" in status.message
    assert not h.store.workers(key)


def test_bad_requests_are_refused_and_change_nothing(harness: Harness) -> None:
    h = harness

    def refused(kind: ErrorKind, fragment: str, action: Callable[[], object]) -> None:
        with pytest.raises(LocalError) as caught:
            action()
        assert caught.value.kind is kind
        assert fragment in str(caught.value)

    refused(ErrorKind.INVALID, "this local cluster has 4", lambda: h.submit(plain_job("big", 5, 6)))
    no_command = plain_job("nocmd").replace("command:", "args:")
    refused(ErrorKind.INVALID, "command: is required", lambda: h.submit(no_command))
    no_samples = plain_job("nosamples").replace("--samples 2000 ", "")
    refused(ErrorKind.INVALID, "--samples 4096", lambda: h.submit(no_samples))
    lots = plain_job("lots").replace("--samples 2000 ", "--samples lots ")
    refused(ErrorKind.INVALID, "'lots' is not a whole number", lambda: h.submit(lots))
    unknown = plain_job("unknown").replace("--samples 2000 ", "--samples 2000 --bogus 1 ")
    refused(ErrorKind.INVALID, "unrecognized arguments: --bogus", lambda: h.submit(unknown))
    classy = plain_job("classy").replace("priority: 0", "priorityClassName: high")
    refused(ErrorKind.INVALID, "give spec.priority", lambda: h.submit(classy))
    assert h.store.jobs() == []
    key = h.submit(plain_job("ok", 1, 2))
    refused(ErrorKind.CONFLICT, "already exists", lambda: h.submit(plain_job("ok", 1, 2)))
    refused(ErrorKind.NOT_FOUND, "does not exist", lambda: h.cluster.scale("default/nope", 1, 2))
    refused(ErrorKind.NOT_FOUND, "does not exist", lambda: h.cluster.delete("default/nope"))
    refused(ErrorKind.INVALID, "below min", lambda: h.cluster.scale(key, 3, 2))
    refused(ErrorKind.INVALID, "has 4", lambda: h.cluster.scale(key, 5, 8))
    refused(ErrorKind.INVALID, "at most 10000", lambda: h.cluster.scale(key, 1, 20_000))
    h.cluster.cycle()  # the job is still read and planned
    outside = h.home / "default.ok.secret.log"
    outside.write_text("not a log of the job")
    refused(ErrorKind.NOT_FOUND, "no log", lambda: h.cluster.log_path(key, "../default.ok.secret"))
    refused(ErrorKind.NOT_FOUND, "no log", lambda: h.cluster.log_path(key, "nobody"))
    spec = h.cluster.get(key).job.spec
    assert (spec.min_replicas, spec.max_replicas) == (1, 2)
    assert [r.key for r in h.store.jobs()] == [key]


def test_delete_stops_the_processes(harness: Harness) -> None:
    h = harness
    key = h.submit(plain_job("doomed", 2, 2, samples=100000, step_time_s=0.1))
    h.until(
        "it runs", lambda: len(h.pids(key)) == 2 and h.cluster.get(key).coordinator_pid is not None
    )
    pids = h.pids(key) | {h.cluster.get(key).coordinator_pid or 0}
    h.cluster.delete(key)
    assert h.store.jobs() == []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def test_a_job_submitted_again_under_its_name_runs_afresh(harness: Harness) -> None:
    h = harness
    key = h.submit(plain_job("again", samples=160, step_time_s=0.01))
    h.until("the first run Succeeded", lambda: h.phase(key) is JobPhase.SUCCEEDED, 60)
    first = h.cluster.get(key).job.status.start_time
    h.cluster.delete(key)
    key = h.submit(plain_job("again", samples=160, step_time_s=0.01))
    h.until("the second run Succeeded", lambda: h.phase(key) is JobPhase.SUCCEEDED, 60)
    status = h.cluster.get(key).job.status
    assert status.start_time is not None and first is not None and status.start_time > first
    reasons = [e.reason for e in h.store.events(key)]
    assert "WorkerStarted" in reasons, "it trained again, not read its predecessor's ledger"
    assert status.progress["samplesDone"] == 160


def _alive(pid: int) -> bool:
    """Running and not a zombie; a process that ends between two questions is not alive."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

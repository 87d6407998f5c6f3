"""What happens to a job's pods when they leave, as against what the plan asks for.

``deciding`` applies the plan's moves; this module holds the rules for pods that go for
other reasons: a job that finished (its pods cleared, the coordinator last), replica pods
that exited (removed, and charged against ``failurePolicy.maxRestarts`` when the job is to
blame), replicas on deleted or cordoned nodes, drains past their deadline, and a job that
its spec suspends. They are rules 2 to 5 of ``deciding``'s docstring, and the suspension of
rule 6; and the pods of a job its user deleted (``orphans``).

Pure, like ``deciding``: each function reads one job's ``JobCycle`` and adds intents, status
fields and counts to it. What must stay true: a pod is deleted at most once per cycle
(``cycle.removed``), a running replica leaves gracefully (drained through its coordinator)
wherever the rule allows it, and only a failure the job caused (a replica's, or its
coordinator's) costs it a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable

from edl_scheduler.api import JobPhase
from edl_scheduler.controller.intents import (
    DeleteOrphan,
    Drain,
    EventReason,
    EventType,
    JobCycle,
    MarkDraining,
)
from edl_scheduler.controller.naming import LABEL_JOB
from edl_scheduler.controller.podstate import (
    Obj,
    draining_since,
    exit_of,
    iso_time,
    meta_of,
    phase_of,
    refused_at_admission,
    step_toward,
    terminating,
    timestamp_of,
)

log = logging.getLogger("edl.controller.deciding")


def clear_away(cycle: JobCycle, succeeded: bool, keep_coordinator: bool = False) -> None:
    """A succeeded job's pods go once they have exited, the others at the job's drain
    deadline after its completion time: a worker told that the job finished may still be
    writing its output, and SIGTERM would cut that off. The coordinator goes last, when no
    replica runs any more (the workers' goodbyes go to it), and never with
    ``keep_coordinator``. A failed job is cleared at once: its workers have nothing to
    finish."""
    view = cycle.view
    ended = timestamp_of(cycle.status.get("completionTime")) or cycle.now
    overdue = not succeeded or cycle.now >= ended + cycle.tj.spec.timeouts.drain_seconds
    running = False
    for pod in view.replicas:
        if terminating(pod):
            continue
        if overdue or phase_of(pod) in ("Succeeded", "Failed"):
            cycle.delete(pod)
        else:
            running = True
    coordinator = view.coordinator
    if coordinator is not None and not (terminating(coordinator) or running or keep_coordinator):
        cycle.delete(coordinator)


def finish(cycle: JobCycle, phase: JobPhase, reason: EventReason, message: str) -> None:
    """The job ends in ``phase`` (along ``JobPhase``'s diagram): its completion time, its
    time from submission counted, one Event, and its replicas cleared (``clear_away``).

    Its coordinator stays until a later cycle sees the final phase through the watch
    (``JobView.status_unseen`` false; ``clear_away`` then removes it). The next cycle
    already plans on the status queued here; removed while that write is still in flight,
    a write that is lost (the controller killed) or not yet seen (a cache behind) would
    leave a job that looks unfinished with no coordinator, and the plan would start it
    again from the coordinator's last saved snapshot, training a second time what was
    committed since (``benchmarks/controller_recovery.py`` found it twice, seed 7)."""
    view = cycle.view
    current = JobPhase(cycle.status.get("phase", JobPhase.PENDING))
    cycle.status["phase"] = step_toward(current, phase).value
    if JobPhase(cycle.status["phase"]).final:
        cycle.status["completionTime"] = iso_time(cycle.now)
        cycle.status["replicas"] = 0
        cycle.status["allocation"] = {}
        submitted = timestamp_of(cycle.status.get("submitTime")) or timestamp_of(
            meta_of(view.body).get("creationTimestamp")
        )
        if submitted is not None:
            cycle.out.counts.completed_s.append(max(0.0, cycle.now - submitted))
        cycle.emit(
            EventType.NORMAL if phase is JobPhase.SUCCEEDED else EventType.WARNING,
            reason,
            message,
        )
    cycle.status["message"] = message
    if view.progress is not None:
        # The last answer, which says finished; the status otherwise keeps the poll before it.
        cycle.status["progress"] = view.progress.as_status()
    clear_away(cycle, succeeded=phase is JobPhase.SUCCEEDED, keep_coordinator=True)


def replace_finished(cycle: JobCycle) -> None:
    """Exited replica pods are removed (the planner places their replacements); a failure
    the job caused counts in ``cycle.restarts``. An exited coordinator is removed too and
    replaced from its saved state; its failure counts as well."""
    for pod in cycle.view.replicas:
        if terminating(pod) or phase_of(pod) not in ("Succeeded", "Failed"):
            continue
        name = str(meta_of(pod)["name"])
        leaving = draining_since(pod) is not None
        if phase_of(pod) == "Succeeded" and not leaving:
            # A worker exits 0 unasked when its coordinator has committed the last epoch:
            # replacing it would only start a worker with nothing to do.
            cycle.deferred = True
            if not cycle.view.coordinator_ready:
                # Whether the job finished is not known yet (a restarted controller has not
                # heard its coordinator): the pod stays, and the job's new replicas wait
                # with it, until the coordinator answers (its first answer starts a cycle).
                continue
        if phase_of(pod) == "Failed" and not leaving:
            if refused_at_admission(pod):
                cycle.emit(
                    EventType.WARNING,
                    EventReason.REFUSED_AT_ADMISSION,
                    f"{name} was refused by node {pod.get('spec', {}).get('nodeName')} "
                    f"({pod.get('status', {}).get('reason')}): planning again",
                )
            elif not cycle.view.coordinator_ready:
                log.info(
                    "%s: %s failed before its coordinator answered: replaced, not charged",
                    cycle.tj.key,
                    name,
                )
            else:
                cycle.restarts += 1
                cycle.emit(
                    EventType.WARNING,
                    EventReason.REPLICA_FAILED,
                    f"{name} failed ({cycle.restarts} of "
                    f"{cycle.tj.spec.failure_policy.max_restarts} restarts used)",
                )
        cycle.delete(pod)
    coordinator = cycle.view.coordinator
    if (
        coordinator is not None
        and not terminating(coordinator)
        and phase_of(coordinator) in ("Succeeded", "Failed")
    ):
        if phase_of(coordinator) == "Failed":
            _coordinator_failed(cycle, coordinator)
        cycle.delete(coordinator)  # replaced below, from its saved state


def _coordinator_failed(cycle: JobCycle, pod: Obj) -> None:
    """A failed coordinator costs its job a restart, as a replica's failure does, unless its
    node refused it at admission: replaced from its saved state each time it fails, one that
    keeps failing (a crash at start, a state it cannot load) would otherwise be replaced
    forever, unseen. The Event says how it ended."""
    name = str(meta_of(pod)["name"])
    if refused_at_admission(pod):
        cycle.emit(
            EventType.WARNING,
            EventReason.REFUSED_AT_ADMISSION,
            f"{name} was refused by node {pod.get('spec', {}).get('nodeName')} "
            f"({pod.get('status', {}).get('reason')}): replaced from its saved state",
        )
        return
    cycle.restarts += 1
    cycle.emit(
        EventType.WARNING,
        EventReason.COORDINATOR_FAILED,
        f"{name} failed ({exit_of(pod)}): replaced from its saved state "
        f"({cycle.restarts} of {cycle.tj.spec.failure_policy.max_restarts} restarts used)",
    )


def leave_lost_nodes(
    cycle: JobCycle, known: frozenset[str] | None, unschedulable: frozenset[str]
) -> None:
    """Replicas on a deleted node (one not in ``known``; None: unknown, nothing is moved) are
    deleted; those on an ``unschedulable`` (cordoned or failing) node leave gracefully.
    Either way the planner no longer counts them and places replacements on other nodes."""
    for pod in cycle.view.replicas:
        name = str(meta_of(pod)["name"])
        node = str(pod.get("spec", {}).get("nodeName", ""))
        if name in cycle.removed or terminating(pod) or phase_of(pod) in ("Succeeded", "Failed"):
            continue
        if known is not None and node not in known:
            cycle.delete(pod)
        elif node in unschedulable and draining_since(pod) is None:
            if phase_of(pod) != "Running":
                cycle.delete(pod)
                continue
            ns = cycle.tj.metadata.namespace
            cycle.out.intents.append(MarkDraining(ns, name, cycle.now))
            cycle.out.intents.append(Drain(cycle.tj.key, name))
            cycle.emit(
                EventType.NORMAL,
                EventReason.SCALED_DOWN,
                f"{name} leaves node {node}, which takes no new work; it is replaced elsewhere",
            )


def suspend(cycle: JobCycle) -> None:
    """``spec.suspend``: every replica leaves (running ones drain, the others are deleted);
    the coordinator and its saved state stay, so the job resumes where it stopped."""
    victims: list[str] = []
    for pod in cycle.view.replicas:
        name = str(meta_of(pod)["name"])
        if name in cycle.removed or terminating(pod) or draining_since(pod) is not None:
            continue
        if phase_of(pod) in ("Succeeded", "Failed"):
            continue
        victims.append(name)
        if phase_of(pod) == "Running":
            cycle.out.intents.append(MarkDraining(cycle.tj.metadata.namespace, name, cycle.now))
            cycle.out.intents.append(Drain(cycle.tj.key, name))
        else:
            cycle.delete(pod)
    if victims:
        cycle.emit(EventType.NORMAL, EventReason.SUSPENDED,
                   f"suspended by its spec; victims: {', '.join(victims)}")  # fmt: skip
        cycle.status["lastResize"] = {
            "time": iso_time(cycle.now),
            "from": len(victims),
            "to": 0,
            "reason": "UserSuspended",
        }
        cycle.status["resizes"] = int(cycle.status.get("resizes", 0)) + 1


def orphans(
    pods: Iterable[Obj], jobs: Collection[str], serves: Callable[[str], bool]
) -> list[DeleteOrphan]:
    """The live pods, in a namespace the controller ``serves``, of jobs not in ``jobs`` (the
    keys of every TrainingJob the watch lists): a job its user deleted. Their owner
    reference lets the garbage collector remove them, but it may take seconds to tens of
    seconds, while they hold their node's room and the plan counts them; so the controller
    deletes them itself, each once a live read says that its job is gone (``DeleteOrphan``):
    a cache that lags behind a new job's pods never costs that job a pod."""
    out: list[DeleteOrphan] = []
    for pod in pods:
        meta = meta_of(pod)
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        if job is None or terminating(pod):
            continue
        namespace = str(meta.get("namespace", "default"))
        if f"{namespace}/{job}" not in jobs and serves(namespace):
            out.append(DeleteOrphan(namespace, str(meta["name"]), str(job)))
    return out


def delete_overdue_drains(cycle: JobCycle) -> None:
    """A draining replica still there at its drain deadline is deleted (and handled as a
    failure by the coordinator: its leases go back)."""
    for pod in cycle.view.replicas:
        since = draining_since(pod)
        if (
            since is not None
            and not terminating(pod)
            and cycle.now >= since + cycle.tj.spec.timeouts.drain_seconds
        ):
            cycle.delete(pod)

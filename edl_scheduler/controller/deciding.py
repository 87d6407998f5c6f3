"""What to do about each job this cycle: the planner's Plan and the job's pods -> intents.

Pure, like the planner: it reads what observing saw, the plan, the coordinators' progress and
the clock, and returns intents (create this pod, drain that worker, write this status, post
this Event) for ``actuating`` to carry out. Nothing here talks to Kubernetes, so every rule
below is tested without an API server. The intents and a job's working state are in
``intents``, the readers of pod JSON in ``podstate``, rules 2 to 5 and the suspension of
rule 6 (what happens to pods that leave, as against what the plan asks) in ``leaving``,
rule 7 and the plan's Events in ``statusing``.

The rules, per job, in order:
1. A job whose spec is invalid (or names an unknown PriorityClass) stays Pending with the
   condition ``Valid=False`` and a Warning Event saying why; it gets no pods.
2. A job in a final phase keeps no pods: a failed job's go at once; a succeeded job's as
   they exit, the rest at its drain deadline, the coordinator last.
3. Its coordinator reports the last epoch committed: Succeeded, its pods cleared as in 2.
4. Finished replica pods are removed. A failed one that was not leaving counts against
   ``failurePolicy.maxRestarts`` unless the kubelet refused it at admission (then the cluster
   changed under the plan: plan again, the job is not charged) or its job's coordinator has
   not answered yet (it gave up waiting for one that is still starting: not its fault).
   A failed coordinator counts too (unless refused at admission) and is replaced from its
   saved state. Past the budget: Failed.
5. A replica on a deleted node is deleted, one on a cordoned (or not Ready) node drains;
   the planner places their replacements elsewhere. A draining replica still there at its
   drain deadline is deleted.
6. The plan's moves: new replicas on the planned nodes, named victims drained through the
   coordinator (a victim that never started is deleted at once), the new target sent to the
   coordinator once it answers. A job placed without a live coordinator gets one (with its
   Service, its NetworkPolicy and, with TLS, its TLS Secret, if missing) at once. Its new
   replicas, each with the Secret of its own credential, are created as soon as the room
   they take is really free, in the same act as the coordinator when it is (after those
   exist: ``actuating`` holds them back otherwise): a replica
   started before its coordinator listens retries its registration until it does, and
   waiting for the coordinator's first answer before creating them added a cycle, the pod
   creation and a process start to every admission. Only while the coordinator's pod is
   younger than ``COORDINATOR_START_S``: past it, new replicas wait for its first answer.
   A replica that fails while its job's coordinator has not answered is not charged
   (rule 4): it could not have run. A job the planner set aside (``Reason.SET_ASIDE``: its
   state is one it cannot accept) is left as it is: the condition ``SetAside=True`` and a
   Warning Event name the problem and the fix, and the other jobs are planned as usual.
7. The status: phase along ``JobPhase``'s diagram, size, allocation, conditions, reason,
   progress and throughput; written only when it changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edl_scheduler.api import JobPhase, TrainingJob
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.intents import (
    CreateCoordinator,
    CreatePod,
    Decisions,
    Drain,
    Emit,
    EnsureObjects,
    EventReason,
    EventType,
    JobCycle,
    JobView,
    MarkDraining,
    PatchStatus,
    SetTarget,
)
from edl_scheduler.controller.isolating import job_network_policies
from edl_scheduler.controller.leaving import (
    clear_away,
    delete_overdue_drains,
    finish,
    leave_lost_nodes,
    replace_finished,
    suspend,
)
from edl_scheduler.controller.podstate import (
    coordinator_port_of,
    draining_since,
    iso_time,
    meta_of,
    phase_of,
    terminating,
    timestamp_of,
)
from edl_scheduler.controller.shaping import (
    ShapingError,
    coordinator_address,
    coordinator_pod,
    coordinator_service,
    credential_secret,
    free_port,
    replica_pod,
    tls_secret,
)
from edl_scheduler.controller.statusing import compute_status, decision_events, write_status
from edl_scheduler.core import JobDecision, Plan, Reason, Resources, Role

log = logging.getLogger("edl.controller.deciding")


def decide(
    views: Mapping[str, JobView],
    plan: Plan | None,
    config: ControllerConfig,
    now: float,
    namer: Callable[[str, str], str],
    attained_due: Callable[[str], float] = lambda _key: 0.0,
    nodes: NodeStates | None = None,
    quiet: QuietJobs | None = None,
    held_ports: Iterable[int] = (),
) -> Decisions:
    """The intents of one cycle. ``namer(job, role)`` names a new replica pod;
    ``attained_due(key)`` is the time since the job's attained GPU-time was last written, when
    it is due to be written again (else 0). With ``quiet``, jobs whose inputs did not change
    since a cycle in which they produced nothing are not decided again.

    ``held_ports`` are the ports of coordinator pods that no view shows: a deleted job's pods
    stay until the garbage collector and their kubelet have removed them, and its coordinator
    listens until then. A new coordinator is never given a port one of them holds: where
    coordinators share a network (``--coordinator-ports`` ranges), it could not listen, and
    whatever still answers there would be taken for it."""
    out = Decisions()
    used_ports = [
        p for v in views.values() if (p := coordinator_port_of(v.coordinator)) is not None
    ]
    used_ports.extend(held_ports)
    decisions = {d.job: d for d in plan.decisions} if plan is not None else {}
    for key, view in sorted(views.items()):
        if view.tj is None:
            _invalid(view, now, out)
            continue
        decision = decisions.get(key)
        inputs = None if quiet is None else quiet.inputs(view, view.tj, decision, nodes)
        if quiet is not None and quiet.unchanged(key, inputs):
            quiet.skipped += 1
            continue
        before = _output_size(out)
        _decide_job(
            view,
            view.tj,
            decision,
            config,
            now,
            namer,
            used_ports,
            out,
            attained_due,
            nodes or NodeStates(),
        )
        if quiet is not None:
            quiet.remember(key, inputs if _output_size(out) == before else None)
    if quiet is not None:
        quiet.forget_all_but(views.keys())
    return out


def _output_size(out: Decisions) -> tuple[int, ...]:
    """How much a cycle's output holds: a job that added nothing to any of it was quiet."""
    c = out.counts
    return (
        len(out.intents),
        len(out.attained_written),
        sum(c.resizes.values()),
        c.preemptions,
        len(c.waited_s),
        len(c.completed_s),
    )


#: How long after its coordinator's pod was created a job's new replicas may start before it
#: answers. Within it they are created with it and retry their registration until it
#: listens (a whole admission saved); past it, new replicas wait for its first answer, so a
#: coordinator that never comes up costs one batch of uncharged failures (each replica
#: gives up after its EDL_TIMEOUT_S, 30 s by default), not a replacement loop.
COORDINATOR_START_S = 15.0

_ACTIVE = frozenset(p.value for p in JobPhase if p.active)
_FINAL = frozenset(p.value for p in JobPhase if p.final)
#: What a job's decision is made from, compared by identity where it holds API objects
#: (see ``QuietJobs``).
JobInputs = tuple[object, ...]


class QuietJobs:
    """The jobs whose last decision produced nothing (no intent, no status write, no count),
    with what that decision was made from, so that a cycle decides again only for the jobs
    whose inputs changed: at 200 jobs most of them did not, and deciding each again was a
    large share of the cycle.

    A job's inputs are its objects as the watch delivered them (compared by identity: the
    watch's cache hands out the same object until it changes, and holding it here keeps its
    identity from being reused), its coordinator's progress and readiness, its priority, the
    plan's decision for it and the state of the nodes its pods are on. A job is always
    decided again when anything else could change the outcome: the plan moves its replicas,
    one of its replicas drains (a deadline runs), or its attained GPU-time is due
    (``due(key)``). What must stay true: this is an optimization only. Skipping a quiet job
    produces exactly what deciding it would (nothing), and an empty instance (a restarted
    controller) decides every job."""

    def __init__(self, due: Callable[[str], bool] = lambda _key: False) -> None:
        self.due = due
        self._quiet: dict[str, JobInputs] = {}
        #: Jobs skipped since this instance was made (for tests and the benchmark's logs).
        self.skipped = 0

    def inputs(
        self,
        view: JobView,
        tj: TrainingJob,
        decision: JobDecision | None,
        nodes: NodeStates | None,
    ) -> JobInputs | None:
        """What the job's decision depends on, or None when it must be decided anyway."""
        if decision is not None and decision.changed:
            return None
        pods = (*view.replicas, *((view.coordinator,) if view.coordinator is not None else ()))
        if any(draining_since(p) is not None for p in view.replicas):
            return None
        phase = str((view.body.get("status") or {}).get("phase", JobPhase.PENDING.value))
        if phase in _FINAL and any(not terminating(p) for p in pods):
            return None  # its pods leave by a deadline (`leaving.clear_away`)
        if phase in _ACTIVE and self.due(tj.key):
            return None
        known = nodes.known if nodes is not None else None
        unschedulable = nodes.unschedulable if nodes is not None else frozenset()
        placed = tuple(
            (
                node := str(p.get("spec", {}).get("nodeName", "")),
                known is None or node in known,
                node in unschedulable,
            )
            for p in pods
        )
        return (
            view.body,
            pods,
            view.progress,
            view.priority,
            view.coordinator_ready,
            view.target_due,
            view.status_unseen,
            view.rejected,
            decision,
            placed,
        )

    def unchanged(self, key: str, inputs: JobInputs | None) -> bool:
        last = self._quiet.get(key)
        if inputs is None or last is None:
            return False
        return (
            inputs[0] is last[0]
            and len(inputs[1]) == len(last[1])  # type: ignore[arg-type]
            and all(a is b for a, b in zip(inputs[1], last[1], strict=True))  # type: ignore[call-overload]
            and inputs[2:] == last[2:]
        )

    def remember(self, key: str, inputs: JobInputs | None) -> None:
        if inputs is None:
            self._quiet.pop(key, None)
        else:
            self._quiet[key] = inputs

    def forget_all_but(self, keys: Iterable[str]) -> None:
        keep = set(keys)
        for key in [k for k in self._quiet if k not in keep]:
            del self._quiet[key]


def _invalid(view: JobView, now: float, out: Decisions) -> None:
    meta = meta_of(view.body)
    status = dict(view.body.get("status") or {})
    reason = view.rejected or "invalid"
    conditions = [c for c in status.get("conditions", []) if c.get("type") != "Valid"]
    old = next((c for c in status.get("conditions", []) if c.get("type") == "Valid"), None)
    if old is not None and old.get("message") == reason and status.get("message") == reason:
        return
    conditions.append(
        {
            "type": "Valid",
            "status": "False",
            "reason": "InvalidSpec",
            "message": reason,
            "lastTransitionTime": iso_time(now),
        }
    )
    phase = status.get("phase", "Pending")
    new = {"phase": phase, "message": reason, "conditions": conditions}
    namespace, name = str(meta.get("namespace", "default")), str(meta.get("name"))
    out.intents.append(PatchStatus(namespace, name, new))
    out.intents.append(
        Emit(
            namespace,
            name,
            str(meta.get("uid", "")),
            EventType.WARNING,
            EventReason.INVALID,
            reason,
        )
    )


def _decide_job(
    view: JobView,
    tj: TrainingJob,
    decision: JobDecision | None,
    config: ControllerConfig,
    now: float,
    namer: Callable[[str, str], str],
    used_ports: list[int],
    out: Decisions,
    attained_due: Callable[[str], float],
    nodes: NodeStates,
) -> None:
    old_status: dict[str, Any] = dict(view.body.get("status") or {})
    status = dict(old_status)
    cycle = JobCycle(view, tj, now, out, status, int(old_status.get("restarts", 0)))
    phase = JobPhase(old_status.get("phase", JobPhase.PENDING.value))
    if phase.final:  # 2
        # (a final phase only queued may be lost: the coordinator stays, ``leaving.finish``)
        clear_away(
            cycle, succeeded=phase is JobPhase.SUCCEEDED, keep_coordinator=view.status_unseen
        )
        return
    status.setdefault(
        "submitTime", iso_time(timestamp_of(meta_of(view.body).get("creationTimestamp")) or now)
    )
    if view.progress is not None and view.progress.finished:  # 3
        finish(
            cycle,
            JobPhase.SUCCEEDED,
            EventReason.SUCCEEDED,
            f"the coordinator committed the last epoch ({view.progress.epochs})",
        )
        write_status(cycle, old_status)
        return
    replace_finished(cycle)  # 4
    if cycle.restarts > tj.spec.failure_policy.max_restarts:
        status["restarts"] = cycle.restarts
        finish(
            cycle,
            JobPhase.FAILED,
            EventReason.FAILED,
            f"{cycle.restarts} failures exceed failurePolicy.maxRestarts "
            f"({tj.spec.failure_policy.max_restarts})",
        )
        write_status(cycle, old_status)
        return
    leave_lost_nodes(cycle, nodes.known, nodes.unschedulable)  # 5
    delete_overdue_drains(cycle)
    if tj.spec.suspend:  # 6
        suspend(cycle)
    elif decision is not None and decision.reason is not Reason.SET_ASIDE:
        _act(cycle, decision, config, namer, used_ports, nodes)  # (set aside: kept as it is)
    compute_status(cycle, decision, attained_due)  # 7
    write_status(cycle, old_status)


@dataclass(frozen=True, slots=True)
class NodeStates:
    """Which nodes exist and which take no new replicas (cordoned or not Ready); None:
    unknown, nothing is moved."""

    known: frozenset[str] | None = None
    unschedulable: frozenset[str] = frozenset()
    #: What each node has free now, counting every replica still on it (draining and
    #: terminating ones too). The planner counts a draining victim's capacity as already
    #: free (held by a reservation for the job it was taken for); new pods wait until it
    #: really is, so a node is never over-committed. None: not checked.
    free: dict[str, Resources] | None = None


def _coordinator_alive(view: JobView, removed: set[str]) -> bool:
    pod = view.coordinator
    return (
        pod is not None
        and not terminating(pod)
        and phase_of(pod) not in ("Succeeded", "Failed")
        and str(meta_of(pod)["name"]) not in removed
    )


def _act(
    cycle: JobCycle,
    decision: JobDecision,
    config: ControllerConfig,
    namer: Callable[[str, str], str],
    used_ports: list[int],
    nodes: NodeStates,
) -> None:
    view, tj = cycle.view, cycle.tj
    adds = [(Role.WORKER, n) for n in decision.workers.add_nodes]
    removes = list(decision.workers.remove)
    if decision.pservers is not None:
        adds += [(Role.PSERVER, n) for n in decision.pservers.add_nodes]
        removes += list(decision.pservers.remove)
    live_replicas = [
        p
        for p in view.replicas
        if not terminating(p) and str(meta_of(p)["name"]) not in cycle.removed
    ]
    alive = _coordinator_alive(view, cycle.removed)
    placed = [] if cycle.deferred else adds  # where the plan puts new replicas now
    adds = []
    if placed and alive and not view.coordinator_ready and not _starting(view, cycle.now):
        _wait(cycle, placed, "its coordinator to answer")
    elif placed and not _reserve(tj, placed, nodes):
        _wait(cycle, placed, "leaving replicas to go")
    else:
        adds = placed
    port = coordinator_port_of(view.coordinator)
    ensured = ""  # the job's key when this cycle ensures its Service
    # The coordinator is created as soon as the plan places the job, while the room of its
    # replicas is still being vacated; the replicas with it when their room is free.
    if (placed or live_replicas) and not alive:
        if port is None:
            port = free_port(used_ports, config)
            used_ports.append(port)
        node = placed[0][1] if placed else str(live_replicas[0]["spec"]["nodeName"])
        try:
            tls = tls_secret(tj, config)
            objects = (coordinator_service(tj, port), *([tls] if tls is not None else []))
            policies = job_network_policies(tj, config)
            cycle.out.intents.append(EnsureObjects(tj.key, (*objects, *policies)))
            coordinator_pod(tj, node, port, config, None)  # fails early on a bad job
            cycle.out.intents.append(CreateCoordinator(tj, node, port))
            ensured = tj.key
        except ShapingError as error:
            cycle.status["message"] = str(error)
            cycle.status.setdefault("conditions", [])
            return
    if port is None:
        return
    address = coordinator_address(tj, port, config)
    for role, node in adds:
        name = namer(tj.metadata.name, role.value)
        cycle.created[name] = node
        manifest = replica_pod(tj, name, node, role, address, config)
        credential = credential_secret(tj, name, role, config)
        cycle.out.intents.append(CreatePod(manifest, job=ensured, credential=credential))
    by_name = {str(meta_of(p)["name"]): p for p in view.replicas}
    for name in removes:
        pod = by_name.get(name)
        if pod is None or name in cycle.removed:
            continue
        started = phase_of(pod) == "Running"
        if not started:
            cycle.delete(pod)
            continue
        cycle.out.intents.append(MarkDraining(tj.metadata.namespace, name, cycle.now))
        cycle.out.intents.append(Drain(tj.key, name))
    if view.coordinator_ready and (
        decision.workers.target != decision.workers.current or view.target_due
    ):
        # A coordinator still starting is told from its first answer on: asking it earlier
        # only failed, once per cycle. Its workers may exist already (created with it), so it
        # is told once even when the plan's size did not change: it then opens its first
        # generation as soon as that many have joined, not after its join window.
        cycle.out.intents.append(SetTarget(tj.key, decision.workers.target))
    decision_events(cycle, decision)


def _starting(view: JobView, now: float) -> bool:
    """Whether the job's coordinator pod is young enough that replicas may start beside it
    before it answers (``COORDINATOR_START_S``)."""
    created = timestamp_of(meta_of(view.coordinator or {}).get("creationTimestamp"))
    return created is not None and now - created < COORDINATOR_START_S


def _wait(cycle: JobCycle, placed: list[tuple[Role, str]], what: str) -> None:
    cycle.deferred = True
    cycle.waiting_for = what
    log.debug(  # every cycle while it waits; the job's status message says it once
        "%s: %d new replicas for %s wait for %s",
        cycle.tj.key,
        len(placed),
        ", ".join(sorted({n for _, n in placed})),
        what,
    )


def _reserve(tj: TrainingJob, adds: list[tuple[Role, str]], nodes: NodeStates) -> bool:
    """Takes room for all of ``adds`` from ``nodes.free``, or nothing when one does not fit
    (a gang starts whole; a growth waits for its room)."""
    if nodes.free is None:
        return True
    free = dict(nodes.free)
    for role, node in adds:
        res = tj.spec.resources
        if role is Role.PSERVER and tj.spec.pserver is not None:
            res = tj.spec.pserver.resources
        need = Resources(res.gpu, res.cpu_milli, res.memory_bytes)
        have = free.get(node, Resources())
        if not need.fits_in(have):
            return False
        free[node] = have - need
    nodes.free.update(free)
    return True

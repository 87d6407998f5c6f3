"""The planner's input: what the cluster and its jobs look like at one instant.

A Snapshot is built by a driver (the controller from Kubernetes objects, the local backend
from its processes, the simulator from its event state) and handed to ``plan()``. It is
frozen: the planner never changes its input, and the same Snapshot, policy and ``now``
always give the same Plan.

What must stay true of a valid snapshot is checked in ``validating.py``, once, before any
decision is made (unknown nodes, duplicate names, negative capacity, more workers than the
job's maximum).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from edl_gradients import FieldNames, statistics_problem
from edl_gradients.goodput import BatchLimits, gain
from edl_scheduler.core.resources import NO_RESOURCES, Resources


class Role(Enum):
    """The two kinds of replica a job has: allreduce or PS workers, and parameter servers."""

    WORKER = "worker"
    PSERVER = "pserver"

    # Members are singletons, so identity hashing agrees with equality; it is C-level,
    # where Enum's own hash is Python code on the planner's hottest path (dicts keyed by
    # role). Nothing iterates a set of roles, so no order depends on it.
    __hash__ = object.__hash__


class SelectorOp(Enum):
    """Operators of a required node-affinity match expression (Kubernetes semantics)."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class TaintEffect(Enum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class TolerationOp(Enum):
    EQUAL = "Equal"
    EXISTS = "Exists"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: SelectorOp
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """All requirements of one term must hold; a job's terms are ORed (Kubernetes rules)."""

    requirements: tuple[Requirement, ...]


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: TaintEffect
    value: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    """An empty key with operator Exists tolerates every taint; effect None matches all."""

    key: str = ""
    operator: TolerationOp = TolerationOp.EQUAL
    value: str = ""
    effect: TaintEffect | None = None


@dataclass(slots=True, init=False)
class Constraints:
    """Where a job's pods may run: its template's nodeSelector, required node affinity and
    tolerations. Hashable, so that the planner matches each distinct set once per node class.

    Fixed once made (see ``Job``). ``__init__`` and ``__hash__`` are written out to run
    compiled: every planning session looks its first job's constraints up by hash."""

    node_selector: Final[tuple[tuple[str, str], ...]]
    required_terms: Final[tuple[NodeSelectorTerm, ...]]
    tolerations: Final[tuple[Toleration, ...]]

    def __init__(
        self,
        node_selector: tuple[tuple[str, str], ...] = (),
        required_terms: tuple[NodeSelectorTerm, ...] = (),
        tolerations: tuple[Toleration, ...] = (),
    ) -> None:
        self.node_selector = node_selector
        self.required_terms = required_terms
        self.tolerations = tolerations

    def __hash__(self) -> int:
        return hash((self.node_selector, self.required_terms, self.tolerations))


NO_CONSTRAINTS: Final = Constraints()


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the planner sees it. ``used_by_others`` is what pods that are not EDL
    replicas already take; the planner never hands that capacity out."""

    name: str
    allocatable: Resources
    used_by_others: Resources = NO_RESOURCES
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    schedulable: bool = True


@dataclass(slots=True, init=False)
class RoleSpec:
    """Bounds and per-replica resources of one role of a job. Fixed once made (see
    ``Job``)."""

    min_replicas: Final[int]
    max_replicas: Final[int]
    resources: Final[Resources]

    def __init__(self, min_replicas: int, max_replicas: int, resources: Resources) -> None:
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.resources = resources

    def __hash__(self) -> int:
        return hash((self.min_replicas, self.max_replicas, self.resources))


@dataclass(slots=True, init=False)
class Replica:
    """One placed replica. A draining replica has been told to leave; it still occupies its
    node until it exits, but no longer counts toward its job's size, and the capacity it
    frees is held by a Reservation for the job it was freed for. Fixed once made (see
    ``Job``)."""

    name: Final[str]
    role: Final[Role]
    node: Final[str]
    draining: Final[bool]

    def __init__(self, name: str, role: Role, node: str, draining: bool = False) -> None:
        self.name = name
        self.role = role
        self.node = node
        self.draining = draining

    def __hash__(self) -> int:
        return hash((self.name, self.role, self.node, self.draining))


@dataclass(slots=True, init=False)
class ThroughputSample:
    """A throughput the job's runtime measured at one size: ``workers`` on ``nodes``.
    ``batch`` is the global batch it trained at meanwhile (0: not reported). Fixed once made
    (see ``Job``)."""

    nodes: Final[int]
    workers: Final[int]
    samples_per_second: Final[float]
    batch: Final[int]

    def __init__(self, nodes: int, workers: int, samples_per_second: float, batch: int = 0) -> None:
        self.nodes = nodes
        self.workers = workers
        self.samples_per_second = samples_per_second
        self.batch = batch

    def __hash__(self) -> int:
        # Compiled, as the rest: the fit's cache (``throughput.fit``) hashes every sample of
        # each new Job object it is asked for.
        return hash((self.nodes, self.workers, self.samples_per_second, self.batch))


@dataclass(frozen=True, slots=True)
class Efficiency:
    """A job's statistical efficiency now, as Pollux models it from the gradient noise the
    runtime measures: one step at global batch ``B`` makes the progress of
    ``gain(B) = (var + sqr) / (var / (B / init_batch) + sqr)`` steps at ``init_batch``.
    ``grad_sqr`` and ``grad_var`` are the squared gradient norm and the gradient variance
    measured at the job's current batch; they change as training goes on, so the runtime
    reports them again and a sample's throughput is weighed by the efficiency of now.
    Optional: without it every sample counts as measured (statistical efficiency 1).

    ``max_batch`` and ``max_local`` (with ``min_local``), where a job that adapts its batch
    reports them, are the bounds it chooses its batch within (``limits``: its global batch
    from ``init_batch`` to ``max_batch``, at most ``max_local`` samples per GPU at once).
    The planner then predicts a size's goodput at the batch the job would choose there
    (``throughput.job_model``), not at the batch it measured that size at. 0: not reported
    (a fixed batch, or a runtime that does not say)."""

    init_batch: int
    grad_sqr: float
    grad_var: float
    max_batch: int = 0
    max_local: int = 0
    min_local: int = 1

    def __post_init__(self) -> None:
        names = FieldNames("efficiency.init_batch", "efficiency.grad_sqr", "grad_var")
        problem = statistics_problem(self.init_batch, self.grad_sqr, self.grad_var, names)
        if problem is not None:
            raise ValueError(f"{problem}: report the gradient statistics the job measured")
        if (self.max_batch > 0) != (self.max_local > 0):
            raise ValueError(
                f"efficiency.max_batch ({self.max_batch}) and efficiency.max_local "
                f"({self.max_local}): give both (a job that adapts its batch) or neither"
            )
        if self.max_batch > 0:
            try:
                BatchLimits(self.init_batch, self.max_batch, self.max_local, self.min_local)
            except ValueError as e:
                raise ValueError(f"efficiency: {e}") from None

    def gain(self, batch: float) -> float:
        return gain(self.init_batch, self.grad_sqr, self.grad_var, batch)  # the one rule

    def limits(self) -> BatchLimits | None:
        """The bounds the job adapts its batch within; None for a job that does not."""
        if self.max_batch <= 0:
            return None
        return BatchLimits(self.init_batch, self.max_batch, self.max_local, self.min_local)


@dataclass(slots=True, init=False)
class Reservation:
    """Capacity held for ``job`` on ``node``: room for ``count`` replicas of ``role``.

    Reservations are made when workers are taken from other jobs to admit ``job``; the plan
    returns them and the driver hands them back in the next snapshot. Only ``job`` or a job
    ranked above it may use the capacity, until ``job`` has its replicas there or until
    ``expires_at`` (no ping-pong between two elastic jobs over freed GPUs).

    Fixed once made (see ``Job``): every plan that holds capacity makes its reservations
    anew, so ``__init__`` and ``__hash__`` are written out to run compiled."""

    job: Final[str]
    node: Final[str]
    role: Final[Role]
    count: Final[int]
    expires_at: Final[float]

    def __init__(self, job: str, node: str, role: Role, count: int, expires_at: float) -> None:
        self.job = job
        self.node = node
        self.role = role
        self.count = count
        self.expires_at = expires_at

    def __hash__(self) -> int:
        return hash((self.job, self.node, self.role, self.count, self.expires_at))


@dataclass(slots=True, init=False)
class Job:
    """A TrainingJob as the planner sees it.

    ``requested`` is the size rigid policies run the job at (default: ``worker.max_replicas``).
    ``suspended`` is the user's ``spec.suspend``: such a job gets no replicas.
    ``start_time`` is when its current run began (None while pending), ``last_resize_time``
    when its size last changed; both drive the cool-down and minimum-run rules.
    ``resizes`` counts how often the job's allocation changed since submission (resizes,
    preemptions and restarts alike): rebalancing charges a move by it, as Pollux charges its
    restarts, so a job moved often needs a larger gain to be moved again. It is never negative.
    ``efficiency``, where the runtime reports it, turns the measured throughput into goodput
    (progress per second) for the planner's model (``throughput.job_model``).
    ``remaining_samples``, where the runtime reports it, is what the job has left to train
    until the end its user declared (its ledger: epochs x samples per epoch - samples done);
    rebalancing ranks jobs by the time it stands for (``remaining``). None: not reported.

    Nothing changes a Job, nor the ``RoleSpec``, ``Replica`` and ``ThroughputSample`` it
    holds, once made: the fields are ``Final`` (compiled, assigning one raises). These are
    dataclasses for ``replace``, ``fields``, their repr and their equality, with ``__init__``
    and ``__hash__`` written out: compiled, those are C, where the ones a dataclass generates
    are Python code (the simulator makes a Job for every job whose state changed, at every
    plan). The hash is the frozen dataclass's: that of the fields' tuple.
    """

    name: Final[str]
    worker: Final[RoleSpec]
    submit_time: Final[float]
    priority: Final[int]
    preemptible: Final[bool]
    pserver: Final[RoleSpec | None]
    requested: Final[int | None]
    constraints: Final[Constraints]
    replicas: Final[tuple[Replica, ...]]
    suspended: Final[bool]
    start_time: Final[float | None]
    last_resize_time: Final[float | None]
    resizes: Final[int]
    attained_gpu_seconds: Final[float]
    throughput: Final[tuple[ThroughputSample, ...]]
    efficiency: Final[Efficiency | None]
    remaining_samples: Final[float | None]

    def __init__(
        self,
        name: str,
        worker: RoleSpec,
        submit_time: float,
        priority: int = 0,
        preemptible: bool = True,
        pserver: RoleSpec | None = None,
        requested: int | None = None,
        constraints: Constraints = NO_CONSTRAINTS,
        replicas: tuple[Replica, ...] = (),
        suspended: bool = False,
        start_time: float | None = None,
        last_resize_time: float | None = None,
        resizes: int = 0,
        attained_gpu_seconds: float = 0.0,
        throughput: tuple[ThroughputSample, ...] = (),
        efficiency: Efficiency | None = None,
        remaining_samples: float | None = None,
    ) -> None:
        if resizes < 0:
            raise ValueError(
                f"job {name}: resizes is {resizes}: it counts the job's resizes "
                "since submission and must be >= 0"
            )
        self.name = name
        self.worker = worker
        self.submit_time = submit_time
        self.priority = priority
        self.preemptible = preemptible
        self.pserver = pserver
        self.requested = requested
        self.constraints = constraints
        self.replicas = replicas
        self.suspended = suspended
        self.start_time = start_time
        self.last_resize_time = last_resize_time
        self.resizes = resizes
        self.attained_gpu_seconds = attained_gpu_seconds
        self.throughput = throughput
        if remaining_samples is not None and not 0 <= remaining_samples < float("inf"):
            raise ValueError(
                f"job {name}: remaining_samples is {remaining_samples}: the samples left "
                "until the job's declared end must be finite and >= 0 (None: not reported)"
            )
        self.efficiency = efficiency
        self.remaining_samples = remaining_samples

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                self.worker,
                self.submit_time,
                self.priority,
                self.preemptible,
                self.pserver,
                self.requested,
                self.constraints,
                self.replicas,
                self.suspended,
                self.start_time,
                self.last_resize_time,
                self.resizes,
                self.attained_gpu_seconds,
                self.throughput,
                self.efficiency,
                self.remaining_samples,
            )
        )

    def role_spec(self, role: Role) -> RoleSpec | None:
        return self.worker if role is Role.WORKER else self.pserver

    def live(self, role: Role) -> tuple[Replica, ...]:
        """Replicas of ``role`` that count toward the job's size (placed, not draining)."""
        if not self.replicas:  # a waiting job: most calls, on the planner's hot path
            return ()
        return tuple([r for r in self.replicas if r.role is role and not r.draining])

    @property
    def rigid_size(self) -> int:
        return self.requested if self.requested is not None else self.worker.max_replicas


@dataclass(slots=True, init=False)
class Snapshot:
    """Fixed once made, as a ``Job`` is and for the same reason (one per plan)."""

    nodes: Final[tuple[Node, ...]]
    jobs: Final[tuple[Job, ...]]
    reservations: Final[tuple[Reservation, ...]]

    def __init__(
        self,
        nodes: tuple[Node, ...],
        jobs: tuple[Job, ...],
        reservations: tuple[Reservation, ...] = (),
    ) -> None:
        self.nodes = nodes
        self.jobs = jobs
        self.reservations = reservations

    def __hash__(self) -> int:
        return hash((self.nodes, self.jobs, self.reservations))

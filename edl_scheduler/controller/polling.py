"""The planning loop's link to each job's coordinator: whether it answered, its progress,
and its state kept in the job's ConfigMap.

Two threads ask the coordinators, apart from the planning cycle: the progress rounds ask
every coordinator that has answered (``polling_forever``), and the ready probe asks each
one that has not yet, so that its first answer starts a cycle at once (its job's workers
wait for it: ``probing_forever``). A change that matters (finished, members, generation)
marks the world dirty. Every few seconds a coordinator's state is copied into its job's
ConfigMap, from which a replacement coordinator starts.

What must stay true: an answer counts for the coordinator pod that gave it (its uid), and
only once that pod is Running (whatever answered at the address before held the port
before it); nothing here is remembered that a restarted controller could not rebuild: the
coordinators are asked again, and the ConfigMaps stay.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from edl_scheduler.api import JobPhase, TrainingJob
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.coordinating import (
    CoordinatorCallError,
    CoordinatorPort,
    GrpcCoordinator,
    Progress,
)
from edl_scheduler.controller.intents import JobView
from edl_scheduler.controller.podstate import coordinator_port_of
from edl_scheduler.controller.shaping import coordinator_address, state_config_map

log = logging.getLogger("edl.controller.loop")

Obj = Mapping[str, Any]
#: The progress rounds ask at most this many coordinators a second (the round's period
#: grows with the number of jobs beyond ``progress_period_s``).
PROGRESS_CALLS_PER_S = 50
#: Keeps a job's coordinator state: (namespace, name, the ConfigMap's manifest, made late).
StateKeeper = Callable[[str, str, Callable[[], Obj]], None]


@dataclass(slots=True)
class Coordinated:
    """A job's coordinator as the last cycle saw it."""

    tj: TrainingJob
    address: str
    running: bool
    #: The coordinator pod's uid: an answer counts for this pod only.
    uid: str


class Coordinators:
    """Every job's coordinator: a client each, what each answered, what each was told."""

    def __init__(
        self,
        config: ControllerConfig,
        is_leader: Callable[[], bool],
        keeping_state: StateKeeper,
        urgent: Callable[[], None],
        dirty: Callable[[], None],
    ) -> None:
        self.config = config
        self.is_leader = is_leader
        self.keeping_state = keeping_state
        self.urgent = urgent
        self.dirty = dirty
        self.clients: dict[str, tuple[str, CoordinatorPort]] = {}
        self.clients_lock = threading.Lock()
        self.progress: dict[str, Progress] = {}
        #: job key -> uid of the coordinator pod that last answered: a job's workers are
        #: created once its coordinator answers (``JobView.coordinator_ready``).
        self.answered: dict[str, str] = {}
        #: job key -> uid of the coordinator pod last told the job's size (``target_due``).
        self.told: dict[str, str] = {}
        self.coordinated: dict[str, Coordinated] = {}
        self.snapshots: dict[str, float] = {}
        #: job key -> digest of the coordinator state last written to its ConfigMap
        self.saved: dict[str, bytes] = {}

    def ready(self, key: str, coordinator: Obj | None) -> bool:
        """The job's coordinator pod is Running, not being deleted, and has answered."""
        if coordinator is None:
            return False
        meta = coordinator.get("metadata", {})
        return (
            not meta.get("deletionTimestamp")
            and coordinator.get("status", {}).get("phase") == "Running"
            and bool(meta.get("uid"))
            and self.answered.get(key) == meta.get("uid")
        )

    def target_due(self, key: str) -> bool:
        """The coordinator that answered was not told the job's size yet."""
        return self.told.get(key) != self.answered.get(key)

    def telling(self, keys: set[str]) -> None:
        """The cycle told these jobs' coordinators their size."""
        for key in keys:
            if key in self.answered:
                self.told[key] = self.answered[key]

    def remembering(self, views: Mapping[str, JobView]) -> None:
        """The coordinators of the jobs the cycle saw; those of jobs gone are forgotten."""
        known: dict[str, Coordinated] = {}
        for key, view in views.items():
            port = coordinator_port_of(view.coordinator)
            if view.tj is None or port is None or view.coordinator is None:
                continue
            if JobPhase(view.body.get("status", {}).get("phase", "Pending")).final:
                continue
            meta = view.coordinator.get("metadata", {})
            if meta.get("deletionTimestamp"):
                continue
            running = view.coordinator.get("status", {}).get("phase") == "Running"
            address = coordinator_address(view.tj, port, self.config)
            known[key] = Coordinated(view.tj, address, running, str(meta.get("uid", "")))
        self.coordinated = known
        with self.clients_lock:
            for key in [k for k in self.clients if k not in known]:
                self.clients.pop(key)[1].close()
                self.progress.pop(key, None)
                self.saved.pop(key, None)
            for key in [k for k in self.answered if k not in known]:
                del self.answered[key]
            for key in [k for k in self.told if k not in known]:
                del self.told[key]

    def client_of(self, key: str) -> CoordinatorPort | None:
        found = self.coordinated.get(key)
        if found is None:
            return None
        with self.clients_lock:
            have = self.clients.get(key)
            if have is not None and have[0] == found.address:
                return have[1]
            if have is not None:
                have[1].close()
            meta = found.tj.metadata
            token = self.config.credentials_for(meta.namespace, meta.name, meta.uid or "")
            tls = self.config.tls_for(meta.uid or "")
            client = GrpcCoordinator(
                found.address,
                token.controller(),
                self.config.coordinator_timeout_s,
                tls.for_clients() if tls is not None else None,
            )
            self.clients[key] = (found.address, client)
            return client

    def polling_forever(self, stopping: threading.Event) -> None:
        """Asks every coordinator that has answered for its progress each
        ``progress_period_s`` (or less often, so that the rounds make at most
        ``PROGRESS_CALLS_PER_S`` calls a second: at 200 jobs, one call per job and second took
        most of this process's CPU and slowed the planning cycle threefold)."""
        pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="progress")
        period = self.config.progress_period_s
        try:
            while not stopping.wait(period):
                if not self.is_leader():
                    continue
                started = time.monotonic()
                jobs = [
                    k
                    for k, c in dict(self.coordinated).items()
                    if c.running and self.answered.get(k) == c.uid
                ]
                list(pool.map(self.polling_one, jobs))
                spent = time.monotonic() - started
                wanted = max(self.config.progress_period_s, len(jobs) / PROGRESS_CALLS_PER_S)
                period = max(0.0, wanted - spent)
        finally:
            pool.shutdown(wait=False)

    def probing_forever(self, stopping: threading.Event) -> None:
        """Asks each coordinator that has not answered yet (its pod just created or replaced)
        every ``ready_probe_period_s`` once its pod is Running, on threads of its own: its
        first answer starts a cycle at once, which creates the job's waiting workers. Apart
        from the progress rounds, so that a round over hundreds of jobs never holds a probe
        back."""
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ready-probe")
        try:
            while not stopping.wait(self.config.ready_probe_period_s):
                if not self.is_leader():
                    continue
                jobs = [
                    k
                    for k, c in dict(self.coordinated).items()
                    if c.running and self.answered.get(k) != c.uid
                ]
                list(pool.map(self.polling_one, jobs))
        finally:
            pool.shutdown(wait=False)

    def polling_one(self, key: str) -> None:
        asked = self.coordinated.get(key)
        if asked is None or not asked.running:
            # A pod not Running has no process yet: whatever answers at its address is
            # another (one that held the port before it), and its answer must not count
            # for this pod, nor its snapshot be kept as this job's state.
            return
        client = self.client_of(key)
        if client is None:
            return
        try:
            progress = client.progress()
        except CoordinatorCallError as error:
            log.debug("no progress from %s: %s", key, error)
            return
        if self.answered.get(key) != asked.uid:
            self.answered[key] = asked.uid
            log.info("%s: coordinator %s answers", key, asked.address)
            self.urgent()  # the job's workers wait for exactly this answer
        before = self.progress.get(key)
        self.progress[key] = progress
        if before is None or (
            before.finished != progress.finished
            or before.members != progress.members
            or before.generation != progress.generation
        ):
            self.dirty()
        now = time.monotonic()
        if now - self.snapshots.get(key, 0.0) >= self.config.snapshot_period_s:
            self.snapshots[key] = now
            self.keeping(key, client)

    def keeping(self, key: str, client: CoordinatorPort) -> None:
        """Copy the coordinator's state into its job's ConfigMap, when it changed."""
        found = self.coordinated.get(key)
        if found is None:
            return
        try:
            state = client.snapshot()
            digest = hashlib.sha256(state.encode()).digest()
            if self.saved.get(key) == digest:
                return  # unchanged: no write
            tj = found.tj
            self.keeping_state(
                tj.metadata.namespace, tj.metadata.name, lambda: state_config_map(tj, state)
            )
            self.saved[key] = digest
        except Exception as error:
            log.info("could not keep the state of %s: %s", key, error)

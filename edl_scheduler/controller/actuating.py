"""Intents -> Kubernetes API calls and coordinator calls: the only module that writes to the
cluster on a job's behalf (``leading`` writes the controller's own Lease, nothing else does).

What must stay true:
- every write is idempotent: a pod or object that already exists (409) counts as created, one
  already gone (404) as deleted, so a cycle repeated after a crash does no harm;
- a failed write is logged and left to the next cycle, which sees the world again and decides
  again (level-triggered); nothing is retried in a loop here;
- each write waits for what it depends on and for nothing else: a new coordinator's pod
  for its job's Service and the read of its saved state, the pods created with it for the
  Service (none is created when it failed), each replica pod for the Secret of its own
  credential (created just before it; it goes with the job), a drain for its victim's
  draining mark; the rest (the marks, other pods, deletions, the planned size,
  ``SetTarget``) go at once. The cycle waits for these, which are an admission's critical
  path. Statuses and Events come last and are
  written in the background (``StatusWriter``), never while a cycle acts, so they do not
  slow its writes: nothing the next cycle does depends on their answers, and at hundreds of
  jobs waiting for them made the next plan, and any admission behind it, late. A job's
  statuses are written one at a time, the latest one wins (a newer status replaces one not
  yet sent), and the status is laid over the job from the moment it is queued, so the next
  cycle already plans on it;
- what was just written is remembered (``Expectations``) until the watch shows it, so that
  the next cycle does not plan on a view that lacks the pods just created (no duplicates)
  or still shows the ones just deleted as live.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from edl_scheduler.api import API_VERSION, GROUP, KIND, PLURAL, VERSION
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.coordinating import (
    CoordinatorCallError,
    CoordinatorPort,
    GrpcCoordinator,
)
from edl_scheduler.controller.expecting import Expectations, iso_now
from edl_scheduler.controller.intents import (
    CreateCoordinator,
    CreatePod,
    DeleteOrphan,
    DeletePod,
    Drain,
    Emit,
    EnsureObjects,
    Intent,
    MarkDraining,
    PatchStatus,
    SetTarget,
)
from edl_scheduler.controller.kubeapi import MERGE_PATCH, Kube, KubeError, collection_of, namespaced
from edl_scheduler.controller.naming import (
    ANNOTATION_DRAIN_SINCE,
    ANNOTATION_DRAINING,
    STATE_KEY,
    state_config_map_name,
)
from edl_scheduler.controller.reporting import StatusWriter
from edl_scheduler.controller.shaping import Manifest, coordinator_pod, state_config_map

log = logging.getLogger("edl.controller.actuating")

JSON_PATCH = "application/json-patch+json"


@dataclass(slots=True)
class _SavedState:
    """A coordinator's saved state as read beside its Service, for the creation of its pod."""

    read: bool = False
    document: str | None = None


class Actuator:
    """Carries out one cycle's intents."""

    def __init__(
        self,
        kube: Kube,
        config: ControllerConfig,
        coordinators: Callable[[str], CoordinatorPort | None],
        workers: int = 16,
    ) -> None:
        self.kube = kube
        self.config = config
        self.coordinators = coordinators
        self.expectations = Expectations()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="actuate")
        self.writer = StatusWriter(self.expectations, self._patch_status, self._guarded)
        self.errors = 0
        self._marked: set[str] = set()
        #: Jobs whose Service this run ensured, created or already there.
        self._ensured: dict[str, list[str]] = {}
        #: Jobs whose coordinator accepted the planned size in the last run.
        self.targets_set: set[str] = set()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.writer.close()

    def run(self, intents: Sequence[Intent]) -> None:
        """All intents, each write once what it depends on is done, the rest at once.
        Returns once the objects, pods and coordinator calls are done; statuses and Events
        are then queued to ``writer`` and written in the background.

        What waits for what: a job's coordinator pod for its Service and saved state; pods
        created with it (``CreatePod.job``) for its Service; each replica pod for the
        Secret with its credential; a drain for its victim's draining mark. Nothing else
        waits: a victim's drain does not wait for another job's Service, nor a coordinator
        for the victims' marks (under a slow API server, stages that each waited for their
        slowest write added up on every admission)."""
        self._marked = set()
        self._ensured = {}
        self.targets_set = set()
        needed: dict[str, int] = {}
        first: list[tuple[str, Callable[[], None]]] = []  # (what it provides, the write)
        then: list[tuple[tuple[str, ...], Callable[[], None]]] = []  # (what it needs, ...)
        later: list[PatchStatus | Emit] = []
        call: Callable[[], None]
        for intent in intents:
            if isinstance(intent, PatchStatus | Emit):
                later.append(intent)
            elif isinstance(intent, EnsureObjects):
                needed[intent.job] = len(intent.manifests)
                self._ensured[intent.job] = []
                for manifest in intent.manifests:  # independent: at once
                    call = functools.partial(self._ensure, intent.job, manifest)
                    first.append((f"objects {intent.job}", call))
            elif isinstance(intent, CreateCoordinator):
                # Its saved state is read beside the Service it needs, the pod created after.
                key, state = intent.job.key, _SavedState()
                first.append((f"state {key}", functools.partial(self._read_state, intent, state)))
                create = functools.partial(self._create_coordinator, intent, state)
                then.append(
                    (
                        (f"objects {key}", f"state {key}"),
                        functools.partial(self._when_ensured, key, needed, create),
                    )
                )
            elif isinstance(intent, CreatePod) and intent.job:
                create = functools.partial(self._create_pod, intent.manifest, intent.credential)
                then.append(
                    (
                        (f"objects {intent.job}",),
                        functools.partial(self._when_ensured, intent.job, needed, create),
                    )
                )
            elif isinstance(intent, MarkDraining):
                # It depends on nothing, and every moment a victim is not yet told to leave
                # adds to the admission it makes room for.
                mark = functools.partial(self._mark_draining, intent)
                first.append((f"mark {intent.namespace}/{intent.name}", mark))
            elif isinstance(intent, Drain):  # after its pod is marked draining
                namespace = intent.job.split("/", 1)[0]
                drain = functools.partial(self._drain, intent)
                then.append(((f"mark {namespace}/{intent.worker_id}",), drain))
            else:
                first.append(("", self._call(intent)))
        if not first and not then:
            self._queue_later(later)
            return
        self.writer.hold()
        try:
            # Everything a write waits for is submitted before it: the pool takes work in
            # order, so a waiting write never holds a thread that its prerequisite needs.
            provided: dict[str, list[Future[None]]] = {}
            futures: list[Future[None]] = []
            for key, call in first:
                future = self.pool.submit(self._guarded, call)
                provided.setdefault(key, []).append(future)
                futures.append(future)
            for needs, call in then:
                waits = [f for key in needs for f in provided.get(key, ())]
                futures.append(self.pool.submit(self._after, waits, call))
            for future in futures:
                future.result()
        finally:
            self.writer.release()
        self._queue_later(later)

    def _queue_later(self, later: Sequence[PatchStatus | Emit]) -> None:
        for intent in later:
            if isinstance(intent, PatchStatus):
                self.writer.status(intent)
            else:
                self.writer.event(functools.partial(self._emit, intent))

    def _after(self, waits: Sequence[Future[None]], call: Callable[[], None]) -> None:
        for future in waits:
            future.result()  # ``_guarded`` never raises: a failure shows in what it recorded
        self._guarded(call)

    def _guarded(self, call: Callable[[], None]) -> None:
        try:
            call()
        except KubeError as error:
            self.errors += 1
            log.warning("API call failed, left to the next cycle: %s", error)
        except CoordinatorCallError as error:
            log.info("coordinator call failed, left to the next cycle: %s", error)
        except Exception:
            self.errors += 1
            log.exception("unexpected failure while acting")

    def _when_ensured(self, job: str, needed: Mapping[str, int], call: Callable[[], None]) -> None:
        """``call`` only if the job's objects ensured in this run (before it; its Service)
        all exist: a pod never runs without them (a failed write is logged; the next cycle
        decides again)."""
        if len(self._ensured.get(job, ())) < needed.get(job, 0):
            log.info("%s: its Service (or TLS Secret) is not there yet; its pods wait", job)
            return
        call()

    def _call(self, intent: Intent) -> Callable[[], None]:
        """The writes that wait for nothing."""
        if isinstance(intent, CreatePod):
            return lambda: self._create_pod(intent.manifest, intent.credential)
        if isinstance(intent, DeletePod):
            return lambda: self._delete_pod(intent)
        if isinstance(intent, DeleteOrphan):
            return lambda: self._delete_orphan(intent)
        if isinstance(intent, SetTarget):
            return lambda: self._coordinator(intent.job, functools.partial(self._target, intent))
        raise TypeError(f"not an intent acted on here: {intent!r}")

    # ----- objects -----

    def _ensure(self, job: str, manifest: Mapping[str, Any]) -> None:
        try:
            self.kube.request("POST", collection_of(manifest), manifest)
        except KubeError as error:
            if error.status != 409:
                raise
        self._ensured[job].append(str(manifest["kind"]))  # list.append: thread-safe

    def _target(self, intent: SetTarget, coordinator: CoordinatorPort) -> None:
        coordinator.set_target(intent.workers)
        self.targets_set.add(intent.job)

    def _create_pod(self, manifest: dict[str, Any], credential: Manifest | None = None) -> None:
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        if credential is not None:  # first: the pod's container starts only once it exists
            try:
                self.kube.request("POST", namespaced(key[0], "secrets"), credential)
            except KubeError as error:
                if error.status != 409:
                    raise
        shown = copy.deepcopy(manifest)
        shown["metadata"]["creationTimestamp"] = iso_now()
        shown["status"] = {"phase": "Pending"}
        with self.expectations.lock:
            self.expectations.created[key] = (shown, time.monotonic())
        try:
            self.kube.request("POST", namespaced(key[0], "pods"), manifest)
        except KubeError as error:
            if error.status == 409:
                return
            if error.status == 0 or error.status >= 500:
                # The pod may exist although the answer was lost: look before forgetting
                # it, or the next cycle would create a second one for the same slot.
                try:
                    self.kube.request("GET", namespaced(key[0], "pods", key[1]))
                    return
                except KubeError as check:
                    if check.status != 404:
                        raise error from None
            with self.expectations.lock:
                self.expectations.created.pop(key, None)
            raise

    def _read_state(self, intent: CreateCoordinator, state: _SavedState) -> None:
        """The state the job's last coordinator left in its ConfigMap (none: a new job)."""
        tj = intent.job
        name = state_config_map_name(tj.metadata.name)
        try:
            found = self.kube.request("GET", namespaced(tj.metadata.namespace, "configmaps", name))
            state.document = (found.get("data") or {}).get(STATE_KEY) or None
        except KubeError as error:
            if error.status != 404:
                raise
        state.read = True

    def _create_coordinator(self, intent: CreateCoordinator, state: _SavedState) -> None:
        """Only once its saved state was read: a coordinator started without the state its
        predecessor left would start the job over."""
        if not state.read:
            return  # the read failed (logged): the next cycle tries again
        pod = coordinator_pod(intent.job, intent.node, intent.port, self.config, state.document)
        self._create_pod(pod)

    def _delete_pod(self, intent: DeletePod) -> None:
        key = (intent.namespace, intent.name)
        with self.expectations.lock:
            self.expectations.deleted[key] = time.monotonic()
        try:
            self.kube.request("DELETE", namespaced(intent.namespace, "pods", intent.name))
        except KubeError as error:
            if error.status != 404:
                raise

    def _delete_orphan(self, intent: DeleteOrphan) -> None:
        """The pod goes only if its job is really gone (404 on a live read)."""
        job = namespaced(intent.namespace, PLURAL, intent.job, group=f"{GROUP}/{VERSION}")
        try:
            self.kube.request("GET", job)
            return  # the job exists: our cache is behind, not the job gone
        except KubeError as error:
            if error.status != 404:
                raise
        log.info("%s/%s: its job %s is gone; deleted", intent.namespace, intent.name, intent.job)
        self._delete_pod(DeletePod(intent.namespace, intent.name))

    def _mark_draining(self, intent: MarkDraining) -> None:
        annotations = {ANNOTATION_DRAINING: "true", ANNOTATION_DRAIN_SINCE: f"{intent.since:.3f}"}
        with self.expectations.lock:
            self.expectations.annotated[(intent.namespace, intent.name)] = (
                annotations,
                time.monotonic(),
            )
        self.kube.request(
            "PATCH",
            namespaced(intent.namespace, "pods", intent.name),
            {"metadata": {"annotations": annotations}},
            content_type=MERGE_PATCH,
        )
        self._marked.add(intent.name)

    def _drain(self, intent: Drain) -> None:
        """Only a pod marked draining is drained: otherwise the planner, which does not see
        it leaving, would keep counting it."""
        if intent.worker_id in self._marked:
            self._coordinator(intent.job, lambda c: c.drain(intent.worker_id))

    def save_state(self, namespace: str, name: str, job_manifest_of: Callable[[], Any]) -> None:
        """Keeps a coordinator snapshot in the job's ConfigMap (created on first use)."""
        cm = job_manifest_of()
        path = namespaced(namespace, "configmaps", cm["metadata"]["name"])
        try:
            self.kube.request("PATCH", path, {"data": cm["data"]}, content_type=MERGE_PATCH)
        except KubeError as error:
            if error.status != 404:
                raise
            self.kube.request("POST", namespaced(namespace, "configmaps"), cm)

    def _coordinator(self, job: str, call: Callable[[CoordinatorPort], None]) -> None:
        port = self.coordinators(job)
        if port is not None:
            call(port)

    # ----- status and events -----

    def _patch_status(self, intent: PatchStatus) -> str:
        """Writes the status; returns the resourceVersion the write produced ("" if the
        answer had none)."""
        key = f"{intent.namespace}/{intent.name}"
        path = namespaced(intent.namespace, PLURAL, intent.name, group=f"{GROUP}/{VERSION}")
        try:
            answer = self.kube.request(
                "PATCH",
                f"{path}/status",
                [{"op": "add", "path": "/status", "value": intent.status}],
                content_type=JSON_PATCH,
            )
        except KubeError as error:
            if error.status == 422:
                log.error("the API refused the status of %s: %s (%s)", key, error, intent.status)
            raise
        return str((answer or {}).get("metadata", {}).get("resourceVersion", ""))

    def _emit(self, intent: Emit) -> None:
        now = iso_now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{intent.name}.", "namespace": intent.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": intent.name,
                "namespace": intent.namespace,
                "uid": intent.uid,
            },
            "reason": intent.reason.value,
            "message": intent.message[:1024],
            "type": intent.type.value,
            "source": {"component": "edl-controller"},
            "reportingComponent": "edl.dev/controller",
            "reportingInstance": self.config.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.kube.request("POST", namespaced(intent.namespace, "events"), event)


def coordinator_client(address: str, token: str, timeout_s: float) -> CoordinatorPort:
    return GrpcCoordinator(address, token, timeout_s)


__all__ = ["Actuator", "Expectations", "StatusWriter", "coordinator_client", "state_config_map"]

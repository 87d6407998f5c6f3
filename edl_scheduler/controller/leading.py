"""Leader election on a coordination.k8s.io Lease: of several replicas, exactly one acts.

Why not kopf's peering: it freezes every peer of equal priority, and the replicas of one
Deployment share one priority, so all of them would stand still. Here every replica watches
and keeps its caches warm; a thread of its own (``renewing``) takes or renews the Lease, and
before each cycle, and again before acting, the planning loop asks ``is_leader()`` (no API
call) and only the holder of the Lease acts. The renewal is off the cycle's path: its two
API calls, slow on a loaded API server, were a quarter of a cycle at 200 jobs.

The protocol: the Lease names its holder, when it was last renewed and for how long it
holds. A replica takes the Lease when it is free or its holder let it lapse; it renews it
while it holds it, and gives it up when it stops gracefully (``release``). Every write
carries the resourceVersion it read, so two replicas racing for the Lease cannot both win
(the loser gets 409).

Time: no replica compares another's clock with its own. ``renewTime`` is written for people
to read; whether a Lease has lapsed is measured, as client-go does, from when this replica
last saw the Lease's record change (holder, renewal, duration), on its own monotonic
clock: a holder that renews keeps changing it, so a standby whose wall clock runs ahead
never takes a Lease that is renewed. What must stay true: a replica believes it leads only
until a little less than ``leaseDurationSeconds`` after its last successful write began, on
its monotonic clock, and a standby waits at least ``leaseDurationSeconds`` after it last saw
that write, so an old leader stops acting before a new one may start (clock rates agree,
offsets do not matter).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from edl_scheduler.controller.kubeapi import Kube, KubeError, namespaced

log = logging.getLogger("edl.controller.leading")

LEASES_GROUP = "coordination.k8s.io/v1"


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Holds or waits for one Lease. ``try_lead`` is called by the loop every cycle."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        namespace: str,
        identity: str,
        duration_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: this replica's monotonic clock, the only one its decisions read;
        ``wall``: the time written into the Lease for people to read."""
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration_s = duration_s
        self.clock = clock
        self.wall = wall
        self._valid_until = 0.0
        self._last_renew = 0.0
        #: The Lease's record as last read, and when (``clock``) it was first read so.
        self._seen: tuple[object, ...] | None = None
        self._seen_at = 0.0

    def is_leader(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return now < self._valid_until

    def _lapsed(self, held: dict[str, object], now: float) -> bool:
        """Whether the Lease ``held`` (its spec, as just read) has gone unrenewed for its
        whole duration, as this replica has watched it."""
        record = (
            held.get("holderIdentity"),
            held.get("renewTime"),
            held.get("leaseDurationSeconds"),
            held.get("leaseTransitions"),
        )
        if record != self._seen:
            self._seen, self._seen_at = record, now
        raw = held.get("leaseDurationSeconds")
        duration = float(raw) if isinstance(raw, int | float | str) else self.duration_s
        return now >= self._seen_at + duration

    def renewing(
        self, stopping: threading.Event, elected: Callable[[], None] = lambda: None
    ) -> None:
        """Takes or renews the Lease until ``stopping``: a leader renews every third of the
        duration (``try_lead`` calls the API no more often), a standby asks every sixth.
        ``elected`` is called each time this replica starts to lead."""
        while not stopping.is_set():
            was = self.is_leader()
            try:
                if self.try_lead() and not was:
                    elected()
            except Exception:
                log.exception("leader election failed; trying again")
            stopping.wait(self.duration_s / 6)

    def try_lead(self) -> bool:
        """Renew (at most every third of the duration) or take the Lease; whether we lead."""
        now = self.clock()
        if self.is_leader(now) and now - self._last_renew < self.duration_s / 3:
            return True
        path = namespaced(self.namespace, "leases", self.name, group=LEASES_GROUP)
        try:
            lease = self.kube.request("GET", path)
        except KubeError as error:
            if error.status != 404:
                log.warning("cannot read the Lease: %s", error)
                return self.is_leader()
            lease = None
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(self.duration_s)),
            "renewTime": _micro(self.wall()),
        }
        try:
            if lease is None:
                spec["acquireTime"] = spec["renewTime"]
                body = {
                    "apiVersion": LEASES_GROUP,
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                }
                self.kube.request(
                    "POST", namespaced(self.namespace, "leases", group=LEASES_GROUP), body
                )
            else:
                held = lease.get("spec", {})
                holder = held.get("holderIdentity")
                # Read after the GET returned: a slow read must not date the record before
                # a renewal it already shows (it would lapse early).
                lapsed = self._lapsed(held, self.clock())
                if holder and holder != self.identity and not lapsed:
                    self._valid_until = 0.0
                    return False
                if holder != self.identity:
                    spec["acquireTime"] = spec["renewTime"]
                    spec["leaseTransitions"] = int(held.get("leaseTransitions", 0)) + 1
                    log.info("taking the Lease from %s", holder or "nobody")
                else:
                    spec["acquireTime"] = held.get("acquireTime") or spec["renewTime"]
                    spec["leaseTransitions"] = int(held.get("leaseTransitions", 0))
                lease["spec"] = spec
                self.kube.request("PUT", path, lease)  # carries resourceVersion: 409 if raced
        except KubeError as error:
            log.info("did not get the Lease: %s", error)
            if error.status == 409:
                self._valid_until = 0.0
            return self.is_leader()
        self._last_renew = now
        # Stop believing a little before the others may take over.
        self._valid_until = now + self.duration_s * 0.8
        return True

    def release(self) -> bool:
        """Gives the Lease up at a graceful stop (a rolling update, a drained node), so that
        a standby takes it at its next try, a sixth of the duration later, instead of waiting
        up to the whole duration for it to lapse. Whether the Lease was ours and is now free.

        Call it only once this replica acts no more (no cycle in flight) and ``renewing`` has
        returned, else a renewal could take the Lease back. From here on this replica never
        believes it leads. The write carries the resourceVersion it read, so a Lease another
        replica took meanwhile is left alone."""
        self._valid_until = 0.0
        path = namespaced(self.namespace, "leases", self.name, group=LEASES_GROUP)
        try:
            lease = self.kube.request("GET", path)
            held = lease.get("spec", {})
            if held.get("holderIdentity") != self.identity:
                return False
            held["holderIdentity"] = None
            held["leaseDurationSeconds"] = 1
            held["renewTime"] = _micro(self.wall())
            lease["spec"] = held
            self.kube.request("PUT", path, lease)
        except KubeError as error:
            log.warning("could not give the Lease up (a standby waits for it to lapse): %s", error)
            return False
        log.info("gave the Lease %s/%s up", self.namespace, self.name)
        return True

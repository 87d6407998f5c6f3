"""The planner's reservations, kept in a ConfigMap so that they outlive the leader.

When a job is admitted by draining others, the plan returns reservations: the freed capacity
is held for that job until its replicas are there (the planner's invariant 7: no lower job
takes it meanwhile). The holds pass from one plan to the next through the snapshot, so a
leader that only kept them in memory would lose them on a restart or failover, in exactly
the window between a shrink and the admitted job's start.

So the leader writes them to one ConfigMap, ``<lease-name>-reservations`` in the Lease's
namespace (key ``reservations.json``: a JSON list of ``{job, node, role, count,
expiresAt}``, ``expiresAt`` in Unix seconds), before it acts on the plan that made them, and
only when they changed. A replica that becomes leader reads it once before its first plan;
until that read succeeds it does not plan (a new leader never plans without the holds the
last one made). The ConfigMap belongs to the controller, not to a job: deleting a job
leaves its holds there until the next plan drops them (the planner ignores holds of jobs it
does not know, and of expired ones).

What must stay true: a content that cannot be read (edited by hand) is reported with the
field at fault and treated as no holds, never a reason to stop planning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from edl_scheduler.controller.kubeapi import MERGE_PATCH, Kube, KubeError, namespaced
from edl_scheduler.core import Reservation, Role

log = logging.getLogger("edl.controller.reserving")

DATA_KEY = "reservations.json"


class ReservationFormatError(ValueError):
    """The stored reservations are not what this module writes."""


def encode(reservations: Iterable[Reservation]) -> str:
    """The ConfigMap's text: sorted, expiry to the millisecond, so equal holds read equal."""
    items = [
        {
            "job": r.job,
            "node": r.node,
            "role": r.role.value,
            "count": r.count,
            "expiresAt": round(r.expires_at, 3),
        }
        for r in reservations
    ]
    items.sort(key=lambda i: (str(i["job"]), str(i["node"]), str(i["role"])))
    return json.dumps(items, separators=(",", ":"))


def decode(text: str) -> tuple[Reservation, ...]:
    """The reservations in ``text``; ``ReservationFormatError`` names the entry and field."""
    try:
        items = json.loads(text)
    except ValueError as error:
        raise ReservationFormatError(f"{DATA_KEY}: not JSON ({error})") from None
    if not isinstance(items, list):
        raise ReservationFormatError(f"{DATA_KEY}: expected a list of reservations")
    out: list[Reservation] = []
    for i, item in enumerate(items):
        where = f"{DATA_KEY}[{i}]"
        if not isinstance(item, dict):
            raise ReservationFormatError(f"{where}: expected an object")
        try:
            role = Role(item["role"])
        except (KeyError, ValueError):
            raise ReservationFormatError(
                f"{where}.role: expected one of {', '.join(r.value for r in Role)}"
            ) from None
        job, node = item.get("job"), item.get("node")
        if not isinstance(job, str) or "/" not in job:
            raise ReservationFormatError(f"{where}.job: expected 'namespace/name'")
        if not isinstance(node, str) or not node:
            raise ReservationFormatError(f"{where}.node: expected a node name")
        count, expires = item.get("count"), item.get("expiresAt")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ReservationFormatError(f"{where}.count: expected an integer >= 1")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            raise ReservationFormatError(f"{where}.expiresAt: expected Unix seconds")
        out.append(Reservation(job, node, role, count, float(expires)))
    return tuple(out)


class ReservationStore:
    """Reads and writes the reservations' ConfigMap; remembers what it holds to skip
    writes that would change nothing."""

    def __init__(self, kube: Kube, namespace: str, lease_name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = f"{lease_name}-reservations"
        self._stored: str | None = None

    def _path(self, name: str | None = None) -> str:
        return namespaced(self.namespace, "configmaps", name)

    def load(self) -> tuple[Reservation, ...]:
        """What the last leader stored (none when there is no ConfigMap yet). Raises
        ``KubeError`` when it cannot be read: the caller plans only after a load succeeds."""
        try:
            body: Any = self.kube.request("GET", self._path(self.name))
        except KubeError as error:
            if error.status != 404:
                raise
            self._stored = None
            return ()
        text = str((body.get("data") or {}).get(DATA_KEY, "[]"))
        self._stored = text
        try:
            return decode(text)
        except ReservationFormatError as error:
            log.error(
                "ConfigMap %s/%s: %s; planning without the stored holds "
                "(the next plan's holds replace it)",
                self.namespace,
                self.name,
                error,
            )
            return ()

    def save(self, reservations: Iterable[Reservation]) -> bool:
        """Store ``reservations`` if they differ from what is stored; whether the ConfigMap
        now holds them. A failure is logged; the next cycle tries again."""
        text = encode(reservations)
        if text == self._stored:
            return True
        patch = {"data": {DATA_KEY: text}}
        try:
            try:
                self.kube.request("PATCH", self._path(self.name), patch, content_type=MERGE_PATCH)
            except KubeError as error:
                if error.status != 404:
                    raise
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "labels": {"app.kubernetes.io/part-of": "edl"},
                    },
                    **patch,
                }
                self.kube.request("POST", self._path(), body)
        except KubeError as error:
            log.warning("cannot store the reservations in %s: %s", self.name, error)
            self._stored = None  # unknown now: write again next time
            return False
        self._stored = text
        return True

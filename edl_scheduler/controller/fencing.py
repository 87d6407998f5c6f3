"""Where the controller acts: only in the namespaces it serves, never in kube-system.

Why: the controller creates pods, Secrets, Services, ConfigMaps and NetworkPolicies from
what a job's author wrote. Two layers keep that inside the namespaces the cluster admin
gave it: the RBAC (it may write only where a RoleBinding grants it the ClusterRole
``edl-operator-workloads``; docs/deploy.md) and this module, which keeps the controller from
even trying elsewhere, and says so:

- ``NamespaceFence`` filters what the watches deliver: a TrainingJob in a namespace not
  served (``ServedNamespaces.refusal``) is never indexed, so it is never planned, given
  pods or written to; it is logged once, with the reason and the fix. A pod of ours in such
  a namespace (labelled as a job's, by someone else) counts as another workload's pod: what
  it takes on its node is taken, and no job of ours owns it;
- ``FencedKube`` refuses, before sending it, any request into a namespace not served, other
  than the controller's own (its Lease and reservations): the last line, should a job from
  elsewhere ever reach the actuator.

What must stay true: nothing of a job in a namespace not served reaches the planner, and no
request for one reaches the API server; the controller's own namespace stays reachable.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from edl_scheduler.controller.config import ServedNamespaces
from edl_scheduler.controller.kubeapi import JSON, Kube, KubeError
from edl_scheduler.controller.naming import LABEL_JOB, LABEL_MANAGED, LABEL_ROLE

log = logging.getLogger("edl.controller.fencing")

Obj = Mapping[str, Any]
_NAMESPACE_IN_PATH = re.compile(r"/namespaces/([^/?]+)")
#: The labels that make a pod one of a job's (``observing.is_ours``).
_OUR_LABELS = frozenset({LABEL_JOB, LABEL_ROLE, LABEL_MANAGED})
#: The status a request refused here carries (the API server's own for "forbidden").
REFUSED = 403


class NamespaceFence:
    """Keeps the watched objects of namespaces not served away from the planner."""

    def __init__(self, served: ServedNamespaces) -> None:
        self.served = served
        self._told: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def admits_job(self, body: Obj) -> bool:
        """Whether the TrainingJob is in a namespace served; the first time one is not, the
        log says which, why and how to serve it."""
        meta = body.get("metadata", {})
        namespace = str(meta.get("namespace", ""))
        why = self.served.refusal(namespace)
        if why is None:
            return True
        key = (namespace, str(meta.get("name", "")), str(meta.get("uid", "")))
        with self._lock:
            first = key not in self._told
            self._told.add(key)
        if first:
            log.warning(
                "not acting on TrainingJob %s/%s: %s; it gets no pods and no status",
                key[0],
                key[1],
                why,
            )
        return False

    def pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """The pod as the planner must see it: one in a namespace not served is another
        workload's, whatever its labels say (``body`` is a detached copy: changed in place)."""
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not _OUR_LABELS & labels.keys() or self.served.serves(str(meta.get("namespace", ""))):
            return body
        meta["labels"] = {k: v for k, v in labels.items() if k not in _OUR_LABELS}
        return body


class FencedKube(Kube):
    """``inner``'s requests, less those into a namespace not served (``own`` excepted),
    which raise ``KubeError(403)`` without reaching the API server."""

    def __init__(self, inner: Kube, served: ServedNamespaces, own: str) -> None:
        super().__init__(inner.api_client, inner.timeout_s)
        self.inner = inner
        self.served = served
        self.own = own

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = JSON,
    ) -> Any:
        found = _NAMESPACE_IN_PATH.search(path)
        if found is not None and found.group(1) != self.own:
            why = self.served.refusal(found.group(1))
            if why is not None:
                log.error("refused to send %s %s: %s", method, path, why)
                raise KubeError(REFUSED, f"{method} {path}: not sent: {why}")
        return self.inner.request(method, path, body, query=query, content_type=content_type)

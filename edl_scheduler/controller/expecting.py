"""What the controller just wrote and the watch does not show yet (``Expectations``).

The cache the planner reads lags the API server's answers: a pod just created is not in
it, one just deleted still looks live, a status just written may be replaced by an older
version the watch delivers late. Planning on such a view would create duplicates or undo a
write (a Failed job started again). So every write is remembered here until the watch
shows it (or a later change), or until ``EXPECTATION_TTL_S``, and laid over the cache.

What must stay true: an expectation is dropped as soon as the watch shows what it
expected, and never outlives ``EXPECTATION_TTL_S``; a status expectation holds the latest
status queued for its job (``QUEUED`` until the API server answered its write).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = Mapping[str, Any]
#: How long a written change is assumed, if the watch never shows it.
EXPECTATION_TTL_S = 30.0
#: The resourceVersion of a status queued and not yet answered (``Expectations.statuses``).
QUEUED = ""


def iso_now() -> str:
    """Now, as Kubernetes writes a timestamp."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class Expectations:
    """Writes not yet seen through the watch, laid over the cached pods and job statuses."""

    created: dict[tuple[str, str], tuple[dict[str, Any], float]] = field(default_factory=dict)
    deleted: dict[tuple[str, str], float] = field(default_factory=dict)
    annotated: dict[tuple[str, str], tuple[dict[str, str], float]] = field(default_factory=dict)
    #: job key -> (status written, the resourceVersion our write produced, when); the
    #: version is ``QUEUED`` while the write has not been answered yet.
    statuses: dict[str, tuple[dict[str, Any], str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def overlay_pods(self, pods: Iterable[Obj], now: float) -> list[Obj]:
        with self.lock:
            self._expire(now)
            out: list[Obj] = []
            seen: set[tuple[str, str]] = set()
            for pod in pods:
                meta = pod.get("metadata", {})
                key = (str(meta.get("namespace")), str(meta.get("name")))
                seen.add(key)
                self.created.pop(key, None)
                if key in self.deleted and not meta.get("deletionTimestamp"):
                    pod = copy.deepcopy(dict(pod))
                    pod["metadata"]["deletionTimestamp"] = iso_now()
                elif key in self.annotated:
                    wanted = self.annotated[key][0]
                    have = meta.get("annotations") or {}
                    if all(have.get(k) == v for k, v in wanted.items()):
                        del self.annotated[key]
                    else:
                        pod = copy.deepcopy(dict(pod))
                        pod["metadata"]["annotations"] = dict(have) | wanted
                out.append(pod)
            for key, (manifest, _) in self.created.items():
                if key not in seen and key not in self.deleted:
                    out.append(manifest)
            return out

    def overlay_job(self, body: Obj) -> Obj:
        """The job with the status we last wrote, until the watch shows that write (or a
        later change): a lagging watch may first deliver older versions, and planning on
        one of those would undo the write (a Failed job started again)."""
        meta = body.get("metadata", {})
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self.lock:
            found = self.statuses.get(key)
            if found is None:
                return body
            status, written_rv, _ = found
            if written_rv != QUEUED and _not_older(
                str(meta.get("resourceVersion", "")), written_rv
            ):
                del self.statuses[key]
                return body
        return dict(body) | {"status": status}

    def status_unseen(self, key: str) -> bool:
        """Whether a status of job ``key`` that this controller queued or wrote is not yet
        seen through the watch (call after ``overlay_job``, which forgets a seen one)."""
        with self.lock:
            return key in self.statuses

    def _expire(self, now: float) -> None:
        for table in (self.created, self.annotated):
            for key in [k for k, (_, t) in table.items() if now - t > EXPECTATION_TTL_S]:
                del table[key]
        for key in [k for k, t in self.deleted.items() if now - t > EXPECTATION_TTL_S]:
            del self.deleted[key]
        for job in [k for k, (_, _, t) in self.statuses.items() if now - t > EXPECTATION_TTL_S]:
            del self.statuses[job]


def _not_older(seen: str, written: str) -> bool:
    """Whether the version seen is the one written or a later one. Kubernetes calls
    resourceVersions opaque; they are etcd revisions (integers) on every API server we
    know, and compared as such; anything else counts as seen only when equal."""
    if seen.isdigit() and written.isdigit():
        return int(seen) >= int(written)
    return seen == written

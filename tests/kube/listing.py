"""A list-then-watch loop over the API's raw JSON, for the kubelet in miniature.

The kubelet keeps the pods bound to nodes this way, as a real kubelet keeps them through
an informer. The client's model classes are skipped on purpose:
turning every watch event into them and back costs more than everything else the kubelet
does with hundreds of pods.

What must stay true: under `lock`, `store` maps uid -> object and equals what the API holds
as of the last event read; `changed` is set after every change; the loop ends soon after
`stopping` is set (each watch request lasts at most a few seconds); a watch that expired
(410) is followed by a fresh list, other failures by a retry after half a second.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def keep_listed(
    list_all: Callable[..., Any],
    store: dict[str, Obj],
    lock: threading.Lock,
    changed: threading.Event,
    stopping: threading.Event,
    *,
    field_selector: str | None = None,
) -> None:
    """Keeps `store` (uid -> object) equal to what `list_all` lists: list, then watch from
    there; list afresh when the watch has expired; retry after connection trouble."""
    selector = {"field_selector": field_selector} if field_selector else {}
    resource_version: str | None = None
    while not stopping.is_set():
        try:
            if resource_version is None:
                # The API's JSON as it is: the client's models cost more than the rest.
                answer = list_all(_preload_content=False, **selector)
                listed = json.loads(answer.data)
                with lock:
                    store.clear()
                    store.update((o["metadata"]["uid"], o) for o in listed["items"])
                resource_version = listed["metadata"]["resourceVersion"]
                changed.set()
            answer = list_all(
                watch=True,
                resource_version=resource_version,
                timeout_seconds=2,
                _request_timeout=10,
                _preload_content=False,
                **selector,
            )
            try:
                for line in iter_resp_lines(answer):
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                    resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    with lock:
                        if event["type"] == "DELETED":
                            store.pop(obj["metadata"]["uid"], None)
                        else:
                            store[obj["metadata"]["uid"]] = obj
                    changed.set()
                    if stopping.is_set():
                        return
            finally:
                answer.close()
                answer.release_conn()
        except ApiException as error:
            if error.status == 410:
                resource_version = None
            else:
                log.warning("watch failed: %s; retrying", error)
                stopping.wait(0.5)
        except Exception as error:
            if stopping.is_set():
                return
            log.warning("watch broke: %s; retrying", error)
            stopping.wait(0.5)


class Listings:
    """Several ``keep_listed`` loops sharing one lock and one ``changed`` event, each in a
    thread of its own: started on entering, stopped (and joined) on leaving. Subclasses
    name their stores and call ``listing`` for each before entering."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def listing(
        self, list_all: Callable[..., Any], store: dict[str, Obj], field_selector: str | None = None
    ) -> None:
        self.threads.append(
            threading.Thread(
                target=keep_listed,
                args=(list_all, store, self.lock, self.changed, self.stopping),
                kwargs={"field_selector": field_selector},
                daemon=True,
            )
        )

    def __enter__(self) -> Any:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(15)

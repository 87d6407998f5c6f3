"""Statuses and Events written in the background (``StatusWriter``), never while a cycle
acts, so that they do not slow the cycle's own writes (drain marks, pods): nothing the next
cycle does depends on their answers, and at hundreds of jobs waiting for them made the next
plan, and any admission behind it, late.

What must stay true: see ``StatusWriter``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait

from edl_scheduler.controller.expecting import QUEUED, Expectations
from edl_scheduler.controller.intents import PatchStatus

#: Threads writing statuses and Events in the background, apart from the cycle's own.
STATUS_WRITERS = 4
#: The longest a background write waits for a cycle to finish acting.
HOLD_LIMIT_S = 2.0


class StatusWriter:
    """Writes statuses and Events in the background, so that a cycle never waits for them.

    What must stay true: one write at a time per job, in the order decided, and only the
    latest queued status of a job is sent (an older one not yet sent is dropped: each status
    is whole, the latest says everything); the expectation of a job's status is the latest
    queued one until it is answered; a failed write drops the expectation it set (unless a
    newer status was queued meanwhile), so the next cycle decides from what the API holds
    and writes again. Events are independent creates, posted as they come."""

    def __init__(
        self,
        expectations: Expectations,
        patch: Callable[[PatchStatus], str],
        guarded: Callable[[Callable[[], None]], None],
        workers: int = STATUS_WRITERS,
    ) -> None:
        self.expectations = expectations
        self.patch = patch
        self.guarded = guarded
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="status")
        self._lock = threading.Lock()
        self._queued: dict[str, PatchStatus] = {}
        self._writing: set[str] = set()
        #: Cleared while a cycle acts: its writes (drain marks, pods) go first.
        self._open = threading.Event()
        self._open.set()
        #: Writes submitted and not yet done (statuses and Events): what ``flush`` waits for.
        self._pending: set[Future[None]] = set()

    def hold(self) -> None:
        """A cycle acts: no background write starts until ``release`` (or ``HOLD_LIMIT_S``)."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def status(self, intent: PatchStatus) -> None:
        key = f"{intent.namespace}/{intent.name}"
        with self.expectations.lock:
            self.expectations.statuses[key] = (intent.status, QUEUED, time.monotonic())
        with self._lock:
            self._queued[key] = intent
            if key in self._writing:
                return  # the job's writer sends it after the write in flight
            self._writing.add(key)
        self._submit(functools.partial(self._write_all, key))

    def event(self, post: Callable[[], None]) -> None:
        self._submit(functools.partial(self.guarded, functools.partial(self._when_open, post)))

    def _submit(self, call: Callable[[], None]) -> None:
        future = self.pool.submit(call)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def flush(self, timeout_s: float) -> bool:
        """Sends what is queued at once (no cycle holds it back any more) and waits up to
        ``timeout_s`` for every status and Event to be written; whether none is left. A
        leader that stops calls it before giving its Lease up, so that no write of its last
        cycle is lost or lands over what the next leader writes."""
        self._open.set()
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._pending)
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                return not pending
            futures_wait(pending, timeout=left)

    def _when_open(self, call: Callable[[], None]) -> None:
        self._open.wait(HOLD_LIMIT_S)
        call()

    def idle(self) -> bool:
        """Whether no status is queued or being written (for tests)."""
        with self._lock:
            return not self._writing

    def _write_all(self, key: str) -> None:
        while True:
            with self._lock:
                intent = self._queued.pop(key, None)
                if intent is None:
                    self._writing.discard(key)
                    return
            self.guarded(
                functools.partial(self._when_open, functools.partial(self._write, key, intent))
            )

    def _write(self, key: str, intent: PatchStatus) -> None:
        written = ""
        try:
            written = self.patch(intent)
        finally:
            with self.expectations.lock:
                found = self.expectations.statuses.get(key)
                if found is not None and found[0] is intent.status:  # no newer one queued
                    if written:
                        self.expectations.statuses[key] = (intent.status, written, found[2])
                    else:
                        del self.expectations.statuses[key]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

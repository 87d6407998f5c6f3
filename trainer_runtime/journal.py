"""What one worker trained in its latest epoch, kept for a coordinator that may lack it.

Why: a coordinator replaced from a saved state older than its last answers lacks the
commits made after that state was saved (``coordinator/recovering.py``). The worker that
made them reports them when it registers again with the replacement; this journal is what
it reports. Only the latest epoch is kept: a report of a later epoch tells the coordinator
that the earlier ones ended (an epoch advances only once all its samples are committed).

What must stay true: the journal holds every range of the worker's latest epoch whose
commit it sent and did not see refused as a conflict (answered, or refused because the
coordinator was replaced); `report()` is those ranges, sorted, touching ones joined.
"""

from __future__ import annotations

from trainer_runtime.sharding import SampleRange


class TrainedJournal:
    """The ranges one worker trained in its latest epoch."""

    def __init__(self) -> None:
        self.epoch = -1
        self.ranges: list[SampleRange] = []
        #: The newest lease id the worker committed (or tried to): a replacement numbers
        #: its leases past it.
        self.last_lease_id = 0

    def recording(self, epoch: int, samples: SampleRange, lease_id: int = 0) -> None:
        self.last_lease_id = max(self.last_lease_id, lease_id)
        if epoch < self.epoch:
            return  # the coordinator knows that epoch ended
        if epoch > self.epoch:
            self.epoch, self.ranges = epoch, []
        self.ranges.append(samples)

    def report(self) -> tuple[tuple[int, SampleRange], ...]:
        """(epoch, samples) of the latest epoch, sorted, with touching ranges joined."""
        joined: list[SampleRange] = []
        for current in sorted(self.ranges):
            if joined and current.start <= joined[-1].stop:
                joined[-1] = SampleRange(joined[-1].start, max(joined[-1].stop, current.stop))
            else:
                joined.append(current)
        return tuple((self.epoch, r) for r in joined)

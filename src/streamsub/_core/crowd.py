"""How many single publishes a publisher has outstanding: the crowd of callers
that ``_core/batch.py`` writes in halves.

A single publish is a ``publish()`` of one message (its caller's only one,
awaited or not); a ``publish_many`` is one caller however many messages it
holds, and is not counted. A single publish is outstanding from the call
until the write that holds it is answered (stored or failed), or until it is
dropped unwritten.

:attr:`CrowdMeter.concurrency` is what the batcher splits by: the most
single publishes seen outstanding in the last few rounds of writes (a round
ends at each answer), and never less than those outstanding now, so that a
crowd that grows is seen as it grows, and one that leaves is forgotten within
``rounds`` answers.
"""

from __future__ import annotations

from collections import deque

__all__ = ["CrowdMeter"]


class CrowdMeter:
    """Counts single publishes queued and being written; their recent peak."""

    __slots__ = ("_lone_of", "_peak", "_peaks", "_queued", "_writing", "concurrency")

    def __init__(self, rounds: int = 4) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        self._queued = 0
        """Single publishes in the open batch or in batches not yet started."""
        self._writing = 0
        """Single publishes in writes started and not yet answered."""
        self._lone_of: dict[int, int] = {}
        """Per write started and not yet answered (by number), its single publishes."""
        self._peak = 0
        """The most outstanding since the last answer."""
        self._peaks: deque[int] = deque(maxlen=rounds)
        self.concurrency = 0
        """The most single publishes outstanding in the last ``rounds`` rounds
        of writes, or now if more."""

    @property
    def outstanding(self) -> int:
        """Single publishes queued or being written now."""
        return self._queued + self._writing

    def published(self) -> None:
        """A single publish was queued."""
        self._queued = queued = self._queued + 1
        outstanding = queued + self._writing
        if outstanding > self._peak:  # never above concurrency: only then can this be
            self._peak = outstanding
            if outstanding > self.concurrency:
                self.concurrency = outstanding

    def dropped(self, count: int) -> None:
        """``count`` queued single publishes failed before any write took them."""
        self._queued -= count

    def started(self, write: int, lone: int) -> None:
        """Write number ``write`` started with ``lone`` of the queued single publishes."""
        if lone:
            self._queued -= lone
            self._writing += lone
            self._lone_of[write] = lone

    def answered(self, write: int) -> None:
        """Write ``write`` came back (or failed): a round of writes ends."""
        self._writing -= self._lone_of.pop(write, 0)
        self._peaks.append(self._peak)
        self._peak = self._queued + self._writing
        self.concurrency = max(max(self._peaks), self._peak)

    def ended(self, write: int) -> None:
        """Write ``write`` is over; if it was never answered (cancelled before it
        ran), its single publishes are no longer being written."""
        self._writing -= self._lone_of.pop(write, 0)

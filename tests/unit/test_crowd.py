"""The crowd meter: single publishes outstanding, and their recent peak."""

from __future__ import annotations

import pytest

from streamsub._core.batch import Batcher
from streamsub._core.crowd import CrowdMeter
from streamsub._settings import BatchSettings


def test_a_growing_crowd_is_seen_as_it_grows() -> None:
    meter = CrowdMeter()
    for n in range(1, 301):
        meter.published()
        assert meter.concurrency == n
    assert meter.outstanding == 300


def test_writes_move_single_publishes_from_queued_to_answered() -> None:
    meter = CrowdMeter()
    for _ in range(10):
        meter.published()
    meter.started(1, 6)
    meter.started(2, 0)  # a publish_many's write: no single publish in it
    assert meter.outstanding == 10
    meter.answered(1)
    assert meter.outstanding == 4
    meter.answered(2)
    meter.started(3, 4)
    meter.answered(3)
    assert meter.outstanding == 0


def test_a_steady_crowd_written_in_halves_keeps_its_size() -> None:
    """100 callers, each publishing again once its write is answered, written in
    two writes of 50: after any answer the crowd still reads 100, even when the
    other half is answered before its callers publish again."""
    meter = CrowdMeter()
    for _ in range(100):
        meter.published()
    meter.started(1, 50)
    meter.started(2, 50)
    number = 3
    for _ in range(20):
        meter.answered(number - 2)
        assert meter.concurrency == 100
        meter.answered(number - 1)  # both halves back before anyone publishes
        assert meter.concurrency == 100
        for _ in range(100):
            meter.published()
        meter.started(number, 50)
        meter.started(number + 1, 50)
        number += 2


def test_a_crowd_that_leaves_is_forgotten_within_rounds_answers() -> None:
    meter = CrowdMeter(rounds=4)
    for _ in range(500):
        meter.published()
    meter.started(1, 500)
    meter.answered(1)
    assert meter.concurrency == 500
    number = 2
    readings = []
    for _ in range(5):  # now 3 callers
        for _ in range(3):
            meter.published()
        meter.started(number, 3)
        meter.answered(number)
        readings.append(meter.concurrency)
        number += 1
    assert readings == [500, 500, 500, 3, 3]


def test_a_write_that_ends_unanswered_no_longer_counts() -> None:
    """A write cancelled before it ran is never answered: its end drops its
    single publishes; the end of an answered write changes nothing."""
    meter = CrowdMeter()
    for _ in range(8):
        meter.published()
    meter.started(1, 5)
    meter.started(2, 3)
    meter.ended(1)
    assert meter.outstanding == 3
    meter.answered(2)
    meter.ended(2)
    assert meter.outstanding == 0


def test_dropped_single_publishes_leave_the_queue() -> None:
    meter = CrowdMeter()
    for _ in range(7):
        meter.published()
    meter.dropped(7)
    assert meter.outstanding == 0


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds"):
        CrowdMeter(rounds=0)


def test_a_burst_beside_a_small_crowd_is_not_cut_into_its_halves() -> None:
    """A crowd of 20 has been seen (full at 10); then 1,000 single publishes come
    at once (an ``asyncio.gather``): the crowd is seen to grow with them, so
    their batches grow too (doubling), and 1,000 go out in a handful of
    batches, not a hundred of 10."""
    meter = CrowdMeter()
    batcher: Batcher[int, int] = Batcher(BatchSettings(), split_at=8)
    for _ in range(20):
        meter.published()
    meter.started(1, 20)
    meter.answered(1)
    assert meter.concurrency == 20
    closed = []
    for i in range(1000):
        meter.published()
        batcher.concurrency = meter.concurrency
        if batcher.add(0, b"m", 1, i, now=0.0, lone=True):
            closed.append(batcher.lone)
            batcher.take()
    assert sum(closed) + batcher.lone == 1000
    assert len(closed) <= 10, closed

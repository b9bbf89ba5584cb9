"""The subscriber's flow controller: what may be read, and what may run, now."""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from streamsub._core.flow import FlowController, FlowStatistics, Grant
from streamsub._settings import FlowControl


def controller(max_messages: int = 1000, max_bytes: int = 100) -> FlowController[str]:
    """A flow controller whose items are message names."""
    return FlowController(FlowControl(max_messages=max_messages, max_bytes=max_bytes))


def warmed(max_messages: int, max_bytes: int = 10**6) -> FlowController[str]:
    """A controller that has seen one 1-byte message, so it reserves by message count."""
    flow = controller(max_messages=max_messages, max_bytes=max_bytes)
    flow.received([("seed", 1)], flow.reserve(1))
    flow.finished(1)
    return flow


def test_a_reservation_takes_at_most_the_free_messages() -> None:
    """With nothing outstanding a read may reserve max_messages, and no more."""
    flow = warmed(10)
    assert flow.reserve(50).messages == 10
    assert flow.reserve(1) == Grant(0, 0)


def test_reservations_shrink_with_outstanding_messages() -> None:
    """Each message read but not yet finished takes one from what may be reserved."""
    flow = warmed(10)
    flow.received([("a", 1), ("b", 1), ("c", 1)])
    assert flow.reserve(100).messages == 7


def test_messages_on_hold_count_against_reservations() -> None:
    """Messages waiting on hold are outstanding, so they count against the budget."""
    flow = controller(max_messages=10, max_bytes=10)
    assert flow.received([("a", 5), ("b", 5), ("c", 5)]) == ["a", "b"]
    assert flow.statistics().on_hold == 1
    assert flow.reserve(100) == Grant(0, 0)  # bytes: 15 of 10 outstanding


def test_the_first_read_asks_for_one_message() -> None:
    """Before any message was seen a read assumes one of max_bytes: it takes one."""
    flow = controller(max_messages=1000, max_bytes=800)
    assert flow.reserve(1000) == Grant(1, 800)
    assert flow.reserve(1000) == Grant(0, 0)


def test_reservations_follow_the_size_of_the_messages_read() -> None:
    """After a read, reservations assume its mean message size: many small ones, few large."""
    flow = controller(max_messages=1000, max_bytes=10_000)
    grant = flow.reserve(1000)
    flow.received([("a", 10), ("b", 30)], grant)
    assert flow.size_estimate == 20
    assert flow.reserve(1000).messages == (10_000 - 40) // 20
    flow2 = controller(max_messages=1000, max_bytes=10_000)
    flow2.received([("big", 4000)], flow2.reserve(1))
    assert flow2.reserve(1000).messages == 1  # 6,000 bytes free: one more of 4,000


def test_outstanding_bytes_bound_reads_not_only_running_ones() -> None:
    """Held bytes, not only running ones, stop further reads: 10 MB messages cannot
    pile up on hold past max_bytes."""
    flow = controller(max_messages=1000, max_bytes=30)
    flow.received([("a", 10)], flow.reserve(1))
    grant = flow.reserve(1000)
    assert grant.messages == 2
    flow.received([("b", 10), ("c", 10)], grant)
    assert flow.reserve(1000) == Grant(0, 0)
    assert flow.statistics().outstanding_bytes == 30


def test_a_message_larger_than_max_bytes_is_read_alone() -> None:
    """With nothing outstanding or reserved one message may be read, however large."""
    flow = controller(max_messages=10, max_bytes=100)
    flow.received([("huge", 1000)], flow.reserve(1))
    assert flow.reserve(10) == Grant(0, 0)
    flow.finished(1000)
    assert flow.reserve(10).messages == 1


def test_priority_refuses_the_others_until_it_has_reserved() -> None:
    """A reclaimer that found no room is served before readers, who are refused meanwhile."""
    flow = warmed(4)
    reader = flow.reserve(4)
    assert flow.reserve(1, priority=True) == Grant(0, 0)
    flow.want_priority()
    flow.unreserve(reader)  # the reader's blocked read came back empty
    assert flow.reserve(4) == Grant(0, 0)
    assert flow.reserve(2, priority=True).messages == 2
    assert flow.reserve(4).messages == 2


def test_unreserve_gives_the_budget_back() -> None:
    """A read that failed or returned nothing frees its reservation."""
    flow = warmed(10)
    first = flow.reserve(6)
    second = flow.reserve(6)
    assert (first.messages, second.messages) == (6, 4)
    flow.unreserve(second)
    flow.received([("a", 1)], first)
    assert flow.reserve(100).messages == 9


def test_entries_held_aside_are_outstanding_but_never_run() -> None:
    """Entries kept for dead-lettering count in messages and bytes until finished."""
    flow = warmed(3)
    assert flow.received([("a", 5)], flow.reserve(3), aside=[7, 8]) == ["a"]
    stats = flow.statistics()
    assert (stats.outstanding_messages, stats.outstanding_bytes) == (3, 20)
    assert stats.running_messages == 1
    assert flow.reserve(1) == Grant(0, 0)
    flow.finished(7, started=False)
    assert flow.reserve(1).messages == 1


def test_received_starts_messages_that_fit() -> None:
    """Messages that fit under both limits start at once, in arrival order."""
    flow = controller(max_messages=10, max_bytes=100)
    assert flow.received([("a", 10), ("b", 20), ("c", 30)]) == ["a", "b", "c"]
    assert flow.statistics() == FlowStatistics(3, 60, 3, 60, 0)


def test_received_holds_by_bytes_in_arrival_order() -> None:
    """A message that does not fit waits, and later smaller ones wait behind it."""
    flow = controller(max_bytes=100)
    assert flow.received([("a", 60), ("b", 60), ("c", 10)]) == ["a"]
    assert flow.statistics().on_hold == 2
    assert flow.received([("d", 1)]) == []
    assert flow.finished(60) == ["b", "c", "d"]


def test_max_messages_bounds_running_handlers() -> None:
    """No more than max_messages run at once; the rest wait on hold."""
    flow = controller(max_messages=2, max_bytes=1000)
    assert flow.received([("a", 1), ("b", 1), ("c", 1)]) == ["a", "b"]
    assert flow.statistics().running_messages == 2
    assert flow.finished(1) == ["c"]


def test_a_message_larger_than_max_bytes_starts_at_once_when_nothing_runs() -> None:
    """A message larger than max_bytes starts if nothing else runs."""
    flow = controller(max_bytes=100)
    assert flow.received([("big", 500)]) == ["big"]
    assert flow.statistics().running_bytes == 500


def test_a_message_larger_than_max_bytes_starts_once_nothing_else_runs() -> None:
    """A message larger than max_bytes waits for running ones, then runs alone."""
    flow = controller(max_bytes=100)
    assert flow.received([("a", 10), ("b", 10)]) == ["a", "b"]
    assert flow.received([("big", 500), ("c", 1)]) == []
    assert flow.finished(10) == []
    assert flow.finished(10) == ["big"]
    assert flow.received([("d", 1)]) == []
    assert flow.finished(500) == ["c", "d"]


def test_finished_releases_bytes_and_admits_what_now_fits() -> None:
    """Finishing a message frees its bytes and starts held messages that now fit."""
    flow = controller(max_bytes=100)
    flow.received([("a", 50), ("b", 50), ("c", 40), ("d", 20)])
    assert flow.statistics() == FlowStatistics(4, 160, 2, 100, 2, paused=True, pauses=1)
    assert flow.finished(50) == ["c"]
    assert flow.statistics() == FlowStatistics(3, 110, 2, 90, 1, paused=True, pauses=1)
    assert flow.finished(50) == ["d"]
    assert flow.statistics() == FlowStatistics(2, 60, 2, 60, 0, pauses=1)  # 60 %: reads again


def test_finished_without_starting_only_releases_the_outstanding_slot() -> None:
    """A held message released unstarted frees its read slot but no running slot."""
    flow = controller(max_messages=5, max_bytes=10)
    flow.received([("a", 8), ("b", 8)])
    assert flow.drain_hold() == ["b"]
    assert flow.finished(8, started=False) == []
    assert flow.statistics() == FlowStatistics(1, 8, 1, 8, 0, paused=True, pauses=1)


def test_drain_hold_takes_every_held_message_in_order() -> None:
    """drain_hold returns the messages on hold in arrival order and empties the hold."""
    flow = controller(max_messages=1)
    flow.received([("a", 1), ("b", 1), ("c", 1)])
    assert flow.drain_hold() == ["b", "c"]
    assert flow.drain_hold() == []
    assert flow.statistics() == FlowStatistics(3, 3, 1, 1, 0, paused=True, pauses=1)


def test_drained_messages_stay_outstanding_until_finished() -> None:
    """Drained messages still count against reservations until each is finished."""
    flow = warmed(3)
    flow.received([("a", 1), ("b", 1), ("c", 1)])
    flow.drain_hold()
    assert flow.reserve(1) == Grant(0, 0)
    flow.finished(1, started=False)
    assert flow.reserve(1).messages == 1


def test_drain_hold_means_finishing_starts_nothing_more() -> None:
    """After drain_hold (shutdown), finishing running messages starts none of the drained ones."""
    flow = controller(max_messages=1)
    flow.received([("a", 1), ("b", 1)])
    flow.drain_hold()
    assert flow.finished(1) == []


def test_statistics_is_a_frozen_snapshot() -> None:
    """statistics() returns a frozen value that later changes do not alter."""
    flow = controller()
    flow.received([("a", 5)])
    snapshot = flow.statistics()
    flow.received([("b", 7)])
    assert snapshot == FlowStatistics(
        outstanding_messages=1,
        outstanding_bytes=5,
        running_messages=1,
        running_bytes=5,
        on_hold=0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.running_bytes = 0  # type: ignore[misc]


def test_empty_receive_starts_nothing() -> None:
    """Receiving no messages changes nothing."""
    flow = controller()
    assert flow.received([]) == []
    assert flow.statistics() == FlowStatistics(0, 0, 0, 0, 0)


class FlowMachine(RuleBasedStateMachine):
    """Random reads, finishes and shutdown drains against a model of the controller."""

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.sizes: dict[int, int] = {}
        self.arrived: list[int] = []
        self.started: list[int] = []
        self.running: set[int] = set()
        self.held: collections.deque[int] = collections.deque()
        self.drained: list[int] = []
        self.finished_count = 0

    @initialize(
        max_messages=st.integers(min_value=1, max_value=8),
        max_bytes=st.integers(min_value=1, max_value=200),
        partitions=st.integers(min_value=1, max_value=4),
    )
    def setup(self, max_messages: int, max_bytes: int, partitions: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.partitions = partitions
        self.flow: FlowController[int] = FlowController(
            FlowControl(max_messages=max_messages, max_bytes=max_bytes)
        )

    def _start(self, items: list[int]) -> None:
        for item in items:
            assert item not in self.started, "a message started twice"
            assert item not in self.drained, "a drained message started"
            assert self.held, "a message started that was not on hold"
            assert self.held[0] == item, "a message overtook the hold"
            self.held.popleft()
            self.started.append(item)
            self.running.add(item)

    @rule(data=st.data())
    def receive(self, data: st.DataObject) -> None:
        grant = self.flow.reserve(data.draw(st.integers(1, 10)))
        if not grant.messages:
            return
        # A read returns no more than it reserved, and perhaps fewer.
        sizes = data.draw(st.lists(st.integers(0, 300), max_size=grant.messages))
        items = []
        for size in sizes:
            self.sizes[self.next_id] = size
            items.append((self.next_id, size))
            self.arrived.append(self.next_id)
            self.held.append(self.next_id)
            self.next_id += 1
        self._start(self.flow.received(items, grant))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(sorted(self.running)))
        self.running.remove(item)
        self.finished_count += 1
        self._start(self.flow.finished(self.sizes[item]))

    @rule()
    def drain(self) -> None:
        drained = self.flow.drain_hold()
        assert drained == list(self.held)
        self.held.clear()
        for item in drained:
            self.drained.append(item)
            self.finished_count += 1
            self._start(self.flow.finished(self.sizes[item], started=False))

    @invariant()
    def within_limits(self) -> None:
        stats = self.flow.statistics()
        assert stats.running_messages <= self.max_messages
        if stats.running_messages > 1:
            assert stats.running_bytes <= self.max_bytes
        assert stats.outstanding_messages >= 0
        assert stats.running_messages >= 0
        assert stats.running_bytes >= 0

    @invariant()
    def matches_the_model(self) -> None:
        stats = self.flow.statistics()
        assert stats.running_messages == len(self.running)
        assert stats.running_bytes == sum(self.sizes[i] for i in self.running)
        assert stats.on_hold == len(self.held)
        assert stats.outstanding_messages == len(self.arrived) - self.finished_count
        assert stats.outstanding_messages <= self.max_messages

    @invariant()
    def starts_in_arrival_order(self) -> None:
        not_drained = [i for i in self.arrived if i not in set(self.drained)]
        assert self.started == not_drained[: len(self.started)]

    @invariant()
    def never_stalls(self) -> None:
        # The head of the hold waits only because it does not fit beside what runs.
        if self.held:
            assert self.running
            head = self.sizes[self.held[0]]
            running_bytes = sum(self.sizes[i] for i in self.running)
            assert len(self.running) >= self.max_messages or running_bytes + head > self.max_bytes


def test_flow_controller_invariants_hold_under_random_events() -> None:
    """Under any reads, finishes and drains the limits hold, order is kept and nothing stalls."""
    run_state_machine_as_test(FlowMachine)


def _fill(flow: FlowController[str], count: int) -> list[str]:
    names = [f"m{n}" for n in range(count)]
    grant = flow.reserve(count)
    assert grant.messages == count
    flow.received([(name, 1) for name in names], grant)
    return names


def test_reading_pauses_at_full_load_and_resumes_below_80_percent() -> None:
    """Once the budget is full nothing more is granted as single handlers finish:
    not at 90 %, not at 80 %; below 80 % a read may take the free fifth at once."""
    flow = warmed(10)
    _fill(flow, 10)
    assert flow.statistics().paused
    flow.finished(1)
    assert flow.reserve(5) == Grant(0, 0)  # 90 %
    flow.finished(1)
    assert flow.reserve(5) == Grant(0, 0)  # 80 %: not below it yet
    flow.finished(1)
    grant = flow.reserve(5)
    assert grant.messages == 3  # 70 %: the free three at once
    assert not flow.statistics().paused
    flow.received([("x", 1), ("y", 1), ("z", 1)], grant)
    assert flow.statistics().paused  # full again
    assert flow.statistics().pauses == 2


def test_pauses_counts_each_pause_once() -> None:
    """``pauses`` counts a pause when reading stops at full load, not each read or
    handler while it lasts, and again only after reading resumed: what tells a
    subscriber that reached full load (and came back from it) from one that never
    did, however briefly each pause lasted."""
    flow = warmed(10)
    assert flow.statistics().pauses == 0
    _fill(flow, 10)
    flow.received([], flow.reserve(5))  # refused at full load: still the same pause
    flow.finished(1)
    flow.finished(1)  # 80 %: not resumed
    assert flow.reserve(2) == Grant(0, 0)
    assert flow.statistics().pauses == 1
    flow.finished(1)
    flow.received([("x", 1)], flow.reserve(1))  # resumed at 70 %, not full again
    assert flow.statistics().pauses == 1
    flow.received([("y", 1), ("z", 1)], flow.reserve(2))  # full again
    assert flow.statistics().pauses == 2


def test_below_full_load_reads_are_granted_as_before() -> None:
    """A subscriber that never fills its budget never pauses."""
    flow = warmed(10)
    _fill(flow, 3)
    _fill(flow, 3)
    assert not flow.statistics().paused
    flow.finished(1)
    assert flow.reserve(2).messages == 2


def test_bytes_at_full_load_pause_reading_too() -> None:
    """The byte bound pauses and resumes like the message bound."""
    flow = controller(max_messages=1000, max_bytes=100)
    first = flow.reserve(1)
    flow.received([("a", 50)], first)  # the estimate is now 50 bytes
    second = flow.reserve(10)
    assert second.messages == 1  # 50 free bytes: one at the estimate, and that is full
    flow.received([("b", 50)], second)
    assert flow.statistics().paused
    flow.finished(50)  # 50 % of the bytes
    assert flow.reserve(10).messages == 1


def test_a_read_that_brings_less_than_it_reserved_does_not_pause_reading() -> None:
    """Reserving the last of the budget is not full load: a read that brings fewer
    messages than it reserved leaves room, and the next read gets it (a paused
    reader with room left would wait for ever when nothing is acked)."""
    flow = warmed(30)
    _fill(flow, 21)
    grant = flow.reserve(9)
    assert grant.messages == 9
    flow.received([("late", 1)], grant)  # one of the nine came
    assert not flow.statistics().paused
    assert flow.reserve(9).messages == 8

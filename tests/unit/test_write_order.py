"""WriteOrder: when a partition's write may go to a cluster node while its slot
moves (``_backends/redis/_write_order.py``), with plain values."""

from __future__ import annotations

from streamsub._backends.redis._write_order import WriteOrder

SLOT, OTHER = b"ss:{t.0}", b"ss:{t.1}"
"""Two partitions' streams (the same slot or not: they do not wait for each other)."""
OLD, NEW, THIRD = "old:1", "new:2", "third:3"


def test_writes_to_the_node_of_the_earlier_ones_go_at_once() -> None:
    """Steady traffic: many writes of a slot in flight at one node; the next
    one to that node is not held, and another slot is not concerned."""
    order = WriteOrder()
    for _ in range(5):
        assert order.blocked(SLOT, OLD, None) is None
        order.sent(SLOT, OLD, False, None)
    assert order.blocked(SLOT, OLD, None) is None
    assert order.blocked(OTHER, NEW, None) is None


def test_a_new_write_to_the_new_master_waits_for_every_write_on_its_way_back() -> None:
    """Three writes in flight at the old master; the first comes back MOVED and
    is sent on to the new one (the map names it now). A new write to the new
    master waits while the second and third are unanswered at the old one, and
    while either waits to be sent again; it goes once both went on."""
    order = WriteOrder()
    first, second, third = (order.sent(SLOT, OLD, False, None) for _ in range(3))
    order.redirected(first)
    assert order.blocked(SLOT, NEW, first) is None  # the earliest waits for nobody
    order.sent(SLOT, NEW, False, first)
    assert order.blocked(SLOT, NEW, None) is not None
    order.redirected(second)
    assert order.blocked(SLOT, NEW, None) is not None
    order.sent(SLOT, NEW, False, second)
    assert order.blocked(SLOT, NEW, None) is not None  # the third is still out there
    order.redirected(third)
    order.sent(SLOT, NEW, False, third)
    assert order.blocked(SLOT, NEW, None) is None
    assert order.in_flight(SLOT) == [(NEW, None, False)] * 3


def test_a_write_sent_again_waits_for_the_earlier_ones_not_the_later_ones() -> None:
    """Writes a, b, c at the old master all come back MOVED; c's answer is
    handled first. c may not go before a and b went on; a may go before b and
    c (a later write never holds an earlier one back)."""
    order = WriteOrder()
    a, b, c = (order.sent(SLOT, OLD, False, None) for _ in range(3))
    order.redirected(c)
    assert order.blocked(SLOT, NEW, c) is not None  # a and b not answered yet
    order.redirected(b)
    assert order.blocked(SLOT, NEW, c) is not None
    assert order.blocked(SLOT, NEW, b) is not None  # a not answered yet
    order.redirected(a)
    assert order.blocked(SLOT, NEW, a) is None
    order.sent(SLOT, NEW, False, a)
    assert order.blocked(SLOT, NEW, c) is not None  # b waits to be sent again
    assert order.blocked(SLOT, NEW, b) is None
    order.sent(SLOT, NEW, False, b)
    assert order.blocked(SLOT, NEW, c) is None


def test_writes_sent_with_asking_do_not_hold_back_a_write_to_the_source() -> None:
    """While the slot migrates the map keeps naming its source: writes there
    come back ASK and follow the earlier ones to the importing node. Writes in
    flight at the importing node behind ASKING do not hold a new write to the
    source back; one waiting to be sent again (TRYAGAIN, ASK) does."""
    order = WriteOrder()
    first = order.sent(SLOT, OLD, False, None)
    order.redirected(first)
    order.sent(SLOT, NEW, True, first)
    assert order.blocked(SLOT, OLD, None) is None
    second = order.sent(SLOT, OLD, False, None)
    order.redirected(second)
    assert order.blocked(SLOT, OLD, None) is not None
    # The second's answer sends it behind ASKING after the first: it may go.
    assert order.blocked(SLOT, NEW, second) is None


def test_a_write_sent_with_asking_holds_back_writes_to_any_other_node() -> None:
    """A write in flight at the importing node behind ASKING may still come back
    (the migration given up: MOVED to the source; TRYAGAIN): only a write to
    the node that answered ASK (it follows through the same redirect) or to
    the importing node itself (behind it) may go meanwhile, not one to a third
    node. A TRYAGAIN try again at the importing node keeps where the ASK came
    from."""
    order = WriteOrder()
    first = order.sent(SLOT, OLD, False, None)
    order.redirected(first)
    order.sent(SLOT, NEW, True, first)
    assert order.in_flight(SLOT) == [(NEW, OLD, False)]
    assert order.blocked(SLOT, THIRD, None) is not None
    assert order.blocked(SLOT, NEW, None) is None
    order.redirected(first)  # TRYAGAIN: pending while its new try is made
    assert order.blocked(SLOT, OLD, None) is not None
    order.sent(SLOT, NEW, True, first)
    assert order.in_flight(SLOT) == [(NEW, OLD, False)]
    assert order.blocked(SLOT, OLD, None) is None
    order.redirected(first)  # MOVED from the importing node: not asked any more
    order.sent(SLOT, OLD, False, first)
    assert order.in_flight(SLOT) == [(OLD, None, False)]
    assert order.blocked(SLOT, NEW, None) is not None


def test_only_a_partitions_own_writes_hold_it_back() -> None:
    """Another partition's writes (another stream, maybe in the same slot)
    on their way back from the old master do not hold a partition's write."""
    order = WriteOrder()
    other = order.sent(OTHER, OLD, False, None)
    order.redirected(other)
    assert order.blocked(SLOT, NEW, None) is None
    assert order.blocked(OTHER, NEW, None) is not None


def test_the_event_is_set_when_an_earlier_write_changes() -> None:
    """The event a held write waits on is set when an earlier write is sent on
    or answered, even if it changed right after the decision to hold (no
    wake-up lost); a new event is made for the next hold."""
    order = WriteOrder()
    first = order.sent(SLOT, OLD, False, None)
    held = order.blocked(SLOT, NEW, None)
    assert held is not None
    assert not held.is_set()
    assert order.blocked(SLOT, NEW, None) is held  # one event per slot at a time
    order.redirected(first)
    assert not held.is_set()  # more blocked than before: nothing to wake for
    order.sent(SLOT, NEW, False, first)
    assert held.is_set()
    second = order.sent(SLOT, OLD, False, None)
    again = order.blocked(SLOT, NEW, None)
    assert again is not None
    assert again is not held
    order.done(SLOT, second)
    assert again.is_set()


def test_answered_writes_leave_and_the_slot_is_forgotten() -> None:
    """A write answered (stored, refused, lost) leaves the slot's order, in any
    order; once none is left the slot is not kept."""
    order = WriteOrder()
    flights = [order.sent(SLOT, OLD, False, None) for _ in range(4)]
    order.sent(OTHER, OLD, False, None)
    for flight in (flights[2], flights[0], flights[3], flights[1]):
        order.done(SLOT, flight)
    assert order.in_flight(SLOT) == []
    assert SLOT not in order._writes
    assert order.blocked(SLOT, NEW, None) is None


def test_a_write_is_never_held_back_by_itself() -> None:
    """A write sent before, redirected and then routed afresh (its new node
    refused it) is not held back by its own flight, only by earlier ones."""
    order = WriteOrder()
    first = order.sent(SLOT, OLD, False, None)
    order.redirected(first)
    assert order.blocked(SLOT, NEW, first) is None
    second = order.sent(SLOT, OLD, False, None)
    order.redirected(second)
    order.sent(SLOT, NEW, False, first)
    assert order.blocked(SLOT, NEW, second) is None

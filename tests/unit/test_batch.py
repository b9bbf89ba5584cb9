"""The publisher's batcher: when a batch closes, and how it groups messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsub._core.batch import Batch, Batcher
from streamsub._core.partition import partition_for_key
from streamsub._settings import BatchSettings


def batcher(
    max_messages: int = 1000, max_bytes: int = 2**20, max_latency: float = 0.5
) -> Batcher[str, str]:
    """A batcher whose tokens are message names."""
    settings = BatchSettings(
        max_messages=max_messages, max_bytes=max_bytes, max_latency=max_latency
    )
    return Batcher(settings)


def test_new_batcher_is_empty() -> None:
    """A new batcher holds nothing and has no deadline."""
    b = batcher()
    assert len(b) == 0
    assert b.deadline() is None
    assert b.take() == {}


def test_add_reports_full_at_max_messages() -> None:
    """add returns True exactly when the batch reaches max_messages."""
    b = batcher(max_messages=3)
    assert [b.add(0, b"m", 1, f"m{i}", now=0.0) for i in range(3)] == [False, False, True]
    assert len(b) == 3


def test_add_reports_full_at_max_bytes() -> None:
    """add returns True once the batch's bytes reach max_bytes."""
    b = batcher(max_bytes=100)
    assert b.add(0, b"m", 60, "a", now=0.0) is False
    assert b.add(0, b"m", 39, "b", now=0.0) is False
    assert b.add(0, b"m", 1, "c", now=0.0) is True


def test_add_of_one_message_over_max_bytes_reports_full() -> None:
    """A single message larger than max_bytes makes a batch of its own that closes at once."""
    b = batcher(max_bytes=100)
    assert b.add(0, b"m", 500, "big", now=0.0) is True


def test_would_overflow_is_false_for_an_empty_batch() -> None:
    """An empty batch takes any message, however large, rather than never sending it."""
    b = batcher(max_bytes=100)
    assert b.would_overflow(10_000) is False


def test_would_overflow_when_the_message_does_not_fit() -> None:
    """would_overflow is True only when the bytes would go past max_bytes."""
    b = batcher(max_bytes=100)
    b.add(0, b"m", 70, "a", now=0.0)
    assert b.would_overflow(30) is False
    assert b.would_overflow(31) is True


def test_would_overflow_does_not_change_the_batch() -> None:
    """Asking would_overflow leaves the batch as it was."""
    b = batcher(max_bytes=100)
    b.add(0, b"m", 70, "a", now=0.0)
    b.would_overflow(50)
    assert len(b) == 1
    assert b.take() == {0: [(b"m", "a")]}


def test_deadline_is_first_add_plus_max_latency() -> None:
    """The batch must be taken max_latency after its first message, whatever came after."""
    b = batcher(max_latency=0.25)
    b.add(0, b"m", 1, "a", now=10.0)
    b.add(0, b"m", 1, "b", now=10.2)
    assert b.deadline() == pytest.approx(10.25)


def test_deadline_restarts_with_the_next_batch() -> None:
    """After take, the deadline is None until the next add opens a new batch."""
    b = batcher(max_latency=0.25)
    b.add(0, b"m", 1, "a", now=10.0)
    b.take()
    assert b.deadline() is None
    b.add(0, b"m", 1, "b", now=20.0)
    assert b.deadline() == pytest.approx(20.25)


def test_take_groups_by_partition_in_publish_order() -> None:
    """take returns each partition's messages in the order they were added."""
    b = batcher()
    for partition, name in [(1, "a"), (0, "b"), (1, "c"), (2, "d"), (0, "e"), (1, "f")]:
        b.add(partition, name.encode(), 1, name, now=0.0)
    batch = b.take()
    assert batch == {
        1: [(b"a", "a"), (b"c", "c"), (b"f", "f")],
        0: [(b"b", "b"), (b"e", "e")],
        2: [(b"d", "d")],
    }


def test_take_keeps_the_payload_given_to_add() -> None:
    """The batch hands back the very payload object each message was added with."""
    b = batcher()
    payload = b"\x00\x02packed"
    b.add(3, payload, len(payload), "a", now=0.0)
    assert b.take()[3][0][0] is payload


def test_take_empties_the_batcher() -> None:
    """After take the batcher is empty and counts bytes and messages afresh."""
    b = batcher(max_messages=3, max_bytes=100)
    b.add(0, b"m", 90, "a", now=0.0)
    b.add(0, b"m", 5, "b", now=0.0)
    b.take()
    assert len(b) == 0
    assert b.take() == {}
    assert b.would_overflow(95) is False
    assert b.add(0, b"m", 90, "c", now=1.0) is False
    assert b.add(0, b"m", 1, "d", now=1.0) is False


def test_taken_batch_is_not_changed_by_later_adds() -> None:
    """A taken batch is the caller's: later adds go to a new batch."""
    b = batcher()
    b.add(0, b"m", 1, "a", now=0.0)
    taken = b.take()
    b.add(0, b"m", 1, "b", now=0.0)
    assert taken == {0: [(b"m", "a")]}


def test_an_empty_batch_is_never_due() -> None:
    """due is None for an empty batch, however many writes are in flight."""
    b = batcher()
    assert b.due(writes_in_flight=0) is None
    assert b.due(writes_in_flight=3) is None


def test_a_batch_is_due_at_once_while_the_writer_is_free() -> None:
    """With no write in flight the batch is already due: its due time is its
    first message's, not that plus max_latency."""
    b = batcher(max_latency=0.25)
    b.add(0, b"m", 1, "a", now=10.0)
    b.add(0, b"m", 1, "b", now=10.1)
    assert b.due(writes_in_flight=0) == pytest.approx(10.0)


def test_while_writes_are_in_flight_max_latency_is_the_ceiling() -> None:
    """With a write in flight the batch waits, at most max_latency after its first message."""
    b = batcher(max_latency=0.25)
    b.add(0, b"m", 1, "a", now=10.0)
    assert b.due(writes_in_flight=1) == pytest.approx(10.25)
    assert b.due(writes_in_flight=4) == b.deadline()


def test_free_below_sets_how_many_writes_leave_the_writer_free() -> None:
    """With free_below=2 one write in flight still leaves the writer free; two do not."""
    settings = BatchSettings(max_latency=0.5)
    b: Batcher[str, str] = Batcher(settings, free_below=2)
    b.add(0, b"m", 1, "a", now=3.0)
    assert b.due(writes_in_flight=1) == pytest.approx(3.0)
    assert b.due(writes_in_flight=2) == pytest.approx(3.5)


def crowd(concurrency: int, *, split_at: int = 8, max_latency: float = 0.5) -> Batcher[str, str]:
    """A batcher whose publisher has seen ``concurrency`` single publishes outstanding."""
    b: Batcher[str, str] = Batcher(BatchSettings(max_latency=max_latency), split_at=split_at)
    b.concurrency = concurrency
    return b


def lone(b: Batcher[str, str], name: str, now: float = 0.0) -> bool:
    """Add a single publish (its caller's only message)."""
    return b.add(0, b"m", 1, name, now, lone=True)


def test_in_a_crowd_a_batch_is_full_at_half_of_it() -> None:
    """500 callers at once: the batch closes at 250 (not at max_messages), so the
    other 250 form a second write while the first is stored."""
    b = crowd(500)
    assert [lone(b, f"m{i}") for i in range(250)] == [False] * 249 + [True]
    assert b.lone == 250
    b.take()
    assert b.lone == 0


def test_an_odd_crowd_closes_at_its_larger_half() -> None:
    """33 outstanding: full at 17 (twice 16 would not cover the crowd)."""
    b = crowd(33)
    assert [lone(b, f"m{i}") for i in range(17)] == [False] * 16 + [True]


def test_twice_split_at_is_a_crowd() -> None:
    """16 outstanding with split_at 8: full at 8, and 8 go beside one write."""
    b = crowd(16)
    assert [lone(b, f"m{i}") for i in range(8)] == [False] * 7 + [True]
    b.take()
    for i in range(8):
        lone(b, f"n{i}", now=4.0)
    assert b.due(writes_in_flight=1) == pytest.approx(4.0)


@pytest.mark.parametrize("concurrency", [0, 1, 10, 15])
def test_fewer_than_twice_split_at_outstanding_is_no_crowd(concurrency: int) -> None:
    """Below 2 * split_at outstanding, batches fill to max_messages as before, and
    one write in flight holds the batch until its latency ceiling."""
    b = crowd(concurrency)
    assert not any(lone(b, f"m{i}", now=2.0) for i in range(999))
    assert lone(b, "last", now=2.0)  # max_messages (1000)
    b.take()
    for i in range(20):
        lone(b, f"n{i}", now=3.0)
    assert b.due(writes_in_flight=1) == pytest.approx(3.5)


def test_messages_of_a_publish_many_are_one_caller_not_a_crowd() -> None:
    """A keyed publish_many adds its messages one by one, not as single
    publishes: beside a crowd of 500 they neither close the batch at 250 nor
    make it due beside a write in flight."""
    b = crowd(500)
    assert not any(b.add(i % 4, b"m", 1, f"m{i}", now=1.0) for i in range(999))
    assert b.lone == 0
    assert b.due(writes_in_flight=1) == pytest.approx(1.5)
    assert b.add(0, b"m", 1, "last", now=1.0)  # max_messages


def test_a_split_at_of_zero_never_splits() -> None:
    b = crowd(10_000, split_at=0)
    assert not any(lone(b, f"m{i}") for i in range(999))
    b.take()
    for i in range(500):
        lone(b, f"m{i}")
    assert b.due(writes_in_flight=1) == pytest.approx(0.5)


def test_in_a_crowd_the_other_half_goes_beside_one_write_in_flight() -> None:
    """The other half of a crowd of 100: with one write in flight, a batch of 50
    single publishes is due at once; with fewer (a few callers woken early must
    not go out as a fragment), or with two writes in flight, it waits for a
    write to come back (or its ceiling)."""
    b = crowd(100, max_latency=0.25)
    for i in range(49):
        lone(b, f"m{i}", now=10.0)
    b.add(0, b"m", 1, "of a publish_many", now=10.0)  # 50 messages, 49 single publishes
    assert b.due(writes_in_flight=1) == pytest.approx(10.25)
    lone(b, "m49", now=10.1)
    assert b.due(writes_in_flight=0) == pytest.approx(10.0)
    assert b.due(writes_in_flight=1) == pytest.approx(10.0)
    assert b.due(writes_in_flight=2) == pytest.approx(10.25)


def test_the_smaller_half_of_an_odd_crowd_goes_beside_the_larger() -> None:
    """33 outstanding: 17 close the first batch, and the other 16 (not full at
    17) go out beside it rather than wait for it to come back."""
    b = crowd(33, max_latency=0.25)
    for i in range(15):
        lone(b, f"m{i}", now=1.0)
    assert b.due(writes_in_flight=1) == pytest.approx(1.25)
    lone(b, "m15", now=1.0)
    assert b.due(writes_in_flight=1) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("settings", "closing"),
    [(BatchSettings(max_messages=100), 100), (BatchSettings(max_bytes=50), 50)],
)
def test_in_a_crowd_the_settings_limits_still_close_a_batch(
    settings: BatchSettings, closing: int
) -> None:
    """Half of 10,000 is past max_messages (and max_bytes): the batch closes at the
    settings' limit."""
    b: Batcher[str, str] = Batcher(settings, split_at=8)
    b.concurrency = 10_000
    assert [lone(b, f"m{i}") for i in range(closing)] == [False] * (closing - 1) + [True]


def test_split_at_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="split_at"):
        Batcher(BatchSettings(), split_at=-1)


def test_free_below_must_be_positive() -> None:
    """A batcher whose writer is never free would send only on its timer: refused."""
    with pytest.raises(ValueError, match="free_below"):
        Batcher(BatchSettings(), free_below=0)


def _one_at_a_time(b: Batcher[str, str], sizes: list[int]) -> int:
    """How many of ``sizes`` join ``b``'s open batch added one by one, as the
    publisher adds messages with ordering keys."""
    taken = 0
    for size in sizes:
        if b.would_overflow(size):
            break
        taken += 1
        if b.add(0, b"m", size, "m", now=0.0):
            break
    return taken


@given(
    max_messages=st.integers(1, 20),
    max_bytes=st.integers(1, 400),
    before=st.lists(st.integers(0, 150), max_size=10),
    sizes=st.lists(st.integers(0, 150), min_size=1, max_size=40),
    start=st.integers(0, 39),
)
def test_fitting_takes_what_adding_one_at_a_time_would(
    max_messages: int, max_bytes: int, before: list[int], sizes: list[int], start: int
) -> None:
    """fitting, for a run of messages without keys, counts exactly the messages
    that adding them one at a time would put in the open batch before it is
    full or the next would overflow it, from any open batch."""
    start = min(start, len(sizes) - 1)
    runs = batcher(max_messages=max_messages, max_bytes=max_bytes)
    single = batcher(max_messages=max_messages, max_bytes=max_bytes)
    for b in (runs, single):
        for size in before:
            if b.would_overflow(size):
                b.take()
            if b.add(0, b"m", size, "m", now=0.0):
                b.take()
    fitting = runs.fitting(sizes, start, sum(sizes[start:]))
    assert fitting == _one_at_a_time(single, sizes[start:])
    if len(runs) == 0:
        assert fitting >= 1, "an empty batch takes at least one message"


def test_add_of_a_run_counts_its_messages() -> None:
    """A run added as one entry counts as its messages and its bytes: the batch
    is full when they reach a limit, and take hands the run back as one entry."""
    b = batcher(max_messages=5, max_bytes=1000)
    assert b.add(2, b"abc", 30, "run", now=0.0, count=3) is False
    assert len(b) == 3
    assert b.add(2, b"de", 20, "run2", now=0.0, count=2) is True
    assert b.take() == {2: [(b"abc", "run"), (b"de", "run2")]}


# A max_latency no batch of the tests below may wait out, at a clock that never
# moves (every ``now`` is 0.0): a batch that closes does so because it is full
# or because the writer is free, never on its timer.
HOUR = 3600.0


def test_a_publish_many_larger_than_a_batch_never_waits_for_the_timer() -> None:
    """2,500 messages without ordering keys, added in runs as the publisher adds
    a publish_many's (as many as the batch takes, the batch taken when full):
    the first 1,000 and the next 1,000 each fill a batch, which closes on add at
    a clock that never moves; the tail of 500 waits only while those writes are
    in flight (the hour is a ceiling) and is due at once when they are back."""
    b = batcher(max_messages=1000, max_latency=HOUR)
    sizes = [10] * 2500
    start, rest = 0, sum(sizes)
    closed: list[Batch[str]] = []
    while start < len(sizes):
        taken = b.fitting(sizes, start, rest)
        if b.add(0, b"run", 10 * taken, f"run@{start}", now=0.0, count=taken):
            closed.append(b.take())
        start, rest = start + taken, rest - 10 * taken
    assert closed == [{0: [(b"run", "run@0")]}, {0: [(b"run", "run@1000")]}]
    assert len(b) == 500
    assert b.due(writes_in_flight=2) == HOUR
    assert b.due(writes_in_flight=1) == HOUR
    assert b.due(writes_in_flight=0) == 0.0


def test_keyed_messages_of_a_publish_many_never_wait_for_the_timer_and_keep_key_order() -> None:
    """2,500 messages over 50 ordering keys and 16 partitions, added one at a time
    as the publisher adds a publish_many's keyed messages: batches close when
    full (at 1,000 and 2,000 messages) at a clock that never moves, the tail of
    500 is due at once while the writer is free, and the batches, in the order
    taken, hold each key's messages in publish order."""
    b: Batcher[tuple[str, int], str] = Batcher(BatchSettings(max_messages=1000, max_latency=HOUR))
    taken: list[Batch[tuple[str, int]]] = []
    closed_at: list[int] = []
    for index in range(2500):
        key = f"key-{index % 50}"
        assert not b.would_overflow(10)
        if b.add(partition_for_key(key, 16), b"m", 10, (key, index), now=0.0):
            taken.append(b.take())
            closed_at.append(index + 1)
    assert closed_at == [1000, 2000]
    assert len(b) == 500
    assert b.due(writes_in_flight=0) == 0.0
    taken.append(b.take())
    order: dict[str, list[int]] = {}
    for batch in taken:
        for partition, entries in batch.items():
            for _, (key, index) in entries:
                assert partition == partition_for_key(key, 16)
                order.setdefault(key, []).append(index)
    assert len(order) == 50
    assert all(indices == list(range(int(key[4:]), 2500, 50)) for key, indices in order.items())


def _lane_entry(datas: list[bytes], names: list[str]) -> tuple[bytes, str]:
    """A lane as one entry, for the tests: its data and its names, joined."""
    return b"|".join(datas), "lane:" + ",".join(names)


def _names(batch: Batch[str]) -> dict[int, list[tuple[bytes, str]]]:
    """Each partition's messages in order, a lane's one by one, as (data, name)."""
    names: dict[int, list[tuple[bytes, str]]] = {}
    for partition, entries in batch.items():
        for data, token in entries:
            if token.startswith("lane:"):
                pairs = zip(data.split(b"|"), token[5:].split(","), strict=True)
                names.setdefault(partition, []).extend(pairs)
            else:
                names.setdefault(partition, []).append((data, token))
    return names


@given(
    concurrency=st.integers(0, 600),
    max_messages=st.integers(1, 300),
    max_bytes=st.integers(1, 4000),
    shapes=st.lists(
        st.tuples(
            st.sampled_from(["lane", "lone", "keyed", "run"]),
            st.integers(0, 3),
            st.integers(0, 120),
        ),
        min_size=1,
        max_size=400,
    ),
)
def test_the_lane_batches_and_orders_as_single_publishes_added_one_by_one(
    concurrency: int, max_messages: int, max_bytes: int, shapes: list[tuple[str, int, int]]
) -> None:
    """Single publishes of data alone added to the lane (``add_data``) among
    other single publishes, keyed messages and runs of three, over four
    partitions, close batches at the same messages, count the same messages,
    bytes and single publishes, and are due at the same times, as the same
    messages all added as entries (``add``); and each batch taken holds each
    partition's messages in the order they were added, each with its data."""
    settings = BatchSettings(max_messages=max_messages, max_bytes=max_bytes, max_latency=1.0)
    lanes: Batcher[str, str] = Batcher(settings, split_at=8, lane=_lane_entry)
    plain: Batcher[str, str] = Batcher(settings, split_at=8)
    lanes.concurrency = plain.concurrency = concurrency
    for index, (kind, partition, size) in enumerate(shapes):
        name, now = f"m{index}", float(index)
        data = name.encode().ljust(size, b".")
        count = 3 if kind == "run" else 1
        assert lanes.would_overflow(len(data)) == plain.would_overflow(len(data))
        if lanes.would_overflow(len(data)):
            assert _names(lanes.take()) == _names(plain.take())
        if kind == "lane":
            full = lanes.add_data(partition, data, name, now)
        else:
            lone = kind == "lone"
            full = lanes.add(partition, data, len(data), name, now, count, lone=lone)
        lone = kind in ("lane", "lone")
        assert full == plain.add(partition, data, len(data), name, now, count, lone=lone)
        assert (len(lanes), lanes.size, lanes.lone) == (len(plain), plain.size, plain.lone)
        assert sorted(lanes.partitions) == sorted(plain.partitions)
        assert lanes.deadline() == plain.deadline()
        assert lanes.due(1) == plain.due(1)
        if full:
            assert _names(lanes.take()) == _names(plain.take())
    assert _names(lanes.take()) == _names(plain.take())


def test_a_lane_alone_opens_and_times_its_batch() -> None:
    """A batch of lane publishes alone is due as any batch is: at once while the
    writer is free, else at its first message's time plus max_latency; taken,
    it is one entry of its partition."""
    b: Batcher[str, str] = Batcher(BatchSettings(max_latency=0.5), lane=_lane_entry)
    assert b.add_data(5, b"a", "a", 3.0) is False
    assert b.add_data(5, b"bc", "b", 4.0) is False
    assert (len(b), b.size, b.lone, list(b.partitions)) == (2, 3, 2, [5])
    assert b.due(writes_in_flight=0) == 3.0
    assert b.due(writes_in_flight=1) == 3.5
    assert b.take() == {5: [(b"a|bc", "lane:a,b")]}
    assert (len(b), b.size, b.lone, b.deadline()) == (0, 0, 0, None)


def test_add_data_without_a_lane_entry_is_refused() -> None:
    """A batcher made without the lane's entry refuses a lane publish at once,
    holding nothing of it."""
    b = batcher()
    with pytest.raises(TypeError, match="lane"):
        b.add_data(0, b"a", "a", 0.0)
    assert (len(b), b.size, b.lone, b.take()) == (0, 0, 0, {})

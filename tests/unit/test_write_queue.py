"""WriteQueue: the publisher's waiting writes, one line per node, each
partition's writes in queue order."""

from __future__ import annotations

import random

from streamsub._core.write_queue import WriteQueue

LIMIT = 4


def queue(*writes: tuple[str | None, tuple[int, ...], str]) -> WriteQueue[str]:
    q: WriteQueue[str] = WriteQueue()
    for node, partitions, name in writes:
        q.add(node, partitions, name)
    return q


def test_one_line_starts_in_order_up_to_the_limit() -> None:
    """On one server (node None) writes start in queue order, at most LIMIT in
    flight counting those already out."""
    q = queue(*[(None, (n % 3,), f"w{n}") for n in range(6)])
    assert q.take({None: 1}, LIMIT) == ["w0", "w1", "w2"]
    assert len(q) == 3
    assert q.take({None: 4}, LIMIT) == []
    assert q.take({None: 2}, LIMIT) == ["w3", "w4"]
    assert q.take({}, LIMIT) == ["w5"]
    assert len(q) == 0


def test_a_full_node_holds_back_only_its_own_line() -> None:
    """Node A has four writes out: its writes wait, B's and C's start, each
    line in order, however many of A's are queued ahead of them."""
    writes = []
    for n in range(50):
        writes.append(("A", (0,), f"a{n}"))
        writes.append(("B", (1,), f"b{n}"))
    writes.append(("C", (2, 5), "c0"))
    q = queue(*writes)
    assert q.take({"A": 4, "B": 2}, LIMIT) == ["b0", "b1", "c0"]
    assert q.take({"A": 4, "B": 4}, LIMIT) == []
    assert q.take({"A": 3, "B": 4}, LIMIT) == ["a0"]
    assert len(q) == 100 - 3


def test_a_partition_that_moved_keeps_its_writes_in_order() -> None:
    """Partition 0 went to node A, then (its slot moved) to node B: B's write
    to it waits behind A's, though B has room; B's write of another partition
    does not. Once A has room both start, A's first."""
    q = queue(("A", (0, 3), "a-first"), ("B", (1,), "b-other"), ("B", (0,), "b-moved"))
    assert q.take({"A": 4}, LIMIT) == ["b-other"]
    assert q.take({"A": 4}, LIMIT) == []
    assert q.take({"A": 3}, LIMIT) == ["a-first", "b-moved"]


def test_a_write_behind_a_waiting_one_goes_on_when_it_shares_no_partition() -> None:
    """B's first write waits behind A's (a moved partition); B's next write,
    of another partition, starts; B's write of the moved partition again
    waits behind it."""
    q = queue(
        ("A", (0,), "a0"), ("B", (0,), "b-moved"), ("B", (1,), "b-other"), ("B", (0, 1), "b-both")
    )
    assert q.take({"A": 4}, LIMIT) == ["b-other"]
    assert q.take({"A": 4}, LIMIT) == []
    assert q.take({}, LIMIT) == ["a0", "b-moved", "b-both"]


def test_held_partitions_wait_and_the_others_go() -> None:
    """A partition held by a failure waits, with the later writes to it; the
    other partitions' writes start, on its node too."""
    q = queue(("A", (0,), "a0"), ("A", (3,), "a1"), ("B", (1,), "b0"), ("A", (0, 3), "a2"))
    assert q.take({}, LIMIT, held={0}) == ["a1", "b0"]
    assert q.take({}, LIMIT, held={0}) == []
    assert q.take({}, LIMIT) == ["a0", "a2"]


def test_on_one_server_a_held_partition_holds_back_only_itself() -> None:
    """One line (node None): writes to partition 0 wait while it is held; a
    write to partition 1 queued behind them starts."""
    q = queue((None, (0,), "p0"), (None, (0,), "p0-later"), (None, (1,), "p1"))
    assert q.take({None: 1}, LIMIT, held={0}) == ["p1"]
    assert q.take({None: 2}, LIMIT) == ["p0", "p0-later"]


def test_rebuild_keeps_queue_order_drops_and_shrinks() -> None:
    """rebuild replaces each write by what keep makes of it, in queue order:
    dropped ones go, a write that lost a partition no longer waits for it."""
    q = queue(("A", (0, 1), "a0"), ("B", (2,), "b0"), ("A", (1,), "a1"), ("B", (0,), "b1"))

    def keep(item: str) -> tuple[str | None, tuple[int, ...], str] | None:
        if item == "b0":
            return None
        if item == "a0":
            return "A", (1,), "a0'"  # its partition 0 messages were dropped
        return ("A" if item.startswith("a") else "B"), (1,) if item == "a1" else (0,), item

    q.rebuild(keep)
    assert q.items() == ["a0'", "a1", "b1"]
    assert len(q) == 3
    # b1 (partition 0) no longer waits behind a0', which lost partition 0.
    assert q.take({"A": 4}, LIMIT) == ["b1"]
    assert q.take({}, LIMIT) == ["a0'", "a1"]


def test_random_queues_keep_every_rule() -> None:
    """500 seeded random runs of add, take (random writes in flight, random
    held partitions) and rebuild (dropping writes, cutting partitions), over
    three nodes and five partitions: whatever take hands out is in queue
    order, within each node's room, of no held partition, and behind no
    waiting write to one of its partitions; the count and items always match
    a plain model; and with nothing in flight or held, everything is taken."""
    for seed in range(500):
        rng = random.Random(seed)
        q: WriteQueue[tuple[int, str | None, tuple[int, ...]]] = WriteQueue()
        model: list[tuple[int, str | None, tuple[int, ...]]] = []
        serial = 0
        for _ in range(60):
            op = rng.random()
            if op < 0.5:
                serial += 1
                node = rng.choice(["A", "B", None])
                partitions = tuple(rng.sample(range(5), rng.randint(1, 3)))
                q.add(node, partitions, (serial, node, partitions))
                model.append((serial, node, partitions))
            elif op < 0.85:
                busy = {n: rng.randint(0, LIMIT) for n in ("A", "B", None)}
                held = set(rng.sample(range(5), rng.randint(0, 2)))
                got = q.take(busy, LIMIT, held)
                assert got == sorted(got), seed
                for node in ("A", "B", None):
                    assert busy[node] + sum(1 for g in got if g[1] == node) <= LIMIT, seed
                left = [m for m in model if m not in got]
                for number, _, partitions in got:
                    assert not held.intersection(partitions), seed
                    waiting_before = [m for m in left if m[0] < number]
                    assert all(not set(partitions) & set(m[2]) for m in waiting_before), seed
                model = left
            else:

                def keep(
                    item: tuple[int, str | None, tuple[int, ...]], rng: random.Random = rng
                ) -> (
                    tuple[str | None, tuple[int, ...], tuple[int, str | None, tuple[int, ...]]]
                    | None
                ):
                    number, node, partitions = item
                    if rng.random() < 0.2:
                        return None
                    cut = tuple(p for p in partitions if rng.random() < 0.7) or partitions[:1]
                    return node, cut, (number, node, cut)

                q.rebuild(keep)
                model = q.items()
            assert len(q) == len(model)
            assert q.items() == sorted(model)
        assert len(q.take({}, 10**9)) == len(model), seed

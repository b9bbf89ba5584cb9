"""Per-key order (KeyOrder), with plain values: which message of a key may run."""

from __future__ import annotations

import random

from streamsub._core.ordering import KeyOrder, position


def test_position_sorts_entry_ids_in_stream_order() -> None:
    ids = ["1700000000000-10", "1700000000000-9", "1699999999999-500", "1700000000001-0"]
    assert sorted(ids, key=position) == [ids[2], ids[1], ids[0], ids[3]]


def test_one_message_of_a_key_runs_at_a_time_in_stream_order() -> None:
    order: KeyOrder[str] = KeyOrder()
    assert order.offer("k", (1, 0), "m1")
    # Later ones wait, whatever order they arrive in.
    assert not order.offer("k", (3, 0), "m3")
    assert not order.offer("k", (2, 0), "m2")
    assert order.waiting == 2
    assert order.done("k", (1, 0), settled=True) == ["m2"]
    assert order.done("k", (2, 0), settled=True) == ["m3"]
    assert order.done("k", (3, 0), settled=True) == []
    assert order.waiting == 0
    assert order.offer("k", (4, 0), "m4")  # the key is free again


def test_keys_are_independent() -> None:
    order: KeyOrder[str] = KeyOrder()
    assert order.offer("a", (1, 0), "a1")
    assert not order.offer("a", (2, 0), "a2")
    assert order.offer("b", (3, 0), "b1")  # a's running message holds up only a
    assert order.done("b", (3, 0), settled=True) == []
    assert order.done("a", (1, 0), settled=True) == ["a2"]


def test_a_nack_blocks_the_key_until_that_entry_is_back_and_settled() -> None:
    order: KeyOrder[str] = KeyOrder()
    assert order.offer("k", (1, 0), "first")
    assert not order.offer("k", (2, 0), "second")
    assert order.done("k", (1, 0), settled=False) == []  # nacked: nothing later runs
    assert order.blocked() == {"k": (1, 0)}
    assert not order.offer("k", (3, 0), "third")  # new arrivals wait too
    assert order.offer("k", (1, 0), "first again")  # the redelivery runs at once
    assert order.done("k", (1, 0), settled=False) == []  # nacked again
    assert order.offer("k", (1, 0), "first, third time")
    assert order.done("k", (1, 0), settled=True) == ["second"]
    assert order.done("k", (2, 0), settled=True) == ["third"]
    assert order.blocked() == {}


def test_a_blocked_key_moves_on_when_its_entry_is_settled_elsewhere() -> None:
    order: KeyOrder[str] = KeyOrder()
    order.offer("k", (1, 0), "first")
    order.offer("k", (2, 0), "second")
    order.done("k", (1, 0), settled=False)
    assert order.unblock("k", (9, 9)) == []  # not the entry it waits for
    assert order.unblock("k", (1, 0)) == ["second"]


def test_the_awaited_entry_runs_even_behind_an_earlier_waiting_one() -> None:
    """An earlier entry of the key arriving while the key is blocked (a crashed
    peer's message) must not keep the awaited entry from running."""
    order: KeyOrder[str] = KeyOrder()
    order.offer("k", (5, 0), "five")
    order.done("k", (5, 0), settled=False)
    assert not order.offer("k", (3, 0), "three")
    assert order.offer("k", (5, 0), "five again")
    assert order.done("k", (5, 0), settled=True) == ["three"]


def test_a_message_given_back_before_it_ran_blocks_its_key() -> None:
    order: KeyOrder[str] = KeyOrder()
    order.offer("k", (1, 0), "first")  # next to run, not started
    order.offer("k", (2, 0), "second")
    order.discard("k", (1, 0))
    assert order.blocked() == {"k": (1, 0)}
    order.discard("k", (2, 0))
    assert order.waiting == 0
    assert order.offer("k", (1, 0), "first again")


def test_drain_gives_every_waiting_message() -> None:
    order: KeyOrder[int] = KeyOrder()
    for key in "abc":
        for n in range(5):
            order.offer(key, (n, 0), n)
    assert sorted(order.drain()) == sorted([1, 2, 3, 4] * 3)
    assert order.waiting == 0


def test_many_keys_random_arrival_and_nacks_keep_each_key_in_order() -> None:
    """200 keys, 20 messages each, arriving shuffled; handlers finish in random
    order and nack one in five: every key's messages run one at a time, each
    first run in stream order, each nacked one again before anything later."""
    rng = random.Random(7)
    order: KeyOrder[tuple[str, int]] = KeyOrder()
    arrivals = [(f"k{k}", n) for k in range(200) for n in range(20)]
    rng.shuffle(arrivals)
    # Deliver in stream order per key (a partition's reads are in order), keys mixed.
    arrivals.sort(key=lambda item: item[1])
    running: list[tuple[str, int]] = []
    first_runs: dict[str, list[int]] = {}
    pending_redelivery: list[tuple[str, int]] = []
    for key, n in arrivals:
        if order.offer(key, (n, 0), (key, n)):
            running.append((key, n))
    while running or pending_redelivery:
        if pending_redelivery and (not running or rng.random() < 0.3):
            key, n = pending_redelivery.pop(rng.randrange(len(pending_redelivery)))
            assert order.offer(key, (n, 0), (key, n)), "the awaited entry runs at once"
            running.append((key, n))
            continue
        key, n = running.pop(rng.randrange(len(running)))
        assert sum(1 for k, _ in running if k == key) == 0, "two of one key at once"
        runs = first_runs.setdefault(key, [])
        if not runs or runs[-1] != n:
            runs.append(n)
        if rng.random() < 0.2:
            assert order.done(key, (n, 0), settled=False) == []
            pending_redelivery.append((key, n))
        else:
            running.extend(order.done(key, (n, 0), settled=True))
    assert first_runs == {f"k{k}": list(range(20)) for k in range(200)}
    assert order.waiting == 0


def test_a_redelivery_of_the_running_message_takes_its_turn() -> None:
    """A seek delivers the running message again while its handler runs: the old
    delivery gives the key up (blocked on that entry), so the new one runs and
    the key's later messages follow it."""
    order: KeyOrder[str] = KeyOrder()
    assert order.offer("k", (1, 0), "first")
    assert not order.offer("k", (2, 0), "second")
    order.done("k", (1, 0), settled=False)  # the replaced delivery
    assert order.offer("k", (1, 0), "first again")
    assert order.done("k", (1, 0), settled=True) == ["second"]

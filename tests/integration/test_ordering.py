"""Ordered subscriptions in one subscriber: a key's messages go to handlers one at
a time, in publish order; a nack holds the key's later messages back; keys are
independent. Against a real redis-server, with many keys over several partitions."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamsub
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisServer
from tests._layout import stream_key
from tests._wait import until

KEYS = 40
PER_KEY = 50


class KeyWatch:
    """Records, per key, the order of first handlings and how many ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: collections.Counter[str] = collections.Counter()
        self.most_at_once_per_key = 0
        self.running = 0
        self.most_running = 0
        self.first: dict[str, list[int]] = collections.defaultdict(list)
        self.seen: set[tuple[str, int]] = set()

    def enter(self, message: streamsub.Message) -> None:
        key = message.ordering_key or ""
        with self.lock:
            self.active[key] += 1
            self.most_at_once_per_key = max(self.most_at_once_per_key, self.active[key])
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            index = _index(message)
            if (key, index) not in self.seen:
                self.seen.add((key, index))
                self.first[key].append(index)

    def leave(self, message: streamsub.Message) -> None:
        with self.lock:
            self.active[message.ordering_key or ""] -= 1
            self.running -= 1

    @property
    def handled(self) -> int:
        return len(self.seen)


def _handlers(watch: KeyWatch) -> dict[str, Callable[[streamsub.Message], Any]]:
    rng = random.Random(3)

    async def with_timeout(message: streamsub.Message) -> None:
        watch.enter(message)
        try:
            async with asyncio.timeout(5):
                await asyncio.sleep(rng.random() * 0.004)
        finally:
            watch.leave(message)

    def plain(message: streamsub.Message) -> None:
        watch.enter(message)
        time.sleep(rng.random() * 0.004)
        watch.leave(message)

    async def work(message: streamsub.Message) -> None:
        watch.enter(message)
        await asyncio.sleep(rng.random() * 0.004)
        watch.leave(message)

    return {"asyncio.timeout": with_timeout, "plain def": plain, "lambda": lambda m: work(m)}


def _index(message: streamsub.Message) -> int:
    """The n of a message published as ``key:n``."""
    return int(message.data.split(b":")[1])


async def _ordered(
    client: streamsub.Client, *, partitions: int, backoff: float | None = None, **settings: Any
) -> None:
    """Topic "orders" and its ordered subscription "billing" (with a fixed nack
    backoff of ``backoff`` seconds, if given, and other ``settings``)."""
    await client.create_topic("orders", partitions=partitions)
    if backoff is not None:
        settings["retry_policy"] = streamsub.RetryPolicy(
            minimum_backoff=backoff, maximum_backoff=backoff
        )
    await client.create_subscription(
        "billing", topic="orders", enable_message_ordering=True, **settings
    )


async def _publish_keys(
    client: streamsub.Client, topic: str, keys: list[str], count: int, start: int = 0
) -> None:
    """Messages ``key:start`` .. ``key:start+count-1`` of every key."""
    # Keys interleaved, in batches, so that a read brings many keys and many of each.
    messages = [
        streamsub.OutgoingMessage(data=f"{key}:{n}".encode(), ordering_key=key)
        for n in range(start, start + count)
        for key in keys
    ]
    for start in range(0, len(messages), 500):
        await client.publish_many(topic, messages[start : start + 500])


@pytest.mark.parametrize("kind", ["asyncio.timeout", "plain def", "lambda"])
async def test_each_key_runs_one_at_a_time_in_publish_order(
    client: streamsub.Client, kind: str
) -> None:
    """2,000 messages over 40 keys and 4 partitions, read in batches: never two
    handlers of one key at once, each key's messages first handled in publish
    order, and many keys' handlers running at the same time."""
    await _ordered(client, partitions=4)
    watch = KeyWatch()
    keys = [f"customer-{k}" for k in range(KEYS)]
    async with client.subscribe("billing", _handlers(watch)[kind]):
        await _publish_keys(client, "orders", keys, PER_KEY)
        await until(lambda: watch.handled == KEYS * PER_KEY, 60, "every message")
    assert watch.most_at_once_per_key == 1
    assert watch.first == {key: list(range(PER_KEY)) for key in keys}
    assert watch.most_running > 4, "keys did not run side by side"


async def test_unordered_subscription_runs_one_key_side_by_side(
    client: streamsub.Client,
) -> None:
    """Without enable_message_ordering a key's messages run concurrently (most
    throughput): the ordered path is not taken."""
    await client.create_topic("orders", partitions=2)
    await client.create_subscription("billing", topic="orders")
    watch = KeyWatch()
    async with client.subscribe("billing", _handlers(watch)["asyncio.timeout"]):
        await _publish_keys(client, "orders", ["hot"], 300)
        await until(lambda: watch.handled == 300, 30, "every message")
    assert watch.most_at_once_per_key > 1


async def test_a_nacked_message_holds_back_its_key_while_other_keys_flow(
    client: streamsub.Client,
) -> None:
    """Message 5 of key "slow" is nacked with a 4 s backoff: nothing later of that
    key is handled until it is handled again (attempt 2), while other keys'
    messages published after the nack are all handled before it comes back."""
    await _ordered(client, partitions=4, backoff=4.0)
    handled: list[tuple[str, int, int, float]] = []  # key, index, attempt, when
    nacked = asyncio.Event()

    async def handler(message: streamsub.Message) -> None:
        key = message.ordering_key or ""
        index = _index(message)
        handled.append((key, index, message.delivery_attempt, time.monotonic()))
        if key == "slow" and index == 5 and message.delivery_attempt == 1:
            nacked.set()
            raise RuntimeError("not yet")

    others = [f"other-{k}" for k in range(10)]
    async with client.subscribe("billing", handler):
        await _publish_keys(client, "orders", ["slow"], 20)
        await asyncio.wait_for(nacked.wait(), 30)
        nack_time = time.monotonic()
        await _publish_keys(client, "orders", others, 20)
        await until(
            lambda: sum(1 for key, *_ in handled if key == "slow") == 21, 60, "every slow message"
        )
        await until(
            lambda: sum(1 for key, *_ in handled if key != "slow") == 200, 30, "the other keys"
        )
    slow = [(index, attempt) for key, index, attempt, _ in handled if key == "slow"]
    assert slow == [(n, 1) for n in range(6)] + [(5, 2)] + [(n, 1) for n in range(6, 20)]
    again = next(
        when for key, index, attempt, when in handled if (key, index, attempt) == ("slow", 5, 2)
    )
    assert again - nack_time >= 3.5, "the backoff was not kept"
    last_other = max(when for key, _, _, when in handled if key != "slow")
    assert last_other < again, "other keys waited for the slow key"


@pytest.mark.parametrize("fate", ["acked elsewhere", "handled by another subscriber"])
async def test_a_blocked_key_moves_on_when_its_nacked_message_is_settled_elsewhere(
    client: streamsub.Client, redis_client: redis.Redis, fate: str
) -> None:
    """A nacked message blocks its key here until it comes back. If it is
    acknowledged elsewhere instead, this subscriber sees so on its next sweep and
    hands the key's later messages out rather than holding them until their
    leases run out; while another subscriber holds it (handling it), the key
    waits, so that no later message runs beside it."""
    await _ordered(client, partitions=2, ack_deadline=2.0, backoff=600.0)
    handled: list[tuple[str, int]] = []
    nacked: list[str] = []

    async def handler(message: streamsub.Message) -> None:
        key = message.ordering_key or ""
        index = _index(message)
        handled.append((key, index))
        if index == 2 and message.delivery_attempt == 1:
            nacked.append(message.message_id)
            raise RuntimeError("later")

    keys = ["a", "b", "c"]
    async with client.subscribe("billing", handler):
        await _publish_keys(client, "orders", keys, 10)
        await until(lambda: len(nacked) == 3 and len(handled) == 9, 30, "the nacks")
        await asyncio.sleep(1.0)  # a sweep or two: nothing later of a blocked key runs
        assert sorted(handled) == [(key, n) for key in keys for n in range(3)]
        where = []
        for message_id in nacked:
            partition, entry_id = message_id.split("-", 1)
            where.append((stream_key(redis_client, "orders", partition), entry_id))
        if fate == "handled by another subscriber":
            for stream, entry_id in where:
                redis_client.xclaim(stream, "billing", "another-subscriber", 0, [entry_id])
            await asyncio.sleep(1.5)  # three sweeps: the keys wait while it is handled
            assert len(handled) == 9
        for stream, entry_id in where:
            redis_client.xack(stream, "billing", entry_id)
        await until(lambda: len(handled) == 30, 15, "the blocked keys to move on")
    for key in keys:
        assert [n for k, n in handled if k == key] == list(range(10))


async def test_subscribers_of_an_ordered_subscription_share_its_partitions(
    client: streamsub.Client, server: RedisServer
) -> None:
    """Three subscribers (three clients) join an ordered subscription of 8
    partitions one after another, then one leaves: at every step each partition is
    owned by exactly one of them, each owns its share, and over 4,000 messages of
    40 keys every key's messages are first handled in publish order, never two of
    one key at once, with every subscriber given work."""
    clients = [client, streamsub.connect(server.url), streamsub.connect(server.url)]
    try:
        admin = client
        await admin.create_topic("orders", partitions=8)
        await admin.create_subscription("billing", topic="orders", enable_message_ordering=True)
        watch = KeyWatch()
        by: collections.Counter[str] = collections.Counter()

        def handler(name: str) -> Callable[[streamsub.Message], Any]:
            async def handle(message: streamsub.Message) -> None:
                watch.enter(message)
                by[name] += 1
                await asyncio.sleep(0.001)
                watch.leave(message)

            return handle

        keys = [f"customer-{k}" for k in range(KEYS)]
        subscribers = [
            clients[i].subscribe("billing", handler(f"s{i}"), consumer=f"s{i}") for i in range(3)
        ]

        def owned() -> list[set[int]]:
            return [set(s.statistics().partitions) for s in running]

        def shared_by(count: int) -> bool:
            sets = owned()
            union = set().union(*sets)
            return (
                len(sets) == count
                and union == set(range(8))
                and sum(map(len, sets)) == 8
                and all(len(s) == 8 // count or len(s) == 8 // count + 1 for s in sets)
            )

        running: list[streamsub.Subscriber] = []
        for step, subscriber in enumerate(subscribers, start=1):
            await subscriber.__aenter__()
            running.append(subscriber)
            await _publish_keys(admin, "orders", keys, 10, start=(step - 1) * 10)
            await until(lambda n=step: shared_by(n), 30, f"{step} subscribers to share")
        await running.pop(0).__aexit__(None, None, None)
        await _publish_keys(admin, "orders", keys, 10, start=30)
        await until(lambda: shared_by(2), 30, "the two left to share")
        await until(lambda: watch.handled == KEYS * 40, 60, "every message")
        for subscriber in running:
            await subscriber.__aexit__(None, None, None)
    finally:
        for other in clients[1:]:
            await other.aclose()
    assert watch.most_at_once_per_key == 1
    wrong = {k: v for k, v in watch.first.items() if v != list(range(40))}
    assert not wrong, str(wrong)
    assert all(by[f"s{i}"] > 0 for i in range(3)), by


async def test_stats_show_who_owns_each_partition(client: streamsub.Client) -> None:
    """statistics() and subscription_stats() show the partitions a subscriber of an
    ordered subscription owns, with their fencing tokens; leaving hands them
    over at once (no owner left, no lease to wait for)."""
    await _ordered(client, partitions=4)
    async with client.subscribe("billing", lambda m: None, consumer="only") as subscriber:
        await until(lambda: len(subscriber.statistics().partitions) == 4, 15, "ownership")
        stats = await client.subscription_stats("billing")
        assert {p: owner for p, (owner, _) in stats.owners.items()} == dict.fromkeys(
            range(4), "only"
        )
        assert {p: token for p, (_, token) in stats.owners.items()} == subscriber.statistics().owned
        assert all(token >= 1 for token in subscriber.statistics().owned.values())
    assert (await client.subscription_stats("billing")).owners == {}


async def test_a_new_owner_takes_a_nacked_message_before_the_later_ones_of_its_key(
    client: streamsub.Client,
) -> None:
    """A subscriber nacks message 3 of a key with a 600 s backoff and stops; the
    subscriber that gets the partition takes message 3 over at once (delivery 2),
    before 4..9, rather than letting them overtake it while it waits out its
    backoff."""
    await _ordered(client, partitions=2, backoff=600.0)
    first: list[tuple[int, int]] = []
    second: list[tuple[int, int]] = []

    def recorder(seen: list[tuple[int, int]]) -> Callable[[streamsub.Message], None]:
        def handle(message: streamsub.Message) -> None:
            index = _index(message)
            seen.append((index, message.delivery_attempt))
            if index == 3 and message.delivery_attempt == 1:
                raise RuntimeError("later")

        return handle

    async with client.subscribe("billing", recorder(first), consumer="a"):
        await _publish_keys(client, "orders", ["k"], 10)
        await until(lambda: len(first) == 4, 30, "the nack")
        await asyncio.sleep(0.5)
    assert first == [(0, 1), (1, 1), (2, 1), (3, 1)]
    async with client.subscribe("billing", recorder(second), consumer="b"):
        await until(lambda: len(second) == 7, 30, "the rest of the key")
    assert second == [(3, 2)] + [(n, 1) for n in range(4, 10)]


async def test_a_nack_comes_back_when_its_keys_later_messages_fill_the_budget(
    client: streamsub.Client,
) -> None:
    """max_messages=10 and one hot key of 40: its first message is nacked while its
    later ones fill the whole budget, waiting for it. It still comes back (the
    reclaimer may bring one message per blocked key past the budget), and the key
    goes on in order."""
    await _ordered(client, partitions=2, backoff=0.5)
    seen: list[tuple[int, int]] = []

    async def handler(message: streamsub.Message) -> None:
        index = _index(message)
        seen.append((index, message.delivery_attempt))
        if index == 0 and message.delivery_attempt == 1:
            await asyncio.sleep(0.5)  # the reader fills the budget meanwhile
            raise RuntimeError("not yet")

    flow = streamsub.FlowControl(max_messages=10)
    async with client.subscribe("billing", handler, flow_control=flow) as subscriber:
        await _publish_keys(client, "orders", ["hot"], 40)
        await until(lambda: len(seen) == 41, 30, "every message of the hot key")
        assert subscriber.statistics().flow.outstanding_messages <= 11
    assert seen == [(0, 1), (0, 2)] + [(n, 1) for n in range(1, 40)]


async def test_a_stopping_owner_keeps_its_partitions_until_its_handlers_finish(
    client: streamsub.Client, server: RedisServer, short_ownership_lease: float
) -> None:
    """A subscriber stops while a handler of key k runs twice the partition lease:
    it keeps renewing until that handler is done and acked, so the subscriber
    that takes over starts at k's next message and never runs k's beside it."""
    await _ordered(client, partitions=2)
    events: list[tuple[str, str, int]] = []

    def recorder(name: str, slow: float) -> Callable[[streamsub.Message], Any]:
        async def handle(message: streamsub.Message) -> None:
            index = _index(message)
            events.append(("start", name, index))
            if index == 0:
                await asyncio.sleep(slow)
            events.append(("end", name, index))

        return handle

    other = streamsub.connect(server.url)
    try:
        first = client.subscribe("billing", recorder("a", 2 * short_ownership_lease), consumer="a")
        async with first:
            await _publish_keys(client, "orders", ["k"], 5)
            await until(lambda: ("start", "a", 0) in events, 15, "the slow handler")
            async with other.subscribe("billing", recorder("b", 0), consumer="b"):
                await first.stop()
                await until(lambda: len([e for e in events if e[0] == "end"]) == 5, 30, "all")
    finally:
        await other.aclose()
    assert events[:2] == [("start", "a", 0), ("end", "a", 0)]
    assert [index for kind, _, index in events if kind == "start"] == list(range(5))


async def test_a_nack_during_a_hand_over_comes_back_and_the_partition_moves(
    client: streamsub.Client, server: RedisServer, short_ownership_lease: float
) -> None:
    """While a subscriber hands a partition over to one that joined, the running
    message of a key there is nacked: the key's waiting messages were given back
    when the hand-over began, the partition moves without waiting for the
    nack's backoff, and the newcomer takes the nacked message over before the
    key's later messages, in order."""
    await _ordered(client, partitions=2, backoff=0.5)
    # The first subscriber owns both partitions; the newcomer's share is partition
    # 1 (an owner keeps its lowest partitions up to its share): the key lives there.
    key = next(k for k in (f"k{i}" for i in range(100)) if partition_for_key(k, 2) == 1)
    seen: list[tuple[int, int, str]] = []

    def recorder(name: str) -> Callable[[streamsub.Message], Any]:
        async def handle(message: streamsub.Message) -> None:
            index = _index(message)
            seen.append((index, message.delivery_attempt, name))
            if index == 0 and message.delivery_attempt == 1:
                await asyncio.sleep(2.0)  # the newcomer joins meanwhile
                raise RuntimeError("not yet")

        return handle

    other = streamsub.connect(server.url)
    try:
        async with client.subscribe("billing", recorder("a"), consumer="a") as first:
            await _publish_keys(client, "orders", [key], 10)
            await until(lambda: bool(seen), 15, "the first message")
            async with other.subscribe("billing", recorder("b"), consumer="b") as second:
                await until(lambda: len(seen) == 11, 30, "every message")
                await until(lambda: second.statistics().partitions == (1,), 30, "the move")
                assert first.statistics().partitions == (0,)
    finally:
        await other.aclose()
    assert [(index, attempt) for index, attempt, _ in seen] == [(0, 1), (0, 2)] + [
        (n, 1) for n in range(1, 10)
    ]
    assert [name for _, _, name in seen] == ["a"] + ["b"] * 10


async def test_a_seek_while_a_keys_message_runs_does_not_stall_the_key(
    client: streamsub.Client,
) -> None:
    """Seeking back while a key's message runs delivers it again: the new delivery
    runs (the old one is no longer settled), and the key's later messages follow
    in order rather than waiting for ever."""
    await _ordered(client, partitions=1)
    release = asyncio.Event()
    seen: list[tuple[int, int]] = []

    async def handler(message: streamsub.Message) -> None:
        index = _index(message)
        seen.append((index, message.delivery_attempt))
        if len(seen) == 1:
            await release.wait()

    async with client.subscribe("billing", handler):
        await _publish_keys(client, "orders", ["k"], 5)
        await until(lambda: bool(seen), 15, "the first message")
        await client.seek("billing", to="earliest")
        await until(lambda: len(seen) >= 2, 15, "the redelivery")
        release.set()
        await until(lambda: len({index for index, _ in seen}) == 5, 15, "the rest of the key")
    firsts = [index for index, _ in seen]
    assert firsts[:2] == [0, 0]
    assert firsts[2:] == [1, 2, 3, 4]


async def test_partition_rights_are_sticky_as_members_join_leave_and_crash(
    client: streamsub.Client,
) -> None:
    """Ownership heartbeats of several members of one ordered subscription, 16
    partitions: a member that joins takes only its share (5 or 6 of 16 from two
    members, not most partitions as a round robin over names would move), and a
    member that leaves or crashes gives up only its own; each member that stays
    keeps everything it owned, and the shares stay even."""
    topic = await client.create_topic("sticky", partitions=16)
    await client.create_subscription("sticky-sub", topic="sticky", enable_message_ordering=True)
    backend = client._backend

    async def beat(member: str, lease_ms: int = 30_000) -> set[int]:
        """Heartbeats of ``member`` until it has handed back what is another's."""
        ownership = await backend.own_partitions(topic, "sticky-sub", member, lease_ms)
        if ownership.hand_back:
            ownership = await backend.own_partitions(
                topic, "sticky-sub", member, lease_ms, release=sorted(ownership.hand_back)
            )
        return set(ownership.owned)

    async def settle(*members: str) -> dict[str, set[int]]:
        for _ in range(3):  # hand back, then take
            owned = {m: await beat(m, 300 if m == "crashes" else 30_000) for m in members}
        return owned

    first = await settle("a", "b")
    assert sorted(len(p) for p in first.values()) == [8, 8]
    second = await settle("a", "b", "c")
    assert sorted(len(p) for p in second.values()) == [5, 5, 6]
    assert second["a"] <= first["a"]
    assert second["b"] <= first["b"]  # each kept what it had, but for c's share
    third = await settle("a", "b", "c", "crashes")
    assert sorted(len(p) for p in third.values()) == [4, 4, 4, 4]
    for member in "abc":
        assert third[member] <= second[member]
    await asyncio.sleep(0.4)  # "crashes" stops renewing: its 300-ms lease runs out
    fourth = await settle("a", "b", "c")
    assert sorted(len(p) for p in fourth.values()) == [5, 5, 6]
    for member in "abc":
        assert fourth[member] >= third[member]  # only the crashed member's moved
    await backend.own_partitions(topic, "sticky-sub", "c", 30_000, leave=True)
    fifth = await settle("a", "b")
    assert sorted(len(p) for p in fifth.values()) == [8, 8]
    assert fifth["a"] >= fourth["a"]
    assert fifth["b"] >= fourth["b"]
    assert fifth["a"] | fifth["b"] == set(range(16))


async def test_a_handler_past_its_lease_gives_its_key_to_the_redelivery(
    client: streamsub.Client,
) -> None:
    """On an ordered subscription, a handler that hangs past max_lease_duration does
    not hold its key for good: the message is given up and delivered again, the
    key's later messages follow that redelivery in order, and the other keys flow
    meanwhile; the hung handler's late ack settles nothing."""
    await _ordered(client, partitions=4, ack_deadline=1.0)
    keys = [f"key-{k}" for k in range(8)]
    seen: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    release = asyncio.Event()

    async def handle(message: streamsub.Message) -> None:
        key = message.ordering_key or ""
        seen[key].append((_index(message), message.delivery_attempt))
        if key == "key-0" and _index(message) == 3 and message.delivery_attempt == 1:
            await release.wait()

    flow = streamsub.FlowControl(max_lease_duration=1.5)
    async with client.subscribe("billing", handle, flow_control=flow) as subscriber:
        await _publish_keys(client, "orders", keys, 20)
        await until(lambda: all(len(seen[k]) == 20 for k in keys[1:]), 10, "the other keys")
        assert [n for n, _ in seen["key-0"]] == [0, 1, 2, 3], "key-0 ran past its hung message"
        await until(lambda: len(seen["key-0"]) == 21, 10, "key-0 after the redelivery")
        assert subscriber.statistics().expired == 1
        release.set()
        await until(lambda: subscriber.statistics().flow.outstanding_messages == 0, 5, "acks")
    assert seen["key-0"] == [(n, 1) for n in range(4)] + [(3, 2)] + [(n, 1) for n in range(4, 20)]
    assert (await client.subscription_stats("billing")).pending == 0

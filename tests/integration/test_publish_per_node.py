"""The publisher's writes per node (Redis Cluster's masters), on a backend that
says which node holds each partition: a batch goes as one write per node, each
node has its own writes in flight, and a node that holds its writes back or
fails them holds back only its own partitions' publishes. Key order holds.

The backends are the real test backend (one server, or the session's cluster)
with ``write_groups`` told which partitions share a "node" and ``append``
held or failed on purpose for one of them; Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping

import redis

import streamsub
from streamsub._backends.base import Link, TopicRecord
from streamsub._engine.publisher import MAX_IN_FLIGHT
from streamsub._errors import StreamsubError, UnavailableError
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key

PARTITIONS = 6
SICK = {0, 3}
"""The partitions of the node that is held back or fails."""


def _keys_of(partition: int, count: int, prefix: str = "k") -> list[str]:
    keys = (f"{prefix}{n}" for n in range(100_000))
    return [k for k in keys if streamsub.fnv1a_32(k.encode()) % PARTITIONS == partition][:count]


class _Nodes(TEST_BACKEND):
    """Partitions ``SICK`` on node "sick", every other partition on a node of
    its own. With ``hold``, each write to "sick" waits until its event in
    ``held`` is set (or ``release`` is); with ``fail``, they then answer
    ``UnavailableError`` for its partitions without writing them (a master
    that died). ``jitter``: every other write's answer waits up to that many
    seconds after Redis gave it, so nodes answer out of order (the sends stay
    in order, as the real backend's do)."""

    def __init__(
        self, url: str, *, hold: bool = False, fail: bool = False, jitter: float = 0
    ) -> None:
        super().__init__(url)
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        self.held: list[asyncio.Event] = []
        self.fail = fail
        self.jitter = jitter
        self.sick_in_flight = 0
        self.most_sick_in_flight = 0
        self.mixed = 0
        """Appends that spanned "sick" and another node (there should be none)."""

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        groups: dict[str | None, list[int]] = {}
        for partition in partitions:
            node = "sick" if partition in SICK else f"node-{partition}"
            groups.setdefault(node, []).append(partition)
        return groups

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        sick = SICK.intersection(batch)
        if not sick:
            results = await super().append(topic, batch, links)
            if self.jitter:
                await asyncio.sleep(random.uniform(0, self.jitter))
            return results
        self.mixed += len(sick) < len(batch)
        self.sick_in_flight += 1
        self.most_sick_in_flight = max(self.most_sick_in_flight, self.sick_in_flight)
        mine = asyncio.Event()
        self.held.append(mine)
        try:
            if not self.release.is_set():
                await _first(self.release, mine)
        finally:
            self.sick_in_flight -= 1
        if self.fail:
            return {p: UnavailableError(f"node of partition {p} is down") for p in batch}
        return await super().append(topic, batch, links)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _bodies(redis_client: redis.Redis, topic: str) -> dict[int, list[bytes]]:
    return {
        p: [fields[b"d"] for _, fields in redis_client.xrange(stream_key(redis_client, topic, p))]
        for p in range(PARTITIONS)
    }


def _assert_rounds_in_order(
    bodies: dict[int, list[bytes]], partitions: Iterable[int], rounds: int
) -> None:
    """Each key of :func:`_rounds` on ``partitions`` has all its ``rounds``
    messages stored, in order."""
    for p in partitions:
        for key in _keys_of(p, 2):
            mine = [b for b in bodies[p] if b.startswith(f"{key}:".encode())]
            assert mine == [f"{key}:{n}".encode() for n in range(rounds)], (p, key)


async def _rounds(
    client: streamsub.Client, rounds: int, pause: float
) -> tuple[list[asyncio.Future[str]], list[asyncio.Future[str]]]:
    """``rounds`` rounds, ``pause`` apart, each publishing to the sick
    partitions under 2 keys each and to every other partition under 2 keys
    each, all in one step (one batch: the publisher is at hand, so each call
    queues at once, and the flusher takes the batch before the pause is
    over): the sick ones' futures and the others'. Each key's messages are
    ``<key>:<round>``."""
    await client.publish("nodes", b"warm", ordering_key=_keys_of(1, 1, "warm")[0])  # the publisher
    sick: list[asyncio.Future[str]] = []
    healthy: list[asyncio.Future[str]] = []
    for n in range(rounds):
        for p in range(PARTITIONS):
            for key in _keys_of(p, 2):
                future = asyncio.ensure_future(
                    client.publish("nodes", f"{key}:{n}".encode(), ordering_key=key)
                )
                (sick if p in SICK else healthy).append(future)
        await asyncio.sleep(pause)
    return sick, healthy


async def test_a_node_that_holds_its_writes_holds_back_only_its_partitions(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """The sick node takes writes and answers none (a master that is slow, or
    dead and not yet refusing). 12 rounds, 20 ms apart, each a batch over every
    node: every publish to the other nodes returns its id while the sick node
    holds its writes, which never number more than MAX_IN_FLIGHT at once
    (before, 4 batches each holding a sick write filled the publisher's writes
    in flight and the rest waited); once it answers, the held publishes return
    too, and every key's messages are stored in publish order."""
    redis_client.flushall()
    backend = _Nodes(server.url, hold=True)
    async with streamsub.Client(backend) as client:
        await client.create_topic("nodes", partitions=PARTITIONS)
        sick, healthy = await _rounds(client, 12, 0.02)
        try:
            async with asyncio.timeout(10):
                await asyncio.gather(*healthy)
            assert not any(future.done() for future in sick)
            assert backend.most_sick_in_flight == MAX_IN_FLIGHT
            assert backend.mixed == 0
        finally:
            backend.release.set()  # else closing the client waits for ever
        async with asyncio.timeout(10):
            await asyncio.gather(*sick)
    _assert_rounds_in_order(_bodies(redis_client, "nodes"), range(PARTITIONS), 12)


async def test_a_node_whose_writes_fail_holds_back_only_its_partitions(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """The sick node holds its writes, then fails them (a master that died): 3
    rounds make 3 writes to it; the first fails while the other two are still
    out, and publishes to the other nodes made then return at once (before, a
    failure held back every new write until every write in flight was back).
    Every publish to the sick partitions fails (UnavailableError, or paused
    behind it), none is stored, and the other keys keep their order."""
    redis_client.flushall()
    backend = _Nodes(server.url, hold=True, fail=True)
    async with streamsub.Client(backend) as client:
        await client.create_topic("nodes", partitions=PARTITIONS)
        sick, healthy = await _rounds(client, 3, 0.02)
        try:
            async with asyncio.timeout(10):
                await asyncio.gather(*healthy)
            assert len(backend.held) == 3
            backend.held[0].set()
            async with asyncio.timeout(10):
                first = await asyncio.gather(*sick[:4], return_exceptions=True)
            assert all(isinstance(r, UnavailableError) for r in first), first
            later = [
                client.publish("nodes", b"later-%d" % p, ordering_key=_keys_of(p, 1, "later")[0])
                for p in range(PARTITIONS)
                if p not in SICK
            ]
            async with asyncio.timeout(10):
                ids = await asyncio.gather(*later)
            assert not any(future.done() for future in sick[4:])  # still out
        finally:
            backend.release.set()  # else closing the client waits for ever
        async with asyncio.timeout(10):
            rest = await asyncio.gather(*sick[4:], return_exceptions=True)
        assert all(isinstance(r, StreamsubError) for r in rest), rest
    bodies = _bodies(redis_client, "nodes")
    assert all(not bodies[p] for p in SICK)
    assert sorted(int(i.split("-")[0]) for i in ids) == sorted(set(range(PARTITIONS)) - SICK)
    _assert_rounds_in_order(bodies, set(range(PARTITIONS)) - SICK, 3)


async def test_key_order_holds_while_nodes_answer_out_of_order(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Writes answered out of order across nodes (each answer waits up to 5 ms):
    8 tasks publishing 150 messages each under 24 keys, singly and in
    publish_many calls of 5, over 6 partitions on 5 nodes: every id is
    stored once and every key's messages are in publish order."""
    redis_client.flushall()
    backend = _Nodes(server.url, jitter=0.005)
    keys = [f"key-{n}" for n in range(24)]
    async with streamsub.Client(backend) as client:
        await client.create_topic("nodes", partitions=PARTITIONS)

        async def task(t: int) -> list[str]:
            ids: list[str] = []
            for n in range(0, 150, 5):
                messages = [
                    streamsub.OutgoingMessage(
                        data=f"{keys[(t + i) % 24]}:{t}:{n + i}".encode(),
                        ordering_key=keys[(t + i) % 24],
                    )
                    for i in range(5)
                ]
                if n % 10:
                    ids += await client.publish_many("nodes", messages)
                else:
                    ids += await asyncio.gather(
                        *(
                            client.publish("nodes", m.data, ordering_key=m.ordering_key)
                            for m in messages
                        )
                    )
            return ids

        results = await asyncio.gather(*(task(t) for t in range(8)))
    ids = [i for r in results for i in r]
    assert len(ids) == len(set(ids)) == 8 * 150
    bodies = _bodies(redis_client, "nodes")
    assert sum(len(b) for b in bodies.values()) == 8 * 150
    for key in keys:
        mine = [
            b.decode().split(":")
            for p in bodies
            for b in bodies[p]
            if b.startswith(f"{key}:".encode())
        ]
        for t in range(8):
            sequence = [int(n) for k, task_, n in mine if int(task_) == t]
            assert sequence == sorted(sequence), (key, t)


async def test_messages_without_a_key_go_round_a_node_that_holds_its_writes(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """The sick node holds its writes. 200 publishes without an ordering key,
    5 ms apart: once the sick node has its four writes out, the sticky
    partition moves on to the partitions of nodes with room (Kafka's adaptive
    partitioner, KIP-794), so all but those four writes' messages return
    while it holds; once it answers, every publish has returned and each
    message is stored once. (Before, the sticky partition stayed on the sick
    node's partition and the batch grew there until full: 1 % returned.)"""
    redis_client.flushall()
    backend = _Nodes(server.url, hold=True)
    async with streamsub.Client(backend) as client:
        await client.create_topic("nodes", partitions=PARTITIONS)
        await _rounds(client, 1, 0)  # every node written to once: the client knows them
        published: list[asyncio.Future[str]] = []
        try:
            for n in range(200):
                published.append(asyncio.ensure_future(client.publish("nodes", b"plain-%d" % n)))
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.2)
            returned = sum(future.done() for future in published)
            assert backend.most_sick_in_flight == MAX_IN_FLIGHT
            assert returned >= 200 - 4 * 10, f"{returned} of 200 returned"
        finally:
            backend.release.set()
        async with asyncio.timeout(10):
            ids = await asyncio.gather(*published)
    bodies = _bodies(redis_client, "nodes")
    plain = sorted(b for p in bodies for b in bodies[p] if b.startswith(b"plain-"))
    assert plain == sorted(b"plain-%d" % n for n in range(200))
    assert len(set(ids)) == 200

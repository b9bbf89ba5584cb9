"""An ordered subscription served by two gateway processes: one partition, one
stream of one gateway at a time; a stopped gateway's partitions move at once, a
killed one's after its ownership lease, with each key's order held."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from typing import Any

import grpc
import pytest
import redis
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.types import PublisherOptions
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

import streamsub
from streamsub.testing import RedisServer

from .test_restart import GatewayProcess, _free_port
from .test_streaming import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_KEYS = 40
_PER_KEY = 60
_PARTITIONS = 16


def _subscriber(host: str) -> pubsub_v1.SubscriberClient:
    # A gateway killed and started again on the same port is reached within a
    # second, not after gRPC's reconnect backoff (up to two minutes).
    options = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]
    channel = grpc.insecure_channel(host, options=options)
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def _owners(url: str, name: str) -> dict[int, str]:
    """Partition -> the pid of the gateway process that owns it now."""

    async def read() -> dict[int, str]:
        async with streamsub.connect(url) as client:
            stats = await client.subscription_stats(name)
        return {p: member.split("-")[-2] for p, (member, _) in stats.owners.items()}

    return asyncio.run(read())


def _member_pids(redis_client: redis.Redis, name: str) -> set[str]:
    """The pids of the gateway processes that are members of ``name``'s ownership."""
    members = redis_client.zrange(f"ss:{{own.{name}}}:members", 0, -1)
    return {m.decode().split("-")[-2] for m in members}


class _Log:
    """Every delivery, in the order the two clients' callbacks saw them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[float, str, str, int]] = []
        self.first: dict[str, list[int]] = collections.defaultdict(list)
        self.seen: set[tuple[str, int]] = set()

    def callback(self, label: str) -> Any:
        def handle(message: Any) -> None:
            time.sleep(0.002)
            key, index = message.ordering_key, int(message.attributes["index"])
            with self.lock:
                self.entries.append((time.monotonic(), label, key, index))
                if (key, index) not in self.seen:
                    self.seen.add((key, index))
                    self.first[key].append(index)
            message.ack()

        return handle

    def count(self) -> int:
        with self.lock:
            return len(self.seen)

    def between(self, start: float, end: float, lowest: int = 0) -> list[tuple[str, str, int]]:
        with self.lock:
            return [(c, k, i) for t, c, k, i in self.entries if start <= t < end and i >= lowest]


def _publish(publisher: pubsub_v1.PublisherClient, topic: str, start: int) -> None:
    futures = [
        publisher.publish(topic, b"o", ordering_key=f"key-{k}", index=str(i))
        for i in range(start, start + _PER_KEY)
        for k in range(_KEYS)
    ]
    for future in futures:
        future.result(timeout=60)


def test_two_gateway_processes_share_an_ordered_subscription_and_take_over(
    server: RedisServer,
    redis_client: redis.Redis,
    project: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two `streamsub gateway` processes each own half of an ordered subscription's
    partitions, and the official client streaming from each gets its keys alone,
    each key's first deliveries in publish order. SIGTERM hands one gateway's
    partitions back at once (its membership is gone when it exits); a gateway
    started again takes its share back; SIGKILL moves that share to the other
    only after the ownership lease, and every key stays in order throughout; a
    gateway started on the killed one's port takes that share back again."""
    port_a, port_b = _free_port(), _free_port()
    a = GatewayProcess(server.url, port_a)
    b = GatewayProcess(server.url, port_b)
    processes = [a, b]
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port_b}")
    publisher = pubsub_v1.PublisherClient(
        publisher_options=PublisherOptions(enable_message_ordering=True)
    )
    on_a, on_b = _subscriber(f"127.0.0.1:{port_a}"), _subscriber(f"127.0.0.1:{port_b}")
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    native = f"{project}~billing"
    publisher.create_topic(name=topic)
    on_b.create_subscription(
        # An ack deadline well past the ownership lease: what the killed gateway
        # held is taken over at once by the new owner, not when it lapses.
        request={
            "name": name,
            "topic": topic,
            "enable_message_ordering": True,
            "ack_deadline_seconds": 120,
        }
    )
    log = _Log()
    futures = [on_a.subscribe(name, log.callback("a")), on_b.subscribe(name, log.callback("b"))]
    pid_b = str(b.process.pid)

    def split_between(pid_a: str) -> bool:
        # Half each, as the ownership gives two members by right: a join hands
        # partitions over one by one, so both owning some is not yet the split
        # (a partition still on its way would deliver a key from both).
        owners = list(_owners(server.url, native).values())
        half = _PARTITIONS // 2
        return owners.count(pid_a) == half and owners.count(pid_b) == half

    try:
        wait_for(lambda: split_between(str(a.process.pid)), 60, "both gateways to own partitions")
        # Phase 1: SIGTERM one gateway while both deliver.
        started = time.monotonic()
        _publish(publisher, topic, 0)
        wait_for(lambda: log.count() >= _KEYS * _PER_KEY // 3, 60, "a third delivered")
        before_stop = time.monotonic()
        assert a.terminate() == 0
        assert str(a.process.pid) not in _member_pids(redis_client, native)
        assert str(a.process.pid) not in _owners(server.url, native).values()
        wait_for(lambda: log.count() == _KEYS * _PER_KEY, 120, "every message of phase 1")
        by_key: dict[str, set[str]] = collections.defaultdict(set)
        for client, key, _ in log.between(started, before_stop):
            by_key[key].add(client)
        assert all(len(clients) == 1 for clients in by_key.values()), by_key
        assert {c for cs in by_key.values() for c in cs} == {"a", "b"}

        # Phase 2: a gateway on a's port again, then SIGKILL it while both deliver.
        a2 = GatewayProcess(server.url, port_a)
        processes.append(a2)
        pid_a2 = str(a2.process.pid)
        wait_for(lambda: split_between(pid_a2), 60, "the new gateway to take its share")
        owned_by_a2 = {p for p, pid in _owners(server.url, native).items() if pid == pid_a2}
        started = time.monotonic()
        _publish(publisher, topic, _PER_KEY)
        wait_for(
            lambda: log.count() >= _KEYS * _PER_KEY * 4 // 3, 60, "a third of phase 2 delivered"
        )
        a2.process.kill()
        killed = time.monotonic()
        a2.process.wait(10)
        _publish(publisher, topic, 2 * _PER_KEY)  # later messages of the same keys
        wait_for(lambda: log.count() == 3 * _KEYS * _PER_KEY, 180, "every message of phase 2")
        by_key = collections.defaultdict(set)
        for client, key, _ in log.between(started, killed, lowest=_PER_KEY):
            by_key[key].add(client)
        assert all(len(clients) == 1 for clients in by_key.values()), by_key
        moved = {key for key, clients in by_key.items() if clients == {"a"}}
        assert moved, "the killed gateway delivered some keys"
        # (The killed gateway's client still runs callbacks on what it had
        # received before the kill; the other client's deliveries are the move.)
        after = [(c, k, i) for c, k, i in log.between(started, float("inf")) if k in moved]
        assert {c for c, _, _ in after} == {"a", "b"}
        first_after = min(
            t for t, c, k, i in log.entries if c == "b" and k in moved and i >= _PER_KEY
        )
        # Not before the killed gateway's lease ran out (10 s after its last renewal,
        # which was at most a third of that before the kill).
        assert first_after - killed > 5, first_after - killed
        for key in moved:
            on_b_after = [i for c, k, i in after if k == key and c == "b"]
            assert on_b_after == sorted(set(on_b_after)), f"{key} out of order after the move"
        assert _owners(server.url, native).keys() >= owned_by_a2
        assert set(_owners(server.url, native).values()) == {pid_b}
        for key, indices in log.first.items():
            assert indices == list(range(3 * _PER_KEY)), f"{key}'s first deliveries out of order"

        # A gateway started again on the killed one's port: a's client streams
        # from it, and it takes its share back. (Left dead, a's client would
        # retry its lease extensions there for a minute and then raise in its
        # own threads.)
        a3 = GatewayProcess(server.url, port_a)
        processes.append(a3)
        wait_for(lambda: split_between(str(a3.process.pid)), 60, "the new gateway's share")
    finally:
        for future in futures:
            future.cancel()
        for future in futures:  # its threads are done before the channels close
            with contextlib.suppress(Exception):
                future.result(timeout=30)
        on_a.close()
        on_b.close()
        publisher.stop()
        for gateway in processes:
            if gateway.process.poll() is None:
                gateway.process.kill()


def test_unary_pull_of_an_ordered_subscription_on_two_gateways(
    server: RedisServer, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unary Pull of an ordered subscription through two gateway processes: each
    key's messages come from one gateway only, in publish order, until acked."""
    port_a, port_b = _free_port(), _free_port()
    a, b = GatewayProcess(server.url, port_a), GatewayProcess(server.url, port_b)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port_b}")
    publisher = pubsub_v1.PublisherClient(
        publisher_options=PublisherOptions(enable_message_ordering=True)
    )
    clients = {"a": _subscriber(f"127.0.0.1:{port_a}"), "b": _subscriber(f"127.0.0.1:{port_b}")}
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    native = f"{project}~billing"
    try:
        publisher.create_topic(name=topic)
        clients["b"].create_subscription(
            request={"name": name, "topic": topic, "enable_message_ordering": True}
        )
        for client in clients.values():  # both join the ownership
            client.pull(subscription=name, max_messages=1)
        pids = {str(a.process.pid), str(b.process.pid)}
        wait_for(
            lambda: set(_owners(server.url, native).values()) == pids,
            60,
            "both gateways to own partitions",
        )
        keys, per_key = 20, 30
        futures = [
            publisher.publish(topic, b"o", ordering_key=f"key-{k}", index=str(i))
            for i in range(per_key)
            for k in range(keys)
        ]
        for future in futures:
            future.result(timeout=60)
        got: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        total = 0
        while total < keys * per_key:
            pulled = 0
            for label, client in clients.items():
                response = client.pull(subscription=name, max_messages=50)
                for m in response.received_messages:
                    got[m.message.ordering_key].append((label, int(m.message.attributes["index"])))
                if response.received_messages:
                    client.acknowledge(
                        subscription=name, ack_ids=[m.ack_id for m in response.received_messages]
                    )
                pulled += len(response.received_messages)
            total += pulled
            assert pulled or total, "nothing pulled"
        for key, deliveries in got.items():
            assert len({label for label, _ in deliveries}) == 1, f"{key} from both gateways"
            assert [i for _, i in deliveries] == list(range(per_key)), f"{key} out of order"
        assert {label for ds in got.values() for label, _ in ds} == {"a", "b"}
    finally:
        for client in clients.values():
            client.close()
        publisher.stop()
        for gateway in (a, b):
            gateway.terminate()

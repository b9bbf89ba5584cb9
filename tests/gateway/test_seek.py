"""Seek and snapshots through the gateway, driven by the official Python client."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.types import BatchSettings
from google.protobuf import field_mask_pb2, timestamp_pb2
from google.pubsub_v1 import types as gapic

from .test_streaming import _RawStream, _setup, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def small_batches(emulator: str) -> Iterator[pubsub_v1.PublisherClient]:
    """A publisher sending ten messages a request, so that keyless messages spread
    over many partitions (each request goes to one)."""
    client = pubsub_v1.PublisherClient(batch_settings=BatchSettings(max_messages=10))
    yield client
    client.stop()


def _pending(redis_client: redis.Redis, project: str, partitions: int = 16) -> int:
    """Messages the subscription billing of topic orders holds unacknowledged."""
    total = 0
    for p in range(partitions):
        summary = redis_client.xpending(f"ss:{{{project}~orders.{p}}}", f"{project}~billing")
        total += int(summary["pending"])
    return total


class _Recorder:
    """A streaming-pull callback: counts deliveries per message id, acks unless told
    to hold (held messages are kept unacked until the test acks them)."""

    def __init__(self, hold: Any = None) -> None:
        self.lock = threading.Lock()
        self.deliveries: dict[str, int] = {}
        self.held: list[Any] = []
        self._hold = hold

    def __call__(self, message: Any) -> None:
        with self.lock:
            self.deliveries[message.message_id] = self.deliveries.get(message.message_id, 0) + 1
            first = self.deliveries[message.message_id] == 1
            if first and self._hold is not None and self._hold(message):
                self.held.append(message)
                return
        message.ack()

    def seen(self) -> set[str]:
        with self.lock:
            return set(self.deliveries)

    def again(self) -> set[str]:
        """Messages delivered more than once."""
        with self.lock:
            return {m for m, n in self.deliveries.items() if n > 1}


def _publish(publisher: pubsub_v1.PublisherClient, topic: str, n: int, tag: str) -> list[str]:
    futures = [publisher.publish(topic, b"%s %d" % (tag.encode(), i)) for i in range(n)]
    return [f.result(timeout=60) for f in futures]


def test_seek_to_a_time_redelivers_exactly_what_was_published_after_it(
    small_batches: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    redis_client: redis.Redis,
    project: str,
) -> None:
    """Every message acked, a seek to a time between two batches delivers the second
    batch again, to the stream that is running, and nothing of the first."""
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    small_batches.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    recorder = _Recorder()
    future = subscriber.subscribe(name, recorder)
    try:
        before = _publish(small_batches, topic, 300, "before")
        wait_for(lambda: recorder.seen() >= set(before), 60, "the first batch")
        time.sleep(0.05)
        point = datetime.datetime.now(datetime.UTC)
        time.sleep(0.05)
        after = _publish(small_batches, topic, 300, "after")
        assert len({m.split("-")[0] for m in after}) >= 4, "the batch spans several partitions"
        wait_for(lambda: recorder.seen() == set(before) | set(after), 60, "the second batch")
        wait_for(lambda: _pending(redis_client, project) == 0, 30, "every ack to land")
        assert not recorder.again()
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(point)
        subscriber.seek(request={"subscription": name, "time": stamp})
        wait_for(lambda: recorder.again() >= set(after), 60, "the second batch again")
        time.sleep(2)  # room for anything else to (wrongly) come back
        assert recorder.again() == set(after)
    finally:
        future.cancel()
        future.result(timeout=30)


def test_seek_to_a_snapshot_redelivers_exactly_its_unacked_messages(
    small_batches: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    redis_client: redis.Redis,
    project: str,
) -> None:
    """A snapshot taken while a third of the messages are held unacked; those are
    then acked; a seek to the snapshot delivers exactly them again."""
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    snapshot = f"projects/{project}/snapshots/before-acks"
    small_batches.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    recorder = _Recorder(hold=lambda m: int(m.data.split()[1]) % 3 == 0)
    future = subscriber.subscribe(name, recorder)
    try:
        ids = _publish(small_batches, topic, 300, "m")
        wait_for(lambda: recorder.seen() == set(ids), 60, "every message")
        held = {m.message_id for m in recorder.held}
        assert len(held) == 100
        assert len({m.split("-")[0] for m in held}) >= 4, "held messages span partitions"
        wait_for(lambda: _pending(redis_client, project) == 100, 30, "the other acks to land")
        made = subscriber.create_snapshot(name=snapshot, subscription=name)
        assert made.name == snapshot
        assert made.topic == topic
        for message in recorder.held:
            message.ack()
        wait_for(lambda: _pending(redis_client, project) == 0, 30, "the held ones' acks")
        assert not recorder.again()
        subscriber.seek(request={"subscription": name, "snapshot": snapshot})
        wait_for(lambda: recorder.again() >= held, 60, "the snapshot's unacked messages")
        time.sleep(2)
        assert recorder.again() == held
    finally:
        future.cancel()
        future.result(timeout=30)


def test_snapshot_calls_and_their_errors(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Snapshots are created, read, listed per project and per topic, updated only as
    streamsub keeps them, and deleted; errors are Pub/Sub's."""
    topic = f"projects/{project}/topics/orders"
    other_topic = f"projects/{project}/topics/audit"
    name = f"projects/{project}/subscriptions/billing"
    other = f"projects/{project}/subscriptions/auditing"
    snapshot = f"projects/{project}/snapshots/nightly"
    publisher.create_topic(name=topic)
    publisher.create_topic(name=other_topic)
    subscriber.create_subscription(name=name, topic=topic)
    subscriber.create_subscription(name=other, topic=other_topic)
    made = subscriber.create_snapshot(name=snapshot, subscription=name)
    expires = made.expire_time.timestamp()
    assert 7 * 86400 - 60 < expires - time.time() < 7 * 86400 + 60
    assert subscriber.get_snapshot(snapshot=snapshot).topic == topic
    subscriber.create_snapshot(name=f"projects/{project}/snapshots/audit", subscription=other)
    subscriber.create_snapshot(name=f"projects/other-{project}/snapshots/xyz", subscription=name)
    listed = [s.name for s in subscriber.list_snapshots(project=f"projects/{project}")]
    assert listed == [f"projects/{project}/snapshots/audit", snapshot]
    by_topic = list(publisher.list_topic_snapshots(topic=topic))
    assert sorted(by_topic) == sorted([snapshot, f"projects/other-{project}/snapshots/xyz"])
    with pytest.raises(exceptions.AlreadyExists):
        subscriber.create_snapshot(name=snapshot, subscription=name)
    with pytest.raises(exceptions.NotFound):
        subscriber.create_snapshot(
            name=f"projects/{project}/snapshots/yyy",
            subscription=f"projects/{project}/subscriptions/missing",
        )
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_snapshot(
            request={
                "name": f"projects/{project}/snapshots/labelled",
                "subscription": name,
                "labels": {"a": "b"},
            }
        )
    same = subscriber.update_snapshot(
        request={
            "snapshot": {"name": snapshot, "expire_time": made.expire_time},
            "update_mask": field_mask_pb2.FieldMask(paths=["expire_time"]),
        }
    )
    assert same.expire_time == made.expire_time
    later = made.expire_time + datetime.timedelta(days=1)
    for paths, fields in (
        (["expire_time"], {"expire_time": later}),
        (["labels"], {"labels": {"a": "b"}}),
        (["topic"], {"topic": other_topic}),
    ):
        with pytest.raises(exceptions.InvalidArgument):
            subscriber.update_snapshot(
                request={
                    "snapshot": {"name": snapshot, **fields},
                    "update_mask": field_mask_pb2.FieldMask(paths=paths),
                }
            )
    with pytest.raises(exceptions.NotFound):
        subscriber.seek(
            request={"subscription": name, "snapshot": f"projects/{project}/snapshots/missing"}
        )
    with pytest.raises(exceptions.NotFound):
        subscriber.seek(
            request={"subscription": f"projects/{project}/subscriptions/missing", "time": later}
        )
    with pytest.raises(exceptions.FailedPrecondition):
        subscriber.seek(
            request={"subscription": other, "snapshot": snapshot}  # a snapshot of orders
        )
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.seek(request={"subscription": name})
    subscriber.delete_snapshot(snapshot=snapshot)
    with pytest.raises(exceptions.NotFound):
        subscriber.get_snapshot(snapshot=snapshot)
    with pytest.raises(exceptions.NotFound):
        subscriber.delete_snapshot(snapshot=snapshot)


def test_seek_frees_what_a_full_stream_holds_and_delivers_it_again(
    small_batches: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
) -> None:
    """A stream at its max_outstanding_messages, holding messages unacked, gets them
    all again on the same stream after a seek to a time before them: the seek frees
    the room they took and stops their leases, it does not wait for them to lapse."""
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    small_batches.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
    point = datetime.datetime.now(datetime.UTC)
    time.sleep(0.05)
    ids = set(_publish(small_batches, topic, 60, "m"))
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=600, max_outstanding_messages=60
        ),
    )
    try:
        wait_for(lambda: len(stream.messages()) >= 60, 30, "60 messages")
        assert {m.message.message_id for m in stream.messages()} == ids
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(point)
        subscriber.seek(request={"subscription": name, "time": stamp})
        wait_for(lambda: len(stream.messages()) >= 120, 30, "the 60 messages again")
        assert {m.message.message_id for m in stream.messages()[60:]} == ids
    finally:
        stream.close()
    assert stream.error is None


def test_a_seek_to_a_future_time_does_not_swallow_later_messages(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Seeking to a time ahead (how Pub/Sub users purge a backlog; a client clock a
    few seconds fast does the same) acknowledges the backlog; a message published
    after the seek returned is delivered. The gateway's seek used to move every partition
    to the future time itself, so everything published during the next hour is
    acknowledged unseen: lost for this subscription."""
    topic, name = _setup(publisher, subscriber, project)
    for future in [publisher.publish(topic, b"backlog %d" % i) for i in range(10)]:
        future.result(timeout=30)
    ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    subscriber.seek(request={"subscription": name, "time": ahead})
    later = publisher.publish(topic, b"published after the seek").result(timeout=30)
    pulled: list[Any] = []

    def pull() -> bool:
        response = subscriber.pull(
            request={"subscription": name, "max_messages": 10, "return_immediately": True}
        )
        pulled.extend(response.received_messages)
        return any(m.message.message_id == later for m in pulled)

    wait_for(pull, 10, "the message published after the seek")
    assert all(m.message.message_id == later for m in pulled)


def test_create_snapshot_without_a_name_gets_one(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Over gRPC a CreateSnapshot with no name is given a random one in the
    subscription's project. The gateway used to refuse it as an invalid resource name."""
    _, name = _setup(publisher, subscriber, project)
    snapshot = subscriber.create_snapshot(request={"name": "", "subscription": name})
    assert snapshot.name.startswith(f"projects/{project}/snapshots/")
    assert subscriber.get_snapshot(snapshot=snapshot.name).name == snapshot.name

"""Review of issue 10: an UpdateSubscription of ack_deadline_seconds and the leases
already granted.

Pub/Sub's ack deadline is the lease a delivery gets when it is made (or when
ModifyAckDeadline sets it); changing the subscription's ack_deadline_seconds
applies to later deliveries. The gateway encodes each lease as a Redis idle time
relative to the subscription's deadline ``D`` (a lease ending in ``r`` seconds is
an idle time of ``D - r``), and reclaims what has been idle ``D``: lowering ``D``
turns every outstanding lease into an expired one. Issue 10, What to build 1:
ack ids "so that an ack from any connection ... settles exactly that delivery";
Done when 1: "an exactly-once ack after the lease moved fails as the client
expects" — here the lease moves although it never ran out.
"""

from __future__ import annotations

import time

from google.cloud import pubsub_v1
from google.protobuf import field_mask_pb2

from tests.gateway.test_streaming import _setup


def test_lowering_the_ack_deadline_keeps_the_leases_already_granted(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """20 messages pulled from an exactly-once subscription and given 300 s more by
    ModifyAckDeadline stay leased when the subscription's ack deadline is lowered
    from 600 s to 60 s: nothing is delivered again, and their acks succeed. The
    gateway redelivers all 20 within seconds (an ack of a first delivery then
    fails: the delivery moved)."""
    topic, name = _setup(
        publisher,
        subscriber,
        project,
        ack_deadline_seconds=600,
        enable_exactly_once_delivery=True,
    )
    for future in [publisher.publish(topic, b"m%d" % i) for i in range(20)]:
        future.result(timeout=30)
    held = []
    while len(held) < 20:
        response = subscriber.pull(subscription=name, max_messages=20)
        assert response.received_messages, f"only {len(held)} of 20 pulled"
        held += response.received_messages
    ack_ids = [m.ack_id for m in held]
    subscriber.modify_ack_deadline(subscription=name, ack_ids=ack_ids, ack_deadline_seconds=300)
    subscriber.update_subscription(
        request={
            "subscription": {"name": name, "ack_deadline_seconds": 60},
            "update_mask": field_mask_pb2.FieldMask(paths=["ack_deadline_seconds"]),
        }
    )
    again = []
    deadline = time.monotonic() + 8  # settings are cached 1 s; sweeps run every 5 s at most
    while time.monotonic() < deadline:
        again += subscriber.pull(subscription=name, max_messages=20).received_messages
    assert not again, f"{len(again)} messages with some 290 s of lease left were delivered again"
    subscriber.acknowledge(subscription=name, ack_ids=ack_ids)

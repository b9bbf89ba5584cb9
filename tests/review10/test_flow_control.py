"""Review of issue 10: StreamingPull flow control as Pub/Sub defines it.

google.pubsub.v1.StreamingPullRequest: ``max_outstanding_messages`` and
``max_outstanding_bytes`` — "If the value is <= 0, there is no limit"; both "can
only be set on the initial StreamingPullRequest. If it is set on a subsequent
request, the stream will be aborted with status INVALID_ARGUMENT"; ``client_id``
— "When a stream disconnects and reconnects for the same stream, the client_id
should be set to the same value so that state associated with the old stream
can be transferred to the new stream". Issue 10, What to build 2: "the first
request's subscription, stream_ack_deadline_seconds, client_id,
max_outstanding_messages and max_outstanding_bytes (honour them server-side, or
clients pile up messages and they come back as duplicates)".
"""

from __future__ import annotations

import time

import grpc
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as gapic

from tests.gateway.test_streaming import _RawStream, _setup, wait_for


@pytest.mark.parametrize("field", ["max_outstanding_messages", "max_outstanding_bytes"])
def test_flow_control_on_a_later_request_aborts_the_stream(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    field: str,
) -> None:
    """Flow-control limits on a request after the first abort the stream with
    INVALID_ARGUMENT (the proto's words). The gateway ignores them silently."""
    _, name = _setup(publisher, subscriber, project)
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=60, max_outstanding_messages=5
        ),
    )
    try:
        time.sleep(0.5)
        stream.send(gapic.StreamingPullRequest(**{field: 50}))
        wait_for(lambda: stream.error is not None, 5, "the stream to be aborted")
        assert isinstance(stream.error, grpc.RpcError)
        assert stream.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        stream.close()

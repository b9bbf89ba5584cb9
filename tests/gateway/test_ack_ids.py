"""Ack ids and status codes: the gateway's pure pieces (no server)."""

from __future__ import annotations

import pytest

from streamsub import (
    AlreadyExistsError,
    BackendError,
    FailedPreconditionError,
    InvalidArgumentError,
    StreamsubError,
    SubscriptionNotFoundError,
    UnavailableError,
)
from streamsub.gateway._adapter import format_ack_id, parse_ack_id
from streamsub.gateway._status import Code, from_streamsub


def test_ack_ids_name_one_delivery_and_parse_back() -> None:
    """An ack id carries partition, entry id, delivery count and consumer, and back."""
    ack_id = format_ack_id(7, "1711929600000-3", 4, "gw-host-12-abcdef-stream9")
    assert ack_id == "7/1711929600000-3/4/gw-host-12-abcdef-stream9"
    assert parse_ack_id(ack_id) == (7, "1711929600000-3", 4, "gw-host-12-abcdef-stream9")


@pytest.mark.parametrize(
    "ack_id",
    ["", "x", "1/2/3", "a/1-0/1/c", "1/1-0/x/c", "1/1-0/0/c", "-1/1-0/1/c", "1/10/1/c", "1/1-0/1/"],
)
def test_malformed_ack_ids_are_refused(ack_id: str) -> None:
    """Anything that is not partition/entry-id/count/consumer parses as None."""
    assert parse_ack_id(ack_id) is None


@pytest.mark.parametrize(
    ("error", "code", "http"),
    [
        (InvalidArgumentError("x"), Code.INVALID_ARGUMENT, 400),
        (SubscriptionNotFoundError("x"), Code.NOT_FOUND, 404),
        (AlreadyExistsError("x"), Code.ALREADY_EXISTS, 409),
        (FailedPreconditionError("x"), Code.FAILED_PRECONDITION, 400),
        (UnavailableError("x"), Code.UNAVAILABLE, 503),
        (BackendError("x"), Code.INTERNAL, 500),
    ],
)
def test_streamsub_errors_map_to_pubsub_codes(error: StreamsubError, code: Code, http: int) -> None:
    """Each streamsub error class is reported with Pub/Sub's code and HTTP status."""
    mapped = from_streamsub(error)
    assert mapped.code is code
    assert mapped.code.http_status == http

"""What a dead letter carries, for any reason text."""

from __future__ import annotations

from streamsub._core.codec import Decoded, decode
from streamsub._core.deadletter import REASON, dead_letter_message


def test_a_long_non_ascii_reason_is_cut_by_bytes_and_keeps_user_attributes() -> None:
    """A reason of 900 two-byte characters is cut to fit the 1024-byte attribute
    limit, and the message's own attributes stay on the dead letter."""
    source = Decoded(b"payload", "key-1", {"tenant": "acme", "kind": "order"}, 30)
    encoded = dead_letter_message(
        source,
        raw_fields=(),
        topic="orders",
        subscription="billing",
        message_id="3-1-0",
        delivery_attempts=5,
        reason="é" * 900,
    )
    decoded = decode(encoded.fields)
    reason = decoded.attributes[REASON]
    assert len(reason.encode()) <= 1024
    assert reason.startswith("éé")
    assert reason.endswith("...")
    assert decoded.attributes["tenant"] == "acme"
    assert decoded.attributes["kind"] == "order"
    assert decoded.data == b"payload"
    assert decoded.ordering_key == "key-1"

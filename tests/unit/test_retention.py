"""Retention's policy arithmetic and stream id order, on plain values."""

from __future__ import annotations

import dataclasses
import math

import pytest

from streamsub import Retention
from streamsub._core.retention import (
    GroupPosition,
    PartitionTrim,
    RetentionResult,
    safe_point,
)
from streamsub._core.streamid import (
    MAX_SEQ,
    compare_ids,
    parse_id,
    predecessor,
    successor,
)
from streamsub._errors import InvalidArgumentError, InvalidTypeError


def test_retention_defaults_keep_everything() -> None:
    """A default Retention bounds nothing and never drops unacknowledged entries."""
    policy = Retention()
    assert (policy.max_age, policy.max_length, policy.drop_unacked) == (None, None, False)
    assert not policy.bounded
    assert Retention(max_length=5).bounded
    assert Retention(max_age=1.5).bounded


def test_retention_is_frozen_and_keyword_only() -> None:
    """Retention cannot be changed after creation nor built from positional values."""
    policy = Retention(max_length=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_length = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        Retention(10)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_age": 0}, InvalidArgumentError),
        ({"max_age": -1.0}, InvalidArgumentError),
        ({"max_age": math.nan}, InvalidArgumentError),
        ({"max_age": math.inf}, InvalidArgumentError),
        ({"max_age": 400 * 86_400}, InvalidArgumentError),
        ({"max_age": "60"}, InvalidTypeError),
        ({"max_age": True}, InvalidTypeError),
        ({"max_length": 0}, InvalidArgumentError),
        ({"max_length": 1.5}, InvalidTypeError),
        ({"max_length": True}, InvalidTypeError),
        ({"drop_unacked": 1}, InvalidTypeError),
    ],
)
def test_retention_refuses_bad_values(kwargs: dict[str, object], error: type[Exception]) -> None:
    """Out-of-range or wrongly typed retention values raise, naming the field."""
    with pytest.raises(error, match="Retention"):
        Retention(**kwargs)  # type: ignore[arg-type]


def test_retention_round_trips_through_plain_values() -> None:
    """A policy stored as plain values reads back equal."""
    policy = Retention(max_age=90.5, max_length=1000, drop_unacked=True)
    assert Retention.from_dict(policy.to_dict()) == policy


def test_ids_sort_by_time_then_sequence() -> None:
    """Ids compare numerically by milliseconds, then sequence, not as text."""
    assert compare_ids("9-0", "10-0") == -1
    assert compare_ids("10-2", "10-10") == -1
    assert compare_ids("10-1", "10-1") == 0
    assert compare_ids("11-0", "10-99") == 1
    with pytest.raises(InvalidArgumentError):
        parse_id("abc")
    with pytest.raises(InvalidArgumentError):
        parse_id("-5-1")


def test_successor_and_predecessor_are_neighbours() -> None:
    """successor and predecessor step one id, across the millisecond boundary too."""
    assert successor("5-3") == "5-4"
    assert successor(f"5-{MAX_SEQ}") == "6-0"
    assert predecessor("5-3") == "5-2"
    assert predecessor("5-0") == f"4-{MAX_SEQ}"
    assert predecessor("0-0") == "0-0"
    assert predecessor(successor("1700000000000-7")) == "1700000000000-7"


def test_safe_point_is_the_lowest_need_over_groups() -> None:
    """The safe point is the lowest first-pending id, or the id after a group's last
    delivered one when it has nothing pending; no group means no bound."""
    assert safe_point([]) is None
    caught_up = GroupPosition(last_delivered_id="100-5", first_pending_id=None)
    behind = GroupPosition(last_delivered_id="100-5", first_pending_id="20-0")
    slow = GroupPosition(last_delivered_id="50-0", first_pending_id=None)
    assert safe_point([caught_up]) == "100-6"
    assert safe_point([caught_up, behind]) == "20-0"
    assert safe_point([caught_up, slow]) == "50-1"
    assert safe_point([caught_up, slow, behind]) == "20-0"


def test_result_sums_partitions() -> None:
    """A retention result totals what each partition deleted and dropped, in partition order."""
    result = RetentionResult.of("t", {1: (5, 2), 0: (3, 0)})
    assert result.partitions == (PartitionTrim(0, 3, 0), PartitionTrim(1, 5, 2))
    assert (result.trimmed, result.dropped_unacked) == (8, 2)


def test_floor_is_what_recorded_positions_still_need() -> None:
    """A snapshot floor is the lowest pending id recorded, or the id after the last
    delivered one when nothing was pending; no snapshot, no floor."""
    from streamsub._core.retention import floor_of

    assert floor_of([]) is None
    assert floor_of([("50-0", ())]) == "50-1"
    assert floor_of([("50-0", ("30-0", "12-4")), ("60-0", ())]) == "12-4"
    assert floor_of([("50-0", ()), ("20-9", ())]) == "20-10"


def test_a_group_sought_back_needs_from_below_its_pending() -> None:
    """After a seek backwards a group reads again from the id after its last
    delivered one, which may lie below its first pending id: it needs the lower."""
    sought_back = GroupPosition(last_delivered_id="0-0", first_pending_id="50-0")
    assert sought_back.needs_from == "0-1"
    assert safe_point([sought_back]) == "0-1"
    at_max_seq = GroupPosition(last_delivered_id="7-18446744073709551615", first_pending_id=None)
    assert at_max_seq.needs_from == "8-0"
    from streamsub._core.retention import floor_of

    assert floor_of([("10-0", ("30-0",))]) == "10-1"

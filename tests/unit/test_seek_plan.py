"""The seek plan per partition, for each kind of target, on plain values."""

from __future__ import annotations

import datetime

import pytest

from streamsub._core.seek import (
    END,
    PartitionPosition,
    PartitionSeek,
    is_snapshot_name,
    plan_seek,
    positions_from_json,
    positions_json,
    split_message_id,
)
from streamsub._core.streamid import MAX_SEQ
from streamsub._errors import InvalidArgumentError, InvalidTypeError


def test_time_moves_every_partition_to_just_before_that_millisecond() -> None:
    """A time seek puts every partition just before the first id of its millisecond."""
    moment = datetime.datetime.fromtimestamp(1700000000.5, tz=datetime.UTC)
    plans = plan_seek(moment, 3)
    assert plans == dict.fromkeys(range(3), PartitionSeek(f"1700000000499-{MAX_SEQ}"))


def test_earliest_and_latest() -> None:
    """'earliest' is the start of every partition, 'latest' the end."""
    assert plan_seek("earliest", 2) == dict.fromkeys(range(2), PartitionSeek("0-0"))
    assert plan_seek("latest", 2) == dict.fromkeys(range(2), PartitionSeek(END))


def test_message_id_moves_its_partition_to_it_and_others_to_its_time() -> None:
    """A message id seek starts its partition at that message, the others at its time."""
    plans = plan_seek("1-1700000000000-3", 3)
    assert plans[1] == PartitionSeek("1700000000000-2")
    assert plans[0] == plans[2] == PartitionSeek(f"1699999999999-{MAX_SEQ}")


def test_snapshot_restores_positions_and_pending() -> None:
    """A snapshot seek goes back to each partition's position and redelivers its pending ids."""
    positions = {0: PartitionPosition("5-0", ("3-0", "4-0")), 1: PartitionPosition("0-0", ())}
    plans = plan_seek("snap", 2, positions)
    assert plans == {0: PartitionSeek("5-0", ("3-0", "4-0")), 1: PartitionSeek("0-0", ())}
    assert positions_from_json(positions_json(positions)) == positions


@pytest.mark.parametrize("bad", ["x-1-0", "1", "1-abc", "-1-0", "7-1-0"])
def test_bad_message_ids_are_refused(bad: str) -> None:
    """Malformed message ids, or ones naming a partition the topic lacks, raise."""
    with pytest.raises(InvalidArgumentError):
        plan_seek(bad, 4)


def test_naive_datetimes_and_other_types_are_refused() -> None:
    """A datetime without time zone and a non-str, non-datetime target raise."""
    with pytest.raises(InvalidArgumentError, match="time zone"):
        plan_seek(datetime.datetime(2024, 1, 1), 1)
    with pytest.raises(InvalidTypeError):
        plan_seek(12.5, 1)


def test_snapshot_names_and_message_ids_are_told_apart() -> None:
    """Names start with a letter and are not earliest/latest; ids start with a digit."""
    assert is_snapshot_name("nightly")
    assert not is_snapshot_name("latest")
    assert not is_snapshot_name("earliest")
    assert not is_snapshot_name("3-1-0")
    assert split_message_id("3-1-0") == (3, "1-0")

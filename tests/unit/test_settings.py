"""Settings: frozen, keyword-only, every default as documented, bad values refused."""

from __future__ import annotations

import dataclasses
import math

import pytest

from streamsub._errors import InvalidArgumentError
from streamsub._settings import (
    DEFAULT_ACK_DEADLINE,
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    DEFAULT_PARTITIONS,
    MAX_PARTITIONS,
    BatchSettings,
    FlowControl,
    LimitExceededBehavior,
    Limits,
    PublishFlowControl,
    RetryPolicy,
)

SETTINGS = [FlowControl, BatchSettings, RetryPolicy, Limits, PublishFlowControl]

INTEGER_FIELDS = [
    (FlowControl, "max_messages"),
    (FlowControl, "max_bytes"),
    (BatchSettings, "max_messages"),
    (BatchSettings, "max_bytes"),
    (Limits, "max_message_bytes"),
    (PublishFlowControl, "message_limit"),
    (PublishFlowControl, "byte_limit"),
]
NUMBER_FIELDS = [
    (BatchSettings, "max_latency"),
    (RetryPolicy, "minimum_backoff"),
    (RetryPolicy, "maximum_backoff"),
]
ALL_FIELDS = INTEGER_FIELDS + NUMBER_FIELDS

NOT_POSITIVE = [0, -1, 0.0, -0.0, -1.5, math.nan, math.inf, -math.inf]
NOT_A_NUMBER = [None, "10", b"10", True, False, [1], 1j]


def _ids(value: object) -> str:
    return repr(value)


@pytest.mark.parametrize(("cls", "field"), ALL_FIELDS)
@pytest.mark.parametrize("value", NOT_POSITIVE, ids=_ids)
def test_non_positive_or_infinite_values_are_refused_naming_the_field(
    cls: type, field: str, value: float
) -> None:
    """Zero, negative, NaN and infinite values raise InvalidArgumentError naming Class.field."""
    with pytest.raises(InvalidArgumentError, match=rf"^{cls.__name__}\.{field} must be "):
        cls(**{field: value})


@pytest.mark.parametrize(("cls", "field"), ALL_FIELDS)
@pytest.mark.parametrize("value", NOT_A_NUMBER, ids=_ids)
def test_non_numbers_are_refused_naming_the_field(cls: type, field: str, value: object) -> None:
    """A value that is not a number (bools included) raises InvalidArgumentError naming it."""
    with pytest.raises(
        InvalidArgumentError, match=rf"^{cls.__name__}\.{field} must be a number, got "
    ):
        cls(**{field: value})


@pytest.mark.parametrize(("cls", "field"), INTEGER_FIELDS)
@pytest.mark.parametrize("value", [1.5, 1.0, 1e3], ids=_ids)
def test_integer_fields_refuse_floats(cls: type, field: str, value: float) -> None:
    """Counts and byte sizes must be whole numbers: a float is refused even if integral."""
    with pytest.raises(
        InvalidArgumentError, match=rf"^{cls.__name__}\.{field} must be a whole number"
    ):
        cls(**{field: value})


@pytest.mark.parametrize(("cls", "field"), ALL_FIELDS)
def test_error_message_shows_the_bad_value(cls: type, field: str) -> None:
    """The error quotes the value that was given."""
    with pytest.raises(InvalidArgumentError, match=r"got -7$"):
        cls(**{field: -7})


@pytest.mark.parametrize(("cls", "field"), INTEGER_FIELDS)
def test_integer_fields_accept_positive_ints(cls: type, field: str) -> None:
    """A positive int is accepted for a count or byte size, up to its limit if it
    has one (a message's size: test_limits_refuse_a_message_size_past_32_bit_lengths)."""
    large = 2**32 - 1 if (cls, field) == (Limits, "max_message_bytes") else 2**40
    assert getattr(cls(**{field: 1}), field) == 1
    assert getattr(cls(**{field: large}), field) == large


def test_number_fields_accept_ints_and_floats() -> None:
    """Durations accept positive ints and floats."""
    assert BatchSettings(max_latency=1).max_latency == 1
    assert BatchSettings(max_latency=1e-6).max_latency == 1e-6
    policy = RetryPolicy(minimum_backoff=1, maximum_backoff=2.5)
    assert (policy.minimum_backoff, policy.maximum_backoff) == (1, 2.5)


def test_retry_policy_refuses_maximum_below_minimum() -> None:
    """maximum_backoff below minimum_backoff is refused, naming maximum_backoff."""
    with pytest.raises(
        InvalidArgumentError, match=r"^RetryPolicy\.maximum_backoff must be >= minimum_backoff"
    ):
        RetryPolicy(minimum_backoff=20.0, maximum_backoff=10.0)


def test_retry_policy_refuses_a_default_maximum_below_a_large_minimum() -> None:
    """Raising minimum_backoff past the default maximum (600 s) alone is refused."""
    with pytest.raises(InvalidArgumentError, match="maximum_backoff must be >= minimum_backoff"):
        RetryPolicy(minimum_backoff=601.0)


def test_retry_policy_allows_maximum_equal_to_minimum() -> None:
    """maximum_backoff equal to minimum_backoff is a constant backoff, allowed."""
    assert RetryPolicy(minimum_backoff=5.0, maximum_backoff=5.0).maximum_backoff == 5.0


def test_flow_control_defaults_are_as_documented() -> None:
    """FlowControl defaults to 1000 messages and 100 MiB, as its docstring says."""
    assert FlowControl() == FlowControl(max_messages=1000, max_bytes=100 * 2**20)
    assert "(default 1000)" in (FlowControl.__doc__ or "")
    assert "(default 100 MiB)" in (FlowControl.__doc__ or "")


def test_batch_settings_defaults_are_as_documented() -> None:
    """BatchSettings defaults to 1000 messages, 1 MiB and 5 ms, as its docstring says."""
    assert BatchSettings() == BatchSettings(max_messages=1000, max_bytes=2**20, max_latency=0.005)
    doc = BatchSettings.__doc__ or ""
    assert "(default 1000)" in doc
    assert "(default 1 MiB)" in doc
    assert "(default 0.005 s)" in doc


def test_retry_policy_defaults_are_as_documented() -> None:
    """RetryPolicy defaults to Pub/Sub's 10 s and 600 s, as its docstring says."""
    assert RetryPolicy() == RetryPolicy(minimum_backoff=10.0, maximum_backoff=600.0)
    assert "10 s and 600 s" in (RetryPolicy.__doc__ or "")


def test_limits_defaults_are_as_documented() -> None:
    """Limits defaults to Pub/Sub's 10 MB message size, as its docstring says."""
    assert Limits().max_message_bytes == 10_000_000
    assert "(default 10 MB" in (Limits.__doc__ or "")


def test_module_defaults() -> None:
    """The named module defaults have the values their docstrings explain."""
    assert DEFAULT_PARTITIONS == 16
    assert MAX_PARTITIONS == 1024
    assert DEFAULT_PARTITIONS <= MAX_PARTITIONS
    assert DEFAULT_ACK_DEADLINE == 30.0
    assert DEFAULT_MAX_DELIVERY_ATTEMPTS == 5


@pytest.mark.parametrize("cls", SETTINGS)
def test_settings_are_keyword_only(cls: type) -> None:
    """Settings take keyword arguments only, so call sites say what each number is."""
    with pytest.raises(TypeError):
        cls(1)


@pytest.mark.parametrize("cls", SETTINGS)
def test_settings_are_frozen(cls: type) -> None:
    """Settings cannot be changed after construction."""
    settings = cls()
    field = dataclasses.fields(settings)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, field, 1)


@pytest.mark.parametrize("cls", SETTINGS)
def test_replace_revalidates(cls: type) -> None:
    """dataclasses.replace checks the new values too."""
    field = dataclasses.fields(cls)[0].name
    with pytest.raises(InvalidArgumentError, match=rf"{cls.__name__}\.{field}"):
        dataclasses.replace(cls(), **{field: 0})


@pytest.mark.parametrize("cls", SETTINGS)
def test_settings_are_hashable_values(cls: type) -> None:
    """Equal settings compare and hash equal, so they can key caches."""
    assert cls() == cls()
    assert hash(cls()) == hash(cls())


def test_publish_flow_control_defaults_are_as_documented() -> None:
    """PublishFlowControl defaults to 10,000 messages, 10 MiB and BLOCK, as documented."""
    assert PublishFlowControl() == PublishFlowControl(
        message_limit=10_000,
        byte_limit=10 * 2**20,
        limit_exceeded_behavior=LimitExceededBehavior.BLOCK,
    )
    doc = PublishFlowControl.__doc__ or ""
    assert "(default 10,000)" in doc
    assert "(default 10 MiB" in doc
    assert "(default ``BLOCK``)" in doc


@pytest.mark.parametrize("value", ["block", "BLOCK", None, 1], ids=_ids)
def test_publish_flow_control_refuses_a_behaviour_that_is_not_the_enum(value: object) -> None:
    """limit_exceeded_behavior must be a LimitExceededBehavior; the error lists the choices."""
    with pytest.raises(
        InvalidArgumentError,
        match=r"^PublishFlowControl\.limit_exceeded_behavior must be a LimitExceededBehavior "
        r"\(BLOCK, ERROR or IGNORE\)",
    ):
        PublishFlowControl(limit_exceeded_behavior=value)  # type: ignore[arg-type]


def test_limit_exceeded_behavior_has_pubsubs_names() -> None:
    """The behaviours are Pub/Sub's BLOCK, ERROR and IGNORE, as strings."""
    assert [b.name for b in LimitExceededBehavior] == ["BLOCK", "ERROR", "IGNORE"]
    assert LimitExceededBehavior.ERROR == "error"


def test_limits_refuse_a_message_size_past_32_bit_lengths() -> None:
    """Limits.max_message_bytes goes up to 2**32 - 1, the most a message's
    32-bit lengths can carry, and refuses more with an error that says so."""
    assert Limits(max_message_bytes=2**32 - 1).max_message_bytes == 2**32 - 1
    with pytest.raises(InvalidArgumentError, match=r"at most 4294967295 .*32-bit"):
        Limits(max_message_bytes=2**32)

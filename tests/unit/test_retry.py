"""Backoff before a nacked message is delivered again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsub._core.retry import backoff
from streamsub._settings import RetryPolicy


def test_no_policy_redelivers_at_once() -> None:
    """Without a retry policy a nacked message is redelivered with no delay."""
    assert backoff(None, 1) == 0.0
    assert backoff(None, 1000) == 0.0


def test_first_attempt_waits_minimum_backoff() -> None:
    """A message nacked on its first delivery waits minimum_backoff."""
    assert backoff(RetryPolicy(minimum_backoff=10.0, maximum_backoff=600.0), 1) == 10.0


def test_backoff_doubles_with_each_attempt() -> None:
    """The n-th attempt waits minimum_backoff * 2**(n-1)."""
    policy = RetryPolicy(minimum_backoff=1.5, maximum_backoff=1000.0)
    assert [backoff(policy, n) for n in range(1, 7)] == [1.5, 3.0, 6.0, 12.0, 24.0, 48.0]


def test_backoff_is_capped_at_maximum() -> None:
    """Once doubling passes maximum_backoff the wait stays at maximum_backoff."""
    policy = RetryPolicy(minimum_backoff=10.0, maximum_backoff=600.0)
    assert [backoff(policy, n) for n in range(5, 10)] == [160.0, 320.0, 600.0, 600.0, 600.0]


def test_attempt_zero_or_below_waits_minimum_backoff() -> None:
    """An attempt count below one (unknown) is treated as the first attempt."""
    policy = RetryPolicy(minimum_backoff=2.0, maximum_backoff=60.0)
    assert backoff(policy, 0) == 2.0
    assert backoff(policy, -5) == 2.0


def test_equal_minimum_and_maximum_is_a_constant_backoff() -> None:
    """With minimum_backoff == maximum_backoff every attempt waits the same."""
    policy = RetryPolicy(minimum_backoff=5.0, maximum_backoff=5.0)
    assert {backoff(policy, n) for n in range(1, 100)} == {5.0}


@pytest.mark.parametrize("attempt", [64, 65, 66, 1024, 1025, 1100, 10**6, 2**63, 10**100])
def test_large_attempts_do_not_overflow(attempt: int) -> None:
    """A huge delivery attempt count gives maximum_backoff rather than an OverflowError."""
    policy = RetryPolicy(minimum_backoff=10.0, maximum_backoff=600.0)
    assert backoff(policy, attempt) == 600.0


def test_huge_backoffs_do_not_overflow() -> None:
    """Doubling a very large minimum backoff caps at maximum rather than overflowing."""
    policy = RetryPolicy(minimum_backoff=1e300, maximum_backoff=1e308)
    assert backoff(policy, 60) == 1e308


@given(
    minimum=st.floats(min_value=1e-3, max_value=1e6),
    spread=st.floats(min_value=1.0, max_value=1e6),
    attempt=st.integers(min_value=1, max_value=10_000),
)
def test_backoff_follows_the_documented_formula(
    minimum: float, spread: float, attempt: int
) -> None:
    """backoff is min(maximum, minimum * 2**(attempt-1)) for any policy and attempt."""
    policy = RetryPolicy(minimum_backoff=minimum, maximum_backoff=minimum * spread)
    delay = backoff(policy, attempt)
    assert policy.minimum_backoff <= delay <= policy.maximum_backoff
    exact = min(policy.maximum_backoff, policy.minimum_backoff * 2.0 ** min(attempt - 1, 1023))
    assert delay == pytest.approx(exact)


@given(
    minimum=st.floats(min_value=1e-3, max_value=1e3),
    attempt=st.integers(min_value=1, max_value=200),
)
def test_backoff_never_decreases_with_attempts(minimum: float, attempt: int) -> None:
    """A later attempt never waits less than an earlier one."""
    policy = RetryPolicy(minimum_backoff=minimum, maximum_backoff=minimum * 1e4)
    assert backoff(policy, attempt + 1) >= backoff(policy, attempt)

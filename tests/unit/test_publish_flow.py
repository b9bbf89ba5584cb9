"""The publisher's bookkeeping with plain values: its flow-control budget and its
paused ordering keys."""

from __future__ import annotations

import random

import pytest

from streamsub._core.publish_flow import PausedKeys, PublishBudget
from streamsub._settings import LimitExceededBehavior, PublishFlowControl


def _budget(
    messages: int = 10,
    size: int = 1000,
    behavior: LimitExceededBehavior = LimitExceededBehavior.BLOCK,
) -> PublishBudget:
    return PublishBudget(
        PublishFlowControl(
            message_limit=messages, byte_limit=size, limit_exceeded_behavior=behavior
        )
    )


def test_a_call_fits_up_to_each_limit_and_not_past_it() -> None:
    """A call fits while outstanding plus the call stays within both limits, exactly."""
    budget = _budget()
    budget.take(4, 400)
    assert budget.fits(6, 600)
    assert not budget.fits(7, 10)
    assert not budget.fits(1, 601)
    assert budget.over(6, 600) is None
    assert "message_limit (10)" in (budget.over(7, 10) or "")
    assert "byte_limit (1000)" in (budget.over(1, 601) or "")


def test_a_call_larger_than_the_limit_fits_only_when_nothing_is_outstanding() -> None:
    """A call over a whole limit goes alone: it fits at zero outstanding, never beside others."""
    budget = _budget()
    assert budget.fits(50, 5000)
    budget.take(1, 1)
    assert not budget.fits(50, 5000)
    budget.release(1, 1)
    assert budget.fits(50, 5000)
    assert budget.over(50, 5000) is not None  # what ERROR refuses, even alone


def test_ignore_fits_everything() -> None:
    """With IGNORE every call fits, however much is outstanding."""
    budget = _budget(behavior=LimitExceededBehavior.IGNORE)
    budget.take(1000, 10**6)
    assert budget.fits(1000, 10**6)


def test_outstanding_is_what_was_taken_minus_what_was_released() -> None:
    """Over many random takes and releases the counts stay exact and never go negative,
    and a release of more than was taken is refused."""
    rng = random.Random(7)
    budget = _budget(messages=100, size=10_000)
    held: list[tuple[int, int]] = []
    for _ in range(2000):
        if held and rng.random() < 0.5:
            budget.release(*held.pop(rng.randrange(len(held))))
        else:
            call = (rng.randint(1, 5), rng.randint(0, 500))
            if budget.fits(*call):
                budget.take(*call)
                held.append(call)
        assert (budget.messages, budget.bytes) == (
            sum(m for m, _ in held),
            sum(b for _, b in held),
        )
        assert budget.messages <= 100 or len(held) == 1
    with pytest.raises(AssertionError, match="released more than taken"):
        budget.release(budget.messages + 1, 0)


def test_keys_pause_and_resume_one_by_one() -> None:
    """Pausing records keys (no key is never paused), reports the new ones, and resume
    un-pauses exactly the one named."""
    paused = PausedKeys()
    assert paused.pause(["a", None, "b", "a"]) == {"a", "b"}
    assert paused.pause(["b", "c"]) == {"c"}
    assert len(paused) == 3
    assert None not in paused
    assert paused.first_paused([None, "x", "c", "a"]) == "c"
    assert paused.first_paused([None, "x"]) is None
    assert paused.resume("a")
    assert not paused.resume("a")
    assert "a" not in paused
    assert "b" in paused
    assert paused.first_paused(["a"]) is None


def test_many_keys_pause_independently() -> None:
    """Of a thousand keys, pausing every third leaves exactly those paused, and resuming
    them all leaves none."""
    paused = PausedKeys()
    keys = [f"k{i}" for i in range(1000)]
    paused.pause(keys[::3])
    assert [k for k in keys if k in paused] == keys[::3]
    for key in keys:
        paused.resume(key)
    assert len(paused) == 0

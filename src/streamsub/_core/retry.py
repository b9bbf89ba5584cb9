"""Backoff before a nacked message is delivered again."""

from __future__ import annotations

from .._settings import RetryPolicy

__all__ = ["backoff"]


def backoff(policy: RetryPolicy | None, delivery_attempt: int) -> float:
    """Seconds to wait before redelivering a message nacked on ``delivery_attempt``.

    No policy means at once. Otherwise ``minimum_backoff * 2**(attempt-1)``,
    capped at ``maximum_backoff``.
    """
    if policy is None:
        return 0.0
    exponent = max(0, delivery_attempt - 1)
    if exponent > 64:  # 2**64 * any backoff is past every maximum
        return policy.maximum_backoff
    return min(policy.maximum_backoff, policy.minimum_backoff * 2.0**exponent)

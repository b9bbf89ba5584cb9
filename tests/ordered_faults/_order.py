"""Shared by the review-7c tests: a per-key check stricter than first handlings.

Pub/Sub's ordered delivery: when a message is delivered again, every later
message of its key that was delivered before is delivered again after it. The
issue's order test says the same in its words: a redelivery is allowed, and "no
later message of that key is handled before it". So, per key, once n was
handled, a handling of m < n must be followed again by n."""

from __future__ import annotations

from tests.ordered_faults._keys import Journal


def regressions(journal: Journal) -> dict[str, list[int]]:
    """Keys whose handlings go back to an earlier message and then never handle
    again a later one handled before: {key: the handling sequence (first 30)}."""
    per_key: dict[str, list[int]] = {}
    with journal.lock:
        for key, n, _, _ in journal.records:
            per_key.setdefault(key, []).append(n)
    wrong = {}
    for key, seq in per_key.items():
        for i, n in enumerate(seq):
            before = {m for m in seq[:i] if m > n}
            after = set(seq[i + 1 :])
            if before - after:
                wrong[key] = seq[:30]
                break
    return wrong

"""Shared by the ordered fault tests of sweeps: a per-key check stricter than
first handlings, a handler that holds one message open, and a recorder of the
sweeps a subscriber sends for partitions not surely its own.

Pub/Sub's ordered delivery: when a message is delivered again, every later
message of its key that was delivered before is delivered again after it. The
issue's order test says the same in its words: a redelivery is allowed, and "no
later message of that key is handled before it". So, per key, once n was
handled, a handling of m < n must be followed again by n."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import streamsub
from tests.ordered_faults._keys import Journal, index


def holding(
    journal: Journal, who: str, held: int, gate: asyncio.Event, *, attempts: int = 1
) -> Callable[[streamsub.Message], Awaitable[None]]:
    """A handler that journals as ``who`` and holds message ``held`` of each key
    open until ``gate`` is set, on its first ``attempts`` deliveries."""

    async def handle(message: streamsub.Message) -> None:
        journal.enter(message, who)
        if index(message) == held and message.delivery_attempt <= attempts:
            await gate.wait()
        journal.leave(message)

    return handle


def record_unowned_sweeps(
    client: streamsub.Client,
    subscriber: streamsub.Subscriber,
    record: Callable[[tuple[Any, ...], dict[str, Any], dict[int, int]], None],
) -> None:
    """Call ``record(args, kwargs, surely_owned)`` for each sweep (``reclaim``)
    ``subscriber`` sends through ``client`` that names a partition not surely
    its own by its clock."""
    backend = client._backend
    real_reclaim = backend.reclaim

    async def reclaim(*args: Any, **kwargs: Any) -> Any:
        receiver = subscriber._last
        owner = receiver._owner if receiver is not None else None
        if owner is not None and not set(args[3]) <= set(owner.surely_owned()):
            record(args, kwargs, owner.surely_owned())
        return await real_reclaim(*args, **kwargs)

    backend.reclaim = reclaim  # type: ignore[method-assign]


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

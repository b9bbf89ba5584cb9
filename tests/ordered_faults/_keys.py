"""Shared by the ordered-subscription fault tests: an ordered topic, keyed messages ``key:n``, and
a journal of handlings checked per key."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import streamsub


async def ordered(
    client: streamsub.Client,
    *,
    partitions: int,
    topic: str = "orders",
    subscription: str = "billing",
    backoff: float | None = None,
    **settings: Any,
) -> None:
    """``topic`` and its ordered subscription ``subscription`` (with a fixed nack
    backoff of ``backoff`` seconds, if given)."""
    await client.create_topic(topic, partitions=partitions)
    if backoff is not None:
        settings["retry_policy"] = streamsub.RetryPolicy(
            minimum_backoff=backoff, maximum_backoff=backoff
        )
    await client.create_subscription(
        subscription, topic=topic, enable_message_ordering=True, **settings
    )


def keyed(keys: list[str], first: int, last: int) -> list[streamsub.OutgoingMessage]:
    """Messages ``key:first`` .. ``key:last-1`` of every key, keys interleaved."""
    return [
        streamsub.OutgoingMessage(data=f"{key}:{n}".encode(), ordering_key=key)
        for n in range(first, last)
        for key in keys
    ]


async def publish_rounds(
    client: streamsub.Client,
    keys: list[str],
    stored: set[tuple[str, int]],
    stop: asyncio.Event,
    topic: str = "orders",
    *,
    again: bool = False,
) -> None:
    """Publish round after round (message n of every key, one ``publish_many``
    a round, 20 ms apart) until ``stop`` is set, adding each stored round to
    ``stored``; on a failed round (maybe partly stored) set ``stop`` and
    publish no more, or, with ``again``, resume its keys and publish it again
    as a user would (a message may then be stored twice)."""
    n = 0
    while not stop.is_set():
        try:
            await client.publish_many(topic, keyed(keys, n, n + 1))
        except (streamsub.BackendError, streamsub.OrderingKeyPausedError):
            if not again:
                stop.set()
                return
            for key in keys:
                client.resume_publish(topic, key)
            await asyncio.sleep(0.1)
            continue
        stored.update((key, n) for key in keys)
        n += 1
        await asyncio.sleep(0.02)


def index(message: streamsub.Message) -> int:
    """The n of a message published as ``key:n``."""
    return int(message.data.split(b":")[1])


class Journal:
    """Handlings in the order they started: (key, n, attempt, who), thread-safe;
    and how many handlers of one key ran at once, at most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[tuple[str, int, int, str]] = []
        self.active: collections.Counter[str] = collections.Counter()
        self.most_at_once_per_key = 0

    def enter(self, message: streamsub.Message, who: str = "") -> None:
        key = message.ordering_key or ""
        with self.lock:
            self.records.append((key, index(message), message.delivery_attempt, who))
            self.active[key] += 1
            self.most_at_once_per_key = max(self.most_at_once_per_key, self.active[key])

    def leave(self, message: streamsub.Message) -> None:
        with self.lock:
            self.active[message.ordering_key or ""] -= 1

    def handler(
        self, who: str, pause: float = 0.001
    ) -> Callable[[streamsub.Message], Awaitable[None]]:
        """A handler that journals its handlings as ``who``, each taking ``pause`` s."""

        async def handle(message: streamsub.Message) -> None:
            self.enter(message, who)
            await asyncio.sleep(pause)
            self.leave(message)

        return handle

    def gated(
        self, who: str, gate: asyncio.Event, held: Callable[[streamsub.Message], bool]
    ) -> Callable[[streamsub.Message], Awaitable[None]]:
        """A handler that journals its handlings as ``who`` and, for messages
        ``held`` picks, waits (up to 30 s) for ``gate`` before returning."""

        async def handle(message: streamsub.Message) -> None:
            self.enter(message, who)
            try:
                if held(message):
                    async with asyncio.timeout(30):
                        await gate.wait()
            finally:
                self.leave(message)

        return handle

    def distinct(self) -> int:
        with self.lock:
            return len({(key, n) for key, n, _, _ in self.records})

    def first_handlings(self) -> dict[str, list[int]]:
        """Per key, the n of each message in the order first handled."""
        seen: set[tuple[str, int]] = set()
        order: dict[str, list[int]] = collections.defaultdict(list)
        with self.lock:
            for key, n, _, _ in self.records:
                if (key, n) not in seen:
                    seen.add((key, n))
                    order[key].append(n)
        return dict(order)

    def out_of_order(self, count: int) -> dict[str, list[int]]:
        """Keys whose first handlings are not 0 .. count-1 in order (the first 12)."""
        wrong = {k: v for k, v in self.first_handlings().items() if v != list(range(count))}
        return {k: wrong[k][:12] for k in list(wrong)[:5]}

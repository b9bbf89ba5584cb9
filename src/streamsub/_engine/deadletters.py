"""Dead-letter tools: list, replay and purge what a subscription dead-lettered.

A subscription's dead letters are the entries of its dead-letter topic whose
``streamsub.source_subscription`` attribute names it (several subscriptions
may share one dead-letter topic). Listing reads entries without delivering
them; replay claims them (so concurrent replays never publish one twice),
publishes copies (original data, ordering key and attributes) to the source
topic or another, then deletes the dead letters; purge deletes
them. Deleting acknowledges them in every subscription of the dead-letter
topic first, so none is left holding an id that is gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence

from .._backends.base import Backend, TopicRecord
from .._core import deadletter as meta
from .._core.codec import UndecodableEntry, decode
from .._core.deadletter import undecodable_data
from .._core.seek import split_message_id
from .._core.streamid import parse_id
from .._message import OutgoingMessage

__all__ = [
    "MAX_DEAD_LETTER_SCAN",
    "REPLAY_CLAIM_TTL",
    "DeadLetter",
    "find_dead_letters",
    "original_message",
    "purge",
    "replay",
    "scan_dead_letters",
]

REPLAY_CLAIM_TTL = 60.0
"""Seconds a replay's claim on a dead letter lasts (server clock): long enough to
publish a page and delete it; after a crash the dead letter can be replayed
again once it has passed."""
MAX_DEAD_LETTER_SCAN = 1_000_000
"""Entries of a dead-letter topic one call reads at most, per partition."""
log = logging.getLogger("streamsub")

_PAGE = 1000
"""Entries read per round trip."""
_PREFIX = "streamsub."


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered message: what it held, and where and why it failed."""

    message_id: str
    """Its id in the dead-letter topic."""
    data: bytes
    ordering_key: str | None
    attributes: Mapping[str, str]
    """The original attributes (the ``streamsub.*`` metadata is in the fields below)."""
    source_topic: str | None
    source_subscription: str | None
    source_message_id: str | None
    delivery_attempts: int | None
    reason: str | None
    first_delivery: datetime.datetime | None
    last_delivery: datetime.datetime | None


def _ms(value: str | None) -> datetime.datetime | None:
    if value is None or not value.isdigit():
        return None
    return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.UTC)


def _dead_letter(message_id: str, fields: Sequence[bytes]) -> DeadLetter:
    try:
        decoded = decode(fields)
    except UndecodableEntry as exc:
        return DeadLetter(
            message_id, undecodable_data(fields), None, {}, None, None, None, None,
            f"{meta.UNDECODABLE}: {exc.reason}", None, None,
        )  # fmt: skip
    attributes = decoded.attributes
    attempts = attributes.get(meta.ATTEMPTS)
    return DeadLetter(
        message_id=message_id,
        data=decoded.data,
        ordering_key=decoded.ordering_key,
        attributes={k: v for k, v in attributes.items() if not k.startswith(_PREFIX)},
        source_topic=attributes.get(meta.SOURCE_TOPIC),
        source_subscription=attributes.get(meta.SOURCE_SUBSCRIPTION),
        source_message_id=attributes.get(meta.SOURCE_MESSAGE_ID),
        delivery_attempts=int(attempts) if attempts and attempts.isdigit() else None,
        reason=attributes.get(meta.REASON),
        first_delivery=_ms(attributes.get(meta.FIRST_DELIVERY_MS)),
        last_delivery=_ms(attributes.get(meta.LAST_DELIVERY_MS)),
    )


def _order(letter: DeadLetter) -> tuple[tuple[int, int], int]:
    partition, entry_id = split_message_id(letter.message_id)
    return parse_id(entry_id), partition


async def scan_dead_letters(
    backend: Backend,
    dead_letter_topic: TopicRecord,
    subscription: str,
    *,
    message_ids: Collection[str] | None = None,
    per_partition: int | None = None,
) -> AsyncIterator[list[DeadLetter]]:
    """The subscription's dead letters (only ``message_ids`` when given), a page of
    at most ``_PAGE`` entries read at a time, partition after partition, each
    partition oldest first, at most ``per_partition`` from each (None: all)."""
    wanted = None if message_ids is None else set(message_ids)
    for partition in range(dead_letter_topic.partitions):
        if wanted is not None and not any(i.startswith(f"{partition}-") for i in wanted):
            continue
        after, read, matches = "0-0", 0, 0
        while read < MAX_DEAD_LETTER_SCAN and (per_partition is None or matches < per_partition):
            page = await backend.read_range(dead_letter_topic, partition, after, _PAGE)
            found = []
            for entry_id, fields in page:
                letter = _dead_letter(f"{partition}-{entry_id}", fields)
                if letter.source_subscription != subscription:
                    continue
                if wanted is not None and letter.message_id not in wanted:
                    continue
                found.append(letter)
            matches += len(found)
            if found:
                yield found
            read += len(page)
            if len(page) < _PAGE:
                break
            after = page[-1][0]


async def find_dead_letters(
    backend: Backend,
    dead_letter_topic: TopicRecord,
    subscription: str,
    *,
    limit: int,
    message_ids: Collection[str] | None = None,
) -> list[DeadLetter]:
    """The subscription's oldest ``limit`` dead letters (only ``message_ids`` when given)."""
    found: list[DeadLetter] = []
    async for page in scan_dead_letters(
        backend, dead_letter_topic, subscription, message_ids=message_ids, per_partition=limit
    ):
        found += page
    found.sort(key=_order)
    return found[:limit]


def original_message(letter: DeadLetter) -> OutgoingMessage:
    """The message as it was first published."""
    return OutgoingMessage(
        data=letter.data, ordering_key=letter.ordering_key, attributes=dict(letter.attributes)
    )


async def replay(
    backend: Backend,
    dead_letter_topic: TopicRecord,
    subscription: str,
    publish: Callable[[str, list[OutgoingMessage]], Awaitable[list[str]]],
    *,
    to: str | None,
    message_ids: Collection[str] | None,
    claim_ttl: float = REPLAY_CLAIM_TTL,
) -> int:
    """Publish each dead letter's original message to ``to`` (None: its source
    topic), then delete it, a page at a time; return how many this call
    replayed.

    Each page is first claimed in one atomic step per partition (a claim
    expires after ``claim_ttl`` seconds of the server's clock) and only the
    dead letters won are published: replays running at once, or a retry, never
    publish one twice. A crash after the claim and before the delete leaves the
    dead letter claimed; once the claim expires a later replay publishes it
    again, so a message is published at most once more per crash — duplicated,
    never lost.
    """
    replayed = 0
    async for page in scan_dead_letters(
        backend, dead_letter_topic, subscription, message_ids=message_ids
    ):
        page = [letter for letter in page if (to or letter.source_topic) is not None]
        won = await backend.claim_entries(dead_letter_topic, _ids(page), claim_ttl)
        ours = {f"{p}-{entry_id}" for p, entry_ids in won.items() for entry_id in entry_ids}
        by_topic: dict[str, list[DeadLetter]] = {}
        for letter in page:
            target = to or letter.source_topic
            if target is not None and letter.message_id in ours:
                by_topic.setdefault(target, []).append(letter)
        for target, batch in by_topic.items():
            await publish(target, [original_message(letter) for letter in batch])
            replayed += len(batch)
            await _delete(backend, dead_letter_topic, batch)
            log.info(
                "streamsub: replayed %d dead letters from %r to %r",
                len(batch),
                dead_letter_topic.name,
                target,
            )
    return replayed


async def purge(
    backend: Backend,
    dead_letter_topic: TopicRecord,
    subscription: str,
    *,
    message_ids: Collection[str] | None,
) -> int:
    """Delete the subscription's dead letters (only ``message_ids`` when given), a
    page at a time; return how many."""
    deleted = 0
    async for page in scan_dead_letters(
        backend, dead_letter_topic, subscription, message_ids=message_ids
    ):
        deleted += await _delete(backend, dead_letter_topic, page)
    if deleted:
        log.info("streamsub: deleted %d dead letters from %r", deleted, dead_letter_topic.name)
    return deleted


def _ids(letters: Sequence[DeadLetter]) -> dict[int, list[str]]:
    ids: dict[int, list[str]] = {}
    for letter in letters:
        partition, entry_id = split_message_id(letter.message_id)
        ids.setdefault(partition, []).append(entry_id)
    return ids


async def _delete(
    backend: Backend, dead_letter_topic: TopicRecord, letters: Sequence[DeadLetter]
) -> int:
    return await backend.delete_entries(dead_letter_topic, _ids(letters))

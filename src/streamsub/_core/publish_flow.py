"""The publisher's bookkeeping: its flow-control budget and its paused ordering keys.

Pure values in, decisions out; the engine (``_engine/publisher.py``) waits,
raises and writes.

**Budget.** A message is *outstanding* from its ``publish`` call until its id is
known or its publish failed. :class:`PublishBudget` counts outstanding messages
and bytes against ``PublishFlowControl`` and decides, for a whole call at once
(so ``publish_many`` is all or nothing), whether it is admitted now. A call that
finds nothing outstanding is always admitted: a call larger than a whole limit
then goes alone, so ``BLOCK`` can never deadlock.

**Paused keys.** :class:`PausedKeys` remembers the ordering keys whose publish
failed: until resumed, every later publish with one of them is refused, so a
key's later messages never overtake an earlier failed one.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._settings import LimitExceededBehavior, PublishFlowControl

__all__ = ["PausedKeys", "PublishBudget"]


class PublishBudget:
    """Outstanding messages and bytes of one client, against its limits."""

    __slots__ = ("_byte_limit", "_ignore", "_message_limit", "_settings", "bytes", "messages")

    def __init__(self, settings: PublishFlowControl) -> None:
        self._settings = settings
        self._ignore = settings.limit_exceeded_behavior is LimitExceededBehavior.IGNORE
        self._message_limit = settings.message_limit
        self._byte_limit = settings.byte_limit
        self.messages = 0
        self.bytes = 0

    @property
    def settings(self) -> PublishFlowControl:
        return self._settings

    def fits(self, messages: int, size: int) -> bool:
        """Whether a call of ``messages`` and ``size`` bytes may start now.

        Always true when nothing is outstanding (a call larger than the limit
        then goes alone) and always true with ``IGNORE``.
        """
        if self._settings.limit_exceeded_behavior is LimitExceededBehavior.IGNORE:
            return True
        if self.messages == 0 and self.bytes == 0:
            return True
        return self.over(messages, size) is None

    def over(self, messages: int, size: int) -> str | None:
        """Which limit a call would go past if admitted now, as words; None if none."""
        settings = self._settings
        if self.messages + messages > settings.message_limit:
            return (
                f"message_limit ({settings.message_limit}): {self.messages} outstanding, "
                f"this call adds {messages}"
            )
        if self.bytes + size > settings.byte_limit:
            return (
                f"byte_limit ({settings.byte_limit}): {self.bytes} bytes outstanding, "
                f"this call adds {size}"
            )
        return None

    def try_take(self, messages: int, size: int) -> bool:
        """:meth:`take` the call if it :meth:`fits`, in one step; return whether it did."""
        # Within both limits first: the common case, asked on every publish.
        after, size_after = self.messages + messages, self.bytes + size
        if (
            (after > self._message_limit or size_after > self._byte_limit)
            and not self._ignore
            and (self.messages or self.bytes)
        ):
            return False
        self.messages, self.bytes = after, size_after
        return True

    def take(self, messages: int, size: int) -> None:
        """Count an admitted call as outstanding."""
        self.messages += messages
        self.bytes += size

    def release(self, messages: int, size: int) -> None:
        """Messages stored or failed: no longer outstanding."""
        self.messages -= messages
        self.bytes -= size
        if self.messages < 0 or self.bytes < 0:
            raise AssertionError(f"released more than taken: {self.messages}, {self.bytes}")


class PausedKeys:
    """The ordering keys of one topic paused by a failed publish."""

    __slots__ = ("_paused",)

    def __init__(self) -> None:
        self._paused: set[str] = set()

    @property
    def keys(self) -> set[str]:
        """The paused keys (read only; empty, and false, when none is paused)."""
        return self._paused

    def __len__(self) -> int:
        return len(self._paused)

    def __contains__(self, key: object) -> bool:
        return key in self._paused

    def pause(self, keys: Iterable[str | None]) -> set[str]:
        """Pause ``keys`` (None, no key, is never paused); return the newly paused."""
        new = {key for key in keys if key is not None and key not in self._paused}
        self._paused |= new
        return new

    def first_paused(self, keys: Iterable[str | None]) -> str | None:
        """The first of ``keys`` that is paused, if any."""
        if not self._paused:
            return None
        for key in keys:
            if key is not None and key in self._paused:
                return key
        return None

    def resume(self, key: str) -> bool:
        """Un-pause ``key``; return whether it was paused."""
        if key in self._paused:
            self._paused.discard(key)
            return True
        return False

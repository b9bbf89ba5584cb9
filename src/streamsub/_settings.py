"""Frozen, keyword-only settings, each default named and documented here.

The names follow Google Cloud Pub/Sub's client (``FlowControl``,
``BatchSettings``, ``RetryPolicy``) so its users find what they know. Every
limit is explicit: exceeding one is back-pressure or an error, never loss.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from ._errors import InvalidArgumentError

__all__ = [
    "DEFAULT_ACK_DEADLINE",
    "DEFAULT_MAX_DELIVERY_ATTEMPTS",
    "DEFAULT_PARTITIONS",
    "MAX_MESSAGE_BYTES",
    "MAX_PARTITIONS",
    "BatchSettings",
    "Durability",
    "FlowControl",
    "LimitExceededBehavior",
    "Limits",
    "PublishFlowControl",
    "RetryPolicy",
]

DEFAULT_PARTITIONS = 16
"""Partitions of a new topic: enough for 16 subscribers to share the work."""
MAX_PARTITIONS = 1024
"""More partitions cost a stream each and make every read wider."""
MAX_MESSAGE_BYTES = 2**32 - 1
"""The most ``Limits.max_message_bytes`` may be: a message's parts are written
with 32-bit lengths."""
DEFAULT_ACK_DEADLINE = 30.0
"""Seconds a delivered message may sit without ack or lease extension (Pub/Sub: 10)."""
DEFAULT_MAX_DELIVERY_ATTEMPTS = 5
"""Pub/Sub's default for dead-letter policies."""


def _positive(owner: str, name: str, value: float, *, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{owner}.{name} must be a number, got {value!r}")
    if integer and not isinstance(value, int):
        raise InvalidArgumentError(f"{owner}.{name} must be a whole number, got {value!r}")
    if not value > 0 or math.isinf(value):
        raise InvalidArgumentError(f"{owner}.{name} must be a finite number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FlowControl:
    """How much a subscriber holds at once, and for how long (Pub/Sub's names).

    ``max_messages`` (default 1000) and ``max_bytes`` (default 100 MiB) bound
    the messages read and not yet acked, nacked or dead-lettered, and their
    data. Reading pauses when either is reached and resumes once both are
    below 80 %. A single message larger than ``max_bytes`` still runs, alone,
    so that it cannot block the subscription. ``max_lease_duration`` (default
    1 hour) is how long a message's lease is extended while its handler runs;
    after that another subscriber may take it.
    """

    max_messages: int = 1000
    max_bytes: int = 100 * 2**20
    max_lease_duration: float = 3600.0

    def __post_init__(self) -> None:
        _positive("FlowControl", "max_messages", self.max_messages, integer=True)
        _positive("FlowControl", "max_bytes", self.max_bytes, integer=True)
        _positive("FlowControl", "max_lease_duration", self.max_lease_duration)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BatchSettings:
    """When the publisher writes a batch.

    Batching is adaptive: while none of the topic's writes is in flight, what
    is queued is written at once (a lone ``publish`` waits for no timer, nor
    does a ``publish_many``); while writes are in flight, messages gather into
    the next batch, which goes out when one comes back or at the first limit
    reached. ``max_messages`` (default 1000) and ``max_bytes`` (default 1 MiB)
    bound a batch; ``max_latency`` (default 0.005 s) is a ceiling on how long a
    message waits for companions behind writes in flight, never a floor. A
    batch is one server-side script call per partition, so larger batches cost
    fewer round trips.
    """

    max_messages: int = 1000
    max_bytes: int = 2**20
    max_latency: float = 0.005

    def __post_init__(self) -> None:
        _positive("BatchSettings", "max_messages", self.max_messages, integer=True)
        _positive("BatchSettings", "max_bytes", self.max_bytes, integer=True)
        _positive("BatchSettings", "max_latency", self.max_latency)


class LimitExceededBehavior(enum.StrEnum):
    """What ``publish`` does when :class:`PublishFlowControl`'s limits are reached
    (the names are Pub/Sub's)."""

    BLOCK = "block"
    """Wait, behind the publish calls that came first, until there is room."""
    ERROR = "error"
    """Raise :class:`~streamsub.FlowControlLimitError` at once; nothing of the call is written."""
    IGNORE = "ignore"
    """No bound: count, but never wait or refuse."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PublishFlowControl:
    """How much one client may have published and not yet stored or failed.

    A message counts, with its encoded bytes, from the ``publish`` call until
    its id is known or its publish failed. The limits hold per client, across
    all its topics (as Pub/Sub's, per publisher client). ``message_limit``
    (default 10,000) and ``byte_limit`` (default 10 MiB: ten default batches)
    bound it; ``limit_exceeded_behavior`` (default ``BLOCK``) says what a
    publish that would go past either does.

    The default is a bounded, blocking publisher, unlike Pub/Sub's ``IGNORE``:
    publishing faster than Redis stores would otherwise grow the process's
    memory without end. With ``BLOCK``, one call larger than a whole limit
    waits until nothing else is outstanding and then goes alone (Pub/Sub
    raises instead), so it can neither deadlock nor fail; with ``ERROR`` it
    always raises.
    """

    message_limit: int = 10_000
    byte_limit: int = 10 * 2**20
    limit_exceeded_behavior: LimitExceededBehavior = LimitExceededBehavior.BLOCK

    def __post_init__(self) -> None:
        _positive("PublishFlowControl", "message_limit", self.message_limit, integer=True)
        _positive("PublishFlowControl", "byte_limit", self.byte_limit, integer=True)
        if not isinstance(self.limit_exceeded_behavior, LimitExceededBehavior):
            raise InvalidArgumentError(
                "PublishFlowControl.limit_exceeded_behavior must be a "
                f"LimitExceededBehavior (BLOCK, ERROR or IGNORE), got "
                f"{self.limit_exceeded_behavior!r}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Backoff before a nacked message is delivered again (seconds).

    The n-th redelivery waits ``minimum_backoff * 2**(n-1)``, capped at
    ``maximum_backoff`` (Pub/Sub's defaults: 10 s and 600 s).
    """

    minimum_backoff: float = 10.0
    maximum_backoff: float = 600.0

    def __post_init__(self) -> None:
        _positive("RetryPolicy", "minimum_backoff", self.minimum_backoff)
        _positive("RetryPolicy", "maximum_backoff", self.maximum_backoff)
        if self.maximum_backoff < self.minimum_backoff:
            raise InvalidArgumentError(
                "RetryPolicy.maximum_backoff must be >= minimum_backoff, got "
                f"{self.maximum_backoff!r} < {self.minimum_backoff!r}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Hard limits on what is published.

    ``max_message_bytes`` (default 10 MB, as Pub/Sub) bounds a message's data
    plus its ordering key and attributes, as encoded; at most 2**32 - 1
    (``MAX_MESSAGE_BYTES``: a message's parts are written with 32-bit lengths;
    Redis itself refuses an argument over its ``proto-max-bulk-len``, 512 MB
    by default).
    """

    max_message_bytes: int = 10_000_000

    def __post_init__(self) -> None:
        _positive("Limits", "max_message_bytes", self.max_message_bytes, integer=True)
        if self.max_message_bytes > MAX_MESSAGE_BYTES:
            raise InvalidArgumentError(
                f"Limits.max_message_bytes is at most {MAX_MESSAGE_BYTES} (a message's "
                f"parts are written with 32-bit lengths), got {self.max_message_bytes}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Durability:
    """When ``publish`` returns: once Redis took the batch (the default), once
    ``replicas`` replicas of the partition's master hold it too, and, with
    ``fsync``, once every copy counted is on disk.

    The wait is one command sent right behind the batch on the same
    connection, so it covers exactly what was written before it:

    - ``Durability()`` (``replicas=0``): nothing waited for. Survives a crash
      of the Redis process when the server runs ``appendonly yes`` with
      ``appendfsync always`` (``everysec``, Redis's default with AOF, may lose
      the last second); not a power loss with ``everysec``, not the loss of the
      machine, not a failover to a replica that had not caught up.
    - ``Durability(replicas=1)``: ``WAIT 1 timeout``: a replica holds the
      batch in memory. Also survives the loss of the master's machine and a
      failover (manual, or a master killed) to that replica, while one copy at
      a time is lost; not both machines losing power within a second
      (``everysec``). Costs about a round trip per batch.
    - ``Durability(fsync=True)``: ``WAITAOF 1 0 timeout``: the master's
      append-only file is fsynced (with ``appendfsync always`` at once, with
      ``everysec`` at the next fsync; with ``appendfsync no`` never, so every
      publish times out). Survives a crash of the process or a power loss of
      its machine with the disk intact; not the disk's loss, not a failover.
    - ``Durability(replicas=1, fsync=True)``: ``WAITAOF 1 1 timeout``: the
      master and that replica both have the batch fsynced to their AOF.
      Survives all of the above, also both machines losing power at once. The
      replica must run ``appendonly yes`` (one without AOF never counts).
      Slow: on Valkey 9.1 a ``WAITAOF`` with a replica takes about a second
      (the replica reports its fsync once a second). At most one is
      outstanding per connection, and it covers every batch sent before it,
      so a batch waits one to two seconds for it however many are in flight
      (never more than ``timeout`` in all: the next one waits what remains of
      the earliest batch's);
      a topic has 4 batches in flight, so with the default batches a topic
      publishes about 2,000 msgs/s (measured: eight ``publish_many`` of 1,000
      messages at once took 4 s each).

    ``fsync`` needs ``WAITAOF`` (Redis or Valkey 7.2+) and ``appendonly yes``
    on every master: ``connect`` checks both and raises
    :class:`~streamsub.FailedPreconditionError` saying what to change, never
    weakening the guarantee quietly (a client not entered with ``async with``
    finds out at its first publish). If fewer copies confirm within
    ``timeout`` seconds (default 5), the publish raises
    :class:`~streamsub.UnavailableError`: the messages are stored on the master
    but may be lost if it fails now (publishing them again may duplicate them).
    Each master's wait judges the partitions it stores: on a Redis Cluster, a
    master left without a replica (its own replica promoted after a failover)
    fails the publishes to its partitions only, not those the other masters'
    replicas confirmed, though they were in the same batch.
    ``timeout`` must stay below the connection's socket timeout (10 s by
    default). ``replicas``: 0 to 100.
    """

    replicas: int = 0
    fsync: bool = False
    timeout: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise InvalidArgumentError(f"Durability.replicas must be an int, got {self.replicas!r}")
        if not 0 <= self.replicas <= 100:
            raise InvalidArgumentError(
                f"Durability.replicas must be from 0 to 100, got {self.replicas!r}"
            )
        if not isinstance(self.fsync, bool):
            raise InvalidArgumentError(
                f"Durability.fsync must be True or False, got {self.fsync!r}"
            )
        _positive("Durability", "timeout", self.timeout)

    @property
    def waits(self) -> bool:
        """Whether a publish waits for anything beyond the master's reply."""
        return self.fsync or self.replicas > 0

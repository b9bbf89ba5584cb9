"""The client: the one object users hold, a thin face over engine and backend."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import itertools
import logging
import os
import socket
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Literal, Self

from . import tracing
from ._backends.base import (
    PARKED_CONSUMER,
    Backend,
    GroupInfo,
    PartitionNode,
    SnapshotRecord,
    SubscriptionRecord,
    TopicRecord,
)
from ._core.codec import Encoded, encode, encode_data
from ._core.names import check_name
from ._core.retention import DEFAULT_RETENTION_INTERVAL, Retention, RetentionResult
from ._core.seek import SeekResult, Snapshot, is_snapshot_name
from ._core.stats import Stats
from ._engine import deadletters
from ._engine.deadletters import DeadLetter
from ._engine.dispatcher import DEFAULT_HANDLER_THREADS
from ._engine.publisher import PublishGate, TopicPublisher
from ._engine.receiver import AckMode, Handler, Receiver, ReceiverStatistics
from ._engine.seek import seek, take_snapshot
from ._engine.stats import collect_stats
from ._engine.trimmer import Trimmer, enforce_retention, is_dead_letter_topic, live_snapshots
from ._errors import (
    AlreadyExistsError,
    ClosedError,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidTypeError,
    NotFoundError,
    StreamsubError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from ._message import OutgoingMessage
from ._settings import (
    DEFAULT_ACK_DEADLINE,
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    DEFAULT_PARTITIONS,
    MAX_PARTITIONS,
    BatchSettings,
    Durability,
    FlowControl,
    Limits,
    PublishFlowControl,
    RetryPolicy,
)

__all__ = [
    "DEFAULT_URL",
    "Client",
    "PartitionNode",
    "Subscriber",
    "Subscription",
    "SubscriptionStats",
    "Topic",
    "connect",
]

DEFAULT_URL = "redis://localhost:6379/0"
"""Used when neither an argument nor STREAMSUB_URL names a server."""
DEFAULT_MAX_LEASE_DURATION = 3600.0
"""Pub/Sub's default: a message is extended for at most an hour."""
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
"""How long leaving ``subscribe()`` waits for running handlers."""
DEFAULT_CONSUMER_EXPIRY = 3600.0
"""A consumer idle this long with nothing pending is deleted from the group."""

Start = Literal["latest", "earliest"]

log = logging.getLogger("streamsub")


@dataclasses.dataclass(frozen=True, slots=True)
class Topic:
    """A topic: its name, partition count, creation time and retention policy."""

    name: str
    partitions: int
    created: datetime.datetime
    retention: Retention | None = None
    """None: every message is kept until the topic is deleted."""


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription and its settings."""

    name: str
    topic: str
    created: datetime.datetime
    start: Start
    ack_deadline: float
    max_delivery_attempts: int
    dead_letter_topic: str | None
    retry_policy: RetryPolicy | None
    enable_message_ordering: bool
    enable_exactly_once_delivery: bool


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """Counts of a subscription over all partitions, read from the server."""

    subscription: str
    topic: str
    messages: int
    """Entries in the topic's streams (acknowledged or not, until trimmed)."""
    pending: int
    """Delivered and not yet acknowledged."""
    lag: int | None
    """Published and not yet delivered (None when the server cannot tell)."""
    consumers: int
    partitions: tuple[GroupInfo, ...]
    owners: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)
    """Ordered subscriptions: partition -> (owning subscriber, fencing token), for
    the partitions a live subscriber owns."""


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def _topic(record: TopicRecord) -> Topic:
    return Topic(record.name, record.partitions, _utc(record.created), record.retention)


def _subscription(record: SubscriptionRecord) -> Subscription:
    s = record.settings
    retry = s.get("retry_policy")
    return Subscription(
        name=record.name,
        topic=record.topic,
        created=_utc(record.created),
        start=s["start"],  # type: ignore[arg-type]
        ack_deadline=float(s["ack_deadline"]),  # type: ignore[arg-type]
        max_delivery_attempts=int(s["max_delivery_attempts"]),  # type: ignore[call-overload]
        dead_letter_topic=s.get("dead_letter_topic"),  # type: ignore[arg-type]
        retry_policy=RetryPolicy(**retry) if isinstance(retry, dict) else None,
        enable_message_ordering=bool(s.get("enable_message_ordering")),
        enable_exactly_once_delivery=bool(s.get("enable_exactly_once_delivery")),
    )


def _snapshot(record: SnapshotRecord) -> Snapshot:
    return Snapshot(
        record.name, record.subscription, record.topic, _utc(record.created), _utc(record.expires)
    )


def _check_retention(retention: object) -> None:
    if retention is not None and not isinstance(retention, Retention):
        raise InvalidTypeError(
            f"retention must be a streamsub.Retention or None, got {retention!r}"
        )


_subscriber_numbers = itertools.count(1)


def _default_consumer() -> str:
    """``host-pid-n``: the same for the n-th subscriber of a process every time it
    starts, unique among the live ones (a consumer name must be)."""
    return f"{socket.gethostname()}-{os.getpid()}-{next(_subscriber_numbers)}"


def connect(
    url: str | None = None,
    *,
    batch_settings: BatchSettings | None = None,
    publish_flow_control: PublishFlowControl | None = None,
    limits: Limits | None = None,
    backend: Backend | None = None,
    trim_in_background: bool = True,
    retention_interval: float = DEFAULT_RETENTION_INTERVAL,
    socket_timeout: float | None = None,
    ssl_ca_certs: str | os.PathLike[str] | None = None,
    durability: Durability | None = None,
) -> Client:
    """A client for the server at ``url`` (default: ``$STREAMSUB_URL``, else
    ``redis://localhost:6379/0``); use it as ``async with connect(...) as client``.

    URLs: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS,
    ``unix:///path/to/redis.sock``; Redis Cluster:
    ``redis+cluster://[user:password@]host:port[,host:port...]`` (any nodes to
    discover it from), ``rediss+cluster://`` for TLS. Pass ``backend`` to use
    another backend.
    With ``trim_in_background`` (default True) the client enforces the
    retention of the topics it publishes to and of the subscriptions it
    subscribes to (their topics and dead-letter topics) every
    ``retention_interval`` seconds (default 5), one client per topic at a time.

    ``batch_settings`` says when a batch is written; ``publish_flow_control``
    bounds what the client's publishes have outstanding, across its topics
    (default: 10,000 messages or 10 MiB, then ``publish`` waits for room).

    ``socket_timeout`` (default 10 s) is how long a command waits for its
    reply before the connection counts as dead: a ``publish`` on a connection
    gone silent raises :class:`UnavailableError` about that long after it was
    called. Keep it above 5 s if this client subscribes (a subscriber's reads
    block up to that long). ``ssl_ca_certs`` is the CA file that signed a
    ``rediss://`` server's certificate (or ``?ssl_ca_certs=/path`` in the URL).
    ``durability`` (default: none) makes ``publish`` return only once that
    many replicas of the partition's master hold the messages (:class:`Durability`).
    """
    if backend is None:
        from ._backends.redis import RedisBackend, RedisClusterBackend
        from ._backends.redis._backend import SOCKET_TIMEOUT

        url = url or os.environ.get("STREAMSUB_URL") or DEFAULT_URL
        on_cluster = url.partition("://")[0].lower() in ("redis+cluster", "rediss+cluster")
        backend = (RedisClusterBackend if on_cluster else RedisBackend)(
            url,
            socket_timeout=SOCKET_TIMEOUT if socket_timeout is None else socket_timeout,
            ssl_ca_certs=None if ssl_ca_certs is None else os.fspath(ssl_ca_certs),
            durability=durability,
        )
    elif socket_timeout is not None or ssl_ca_certs is not None or durability is not None:
        raise InvalidArgumentError(
            "socket_timeout, ssl_ca_certs and durability configure the Redis connection; "
            "with backend=..., set them on the backend instead"
        )
    return Client(
        backend,
        batch_settings=batch_settings,
        publish_flow_control=publish_flow_control,
        limits=limits,
        trim_in_background=trim_in_background,
        retention_interval=retention_interval,
    )


class Client:
    """Topics, subscriptions, publishing and subscribing on one backend."""

    def __init__(
        self,
        backend: Backend,
        *,
        batch_settings: BatchSettings | None = None,
        publish_flow_control: PublishFlowControl | None = None,
        limits: Limits | None = None,
        trim_in_background: bool = True,
        retention_interval: float = DEFAULT_RETENTION_INTERVAL,
    ) -> None:
        if (
            isinstance(retention_interval, bool)
            or not isinstance(retention_interval, int | float)
            or not 0 < retention_interval <= 3600
        ):
            raise InvalidArgumentError(
                f"retention_interval must be seconds > 0 and <= 3600, got {retention_interval!r}"
            )
        self._backend = backend
        self._trimmer = (
            Trimmer(backend, interval=retention_interval) if trim_in_background else None
        )
        self._batch_settings = batch_settings or BatchSettings()
        if publish_flow_control is not None and not isinstance(
            publish_flow_control, PublishFlowControl
        ):
            raise InvalidTypeError(
                "publish_flow_control must be a streamsub.PublishFlowControl, got "
                f"{type(publish_flow_control).__name__}"
            )
        self._publish_gate = PublishGate(publish_flow_control or PublishFlowControl())
        self._limits = limits or Limits()
        self._max_bytes = self._limits.max_message_bytes
        self._publishers: dict[str, TopicPublisher] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        """The closes of publishers whose topic was deleted under them."""
        self._lookups: dict[str, asyncio.Future[TopicPublisher]] = {}
        self._handoffs: dict[str, int] = {}
        """Per topic: callers waiting on its lookup or behind those, not yet resumed."""
        self._arriving = 0
        """Publish calls between their topic's lookup and their messages queued: a
        close waits for them (they were called before it)."""
        self._arrived = asyncio.Event()
        self._subscribers: set[Subscriber] = set()
        self._closed = False

    @property
    def url(self) -> str:
        """The server's URL, without password."""
        return self._backend.url

    async def __aenter__(self) -> Self:
        await self._backend.ping()
        await self._check_server()
        return self

    async def _check_server(self) -> None:
        info = await self._backend.server_info()
        if info.maxmemory_policy not in (None, "noeviction"):
            log.warning(
                "streamsub: Redis at %s has maxmemory-policy %s: when memory is full it "
                "deletes whole keys, so topics vanish with their subscriptions; set it to "
                "noeviction and bound memory with streamsub.Retention",
                self.url,
                info.maxmemory_policy,
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop subscribers, write what publishers hold, and close connections.

        Everything stops at once, so this takes as long as the slowest: a
        subscriber's ``shutdown_timeout + SHUTDOWN_MARGIN``, or a publish still
        being written (at most the socket timeout on a dead connection).
        """
        if self._closed:
            return
        self._closed = True
        # Publishes called before the close and still looking their topic up
        # (the first ones of a topic wait for its record) queue their messages
        # first, so that the publishers' close writes them too.
        while self._arriving:
            self._arrived.clear()
            await self._arrived.wait()
        await asyncio.gather(
            *([self._trimmer.aclose()] if self._trimmer is not None else []),
            *(subscriber.stop() for subscriber in list(self._subscribers)),
            *(publisher.aclose() for publisher in self._publishers.values()),
            *list(self._retiring),
        )
        await self._backend.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the client is closed; create a new one with streamsub.connect()")

    # --- topics ----------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        retention: Retention | None = None,
    ) -> Topic:
        """Create a topic with ``partitions`` partitions (default 16) and a
        ``retention`` policy (default None: keep every message).

        Creating an existing topic with the same settings does nothing; with
        another partition count, or another retention given explicitly, it raises
        :class:`AlreadyExistsError`. Without ``retention`` an existing topic keeps
        the policy it has (operators may have changed it with
        :meth:`update_topic_retention`, which also removes one).
        """
        self._check_open()
        check_name("topic", name)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidTypeError(f"partitions must be an int, got {type(partitions).__name__}")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgumentError(
                f"partitions must be 1 to {MAX_PARTITIONS}, got {partitions}"
            )
        _check_retention(retention)
        wanted = TopicRecord(name, partitions, "", time.time(), retention)
        stored = await self._backend.create_topic(wanted)
        if stored.partitions != partitions:
            raise AlreadyExistsError(
                f"topic {name!r} exists with partitions={stored.partitions}, not {partitions}; "
                "use the existing count or another name"
            )
        if retention is not None and stored.retention != retention:
            raise AlreadyExistsError(
                f"topic {name!r} exists with retention={stored.retention!r}, not {retention!r}; "
                "change it with update_topic_retention()"
            )
        return _topic(stored)

    async def _topic_record(self, name: str) -> TopicRecord:
        check_name("topic", name)
        record = await self._backend.get_topic(name)
        if record is None:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist: create it with create_topic({name!r}) "
                f"or `streamsub topic create {name}`"
            )
        return record

    async def get_topic(self, name: str) -> Topic:
        """The topic ``name``; raises :class:`TopicNotFoundError` if there is none."""
        self._check_open()
        return _topic(await self._topic_record(name))

    async def locate_partitions(self, topic: str) -> list[PartitionNode]:
        """Per partition of ``topic``, in order, the server that holds it now:
        on Redis Cluster the master serving the partition's slot (``host:port``
        and node id, as the cluster says at this moment: a failover or a slot
        move changes it), on one server that server."""
        self._check_open()
        return await self._backend.locate_partitions(await self._topic_record(topic))

    async def list_topics(self) -> list[Topic]:
        """Every topic, sorted by name."""
        self._check_open()
        return [_topic(r) for r in await self._backend.list_topics()]

    async def delete_topic(self, name: str, *, force: bool = False) -> None:
        """Delete a topic and its messages.

        A topic with subscriptions is deleted only with ``force=True``, which
        deletes those subscriptions too.
        """
        self._check_open()
        record = await self._topic_record(name)
        subscriptions = await self._backend.list_subscriptions(name)
        if subscriptions and not force:
            names = ", ".join(s.name for s in subscriptions)
            raise FailedPreconditionError(
                f"topic {name!r} has subscriptions ({names}); delete them first or pass force=True"
            )
        for subscription in subscriptions:
            await self._backend.delete_subscription(subscription, record)
        await self._backend.delete_topic(record)
        publisher = self._publishers.pop(name, None)
        if publisher is not None:
            await publisher.aclose()

    # --- subscriptions ---------------------------------------------------------
    async def create_subscription(
        self,
        name: str,
        *,
        topic: str,
        start: Start = "latest",
        ack_deadline: float = DEFAULT_ACK_DEADLINE,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        dead_letter_topic: str | None = None,
        retry_policy: RetryPolicy | None = None,
        enable_message_ordering: bool = False,
        enable_exactly_once_delivery: bool = False,
    ) -> Subscription:
        """Create a subscription on ``topic``: a consumer group on every partition.

        ``start="latest"`` (default) delivers messages published after now;
        ``"earliest"`` every message the topic still has. ``ack_deadline``
        (default 30 s) is how long a delivered message may go without ack or
        lease extension before another subscriber may take it. After
        ``max_delivery_attempts`` (default 5) a message goes to
        ``dead_letter_topic`` when there is one. Creating an existing
        subscription with the same settings does nothing; with others it raises
        :class:`AlreadyExistsError` naming the difference.
        """
        self._check_open()
        check_name("subscription", name)
        settings = self._subscription_settings(
            start=start,
            ack_deadline=ack_deadline,
            max_delivery_attempts=max_delivery_attempts,
            dead_letter_topic=dead_letter_topic,
            retry_policy=retry_policy,
            enable_message_ordering=enable_message_ordering,
            enable_exactly_once_delivery=enable_exactly_once_delivery,
        )
        record = await self._topic_record(topic)
        if dead_letter_topic is not None:
            await self._topic_record(dead_letter_topic)
        existing = await self._backend.get_subscription(name)
        if existing is None:
            wanted = SubscriptionRecord(name, topic, time.time(), settings)
            existing = await self._backend.create_subscription(
                wanted, record, "$" if start == "latest" else "0"
            )
        differences = [
            f"{key}={existing.settings.get(key)!r} (asked {value!r})"
            for key, value in settings.items()
            if existing.settings.get(key) != value
        ]
        if existing.topic != topic:
            differences.insert(0, f"topic={existing.topic!r} (asked {topic!r})")
        if differences:
            raise AlreadyExistsError(
                f"subscription {name!r} exists with other settings: {', '.join(differences)}; "
                "delete it first or use another name"
            )
        return _subscription(existing)

    @staticmethod
    def _subscription_settings(
        *,
        start: object,
        ack_deadline: object,
        max_delivery_attempts: object,
        dead_letter_topic: object,
        retry_policy: object,
        enable_message_ordering: object,
        enable_exactly_once_delivery: object,
    ) -> dict[str, object]:
        if start not in ("latest", "earliest"):
            raise InvalidArgumentError(f"start must be 'latest' or 'earliest', got {start!r}")
        if (
            isinstance(ack_deadline, bool)
            or not isinstance(ack_deadline, int | float)
            or not 0.01 <= ack_deadline <= 3600
        ):
            raise InvalidArgumentError(
                f"ack_deadline must be seconds from 0.01 to 3600, got {ack_deadline!r}"
            )
        if (
            isinstance(max_delivery_attempts, bool)
            or not isinstance(max_delivery_attempts, int)
            or not 1 <= max_delivery_attempts <= 1000
        ):
            raise InvalidArgumentError(
                "max_delivery_attempts must be an int from 1 to 1000, "
                f"got {max_delivery_attempts!r}"
            )
        if dead_letter_topic is not None:
            check_name("dead-letter topic", dead_letter_topic)
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise InvalidTypeError(
                f"retry_policy must be a streamsub.RetryPolicy or None, got {retry_policy!r}"
            )
        for flag, value in (
            ("enable_message_ordering", enable_message_ordering),
            ("enable_exactly_once_delivery", enable_exactly_once_delivery),
        ):
            if not isinstance(value, bool):
                raise InvalidTypeError(f"{flag} must be a bool, got {value!r}")
        return {
            "start": start,
            "ack_deadline": float(ack_deadline),
            "max_delivery_attempts": max_delivery_attempts,
            "dead_letter_topic": dead_letter_topic,
            "retry_policy": None if retry_policy is None else dataclasses.asdict(retry_policy),
            "enable_message_ordering": enable_message_ordering,
            "enable_exactly_once_delivery": enable_exactly_once_delivery,
        }

    async def _subscription_record(self, name: str) -> SubscriptionRecord:
        check_name("subscription", name)
        record = await self._backend.get_subscription(name)
        if record is None:
            raise SubscriptionNotFoundError(
                f"subscription {name!r} does not exist: create it with "
                f"create_subscription({name!r}, topic=...) or `streamsub sub create`"
            )
        return record

    async def get_subscription(self, name: str) -> Subscription:
        """The subscription ``name``; raises :class:`SubscriptionNotFoundError`."""
        self._check_open()
        return _subscription(await self._subscription_record(name))

    async def list_subscriptions(self, topic: str | None = None) -> list[Subscription]:
        """Every subscription (of ``topic``), sorted by name."""
        self._check_open()
        return [_subscription(r) for r in await self._backend.list_subscriptions(topic)]

    async def delete_subscription(self, name: str) -> None:
        """Delete a subscription and its consumer groups (unacked messages stay in the topic)."""
        self._check_open()
        record = await self._subscription_record(name)
        topic = await self._backend.get_topic(record.topic)
        if topic is not None:
            await self._backend.delete_subscription(record, topic)

    async def subscription_stats(self, name: str) -> SubscriptionStats:
        """Messages, pending and lag of a subscription, summed over partitions."""
        self._check_open()
        record = await self._subscription_record(name)
        topic = await self._topic_record(record.topic)
        infos = await self._backend.group_info(topic, name)
        lags = [i.lag for i in infos]
        owners = {}
        if record.settings.get("enable_message_ordering"):
            owners = await self._backend.partition_owners(name)
        return SubscriptionStats(
            subscription=name,
            topic=topic.name,
            messages=sum(i.length for i in infos),
            pending=sum(i.pending for i in infos),
            lag=None if None in lags else sum(lag for lag in lags if lag is not None),
            consumers=max((i.consumers for i in infos), default=0),
            partitions=tuple(infos),
            owners=owners,
        )

    # --- publishing ------------------------------------------------------------
    async def _publisher(self, topic: str) -> TopicPublisher:
        """The topic's publisher. Concurrent first callers share one lookup and
        resume in the order they called, so they enqueue in call order.

        A caller that comes while those are still waking up (their wake-ups are
        queued on the loop) goes behind them, and so does one that comes after
        it: taking the publisher at once would enqueue its messages ahead of
        messages published before it.
        """
        publisher = self._publishers.get(topic)
        if publisher is not None:
            if self._handoffs.get(topic):
                self._handoffs[topic] += 1
                try:
                    await asyncio.sleep(0)  # the loop runs what was queued before
                finally:
                    self._handoff_done(topic)
            return publisher
        lookup = self._lookups.get(topic)
        if lookup is None:
            lookup = asyncio.get_running_loop().create_future()
            self._lookups[topic] = lookup
            try:
                record = await self._topic_record(topic)
            except BaseException as exc:
                lookup.set_exception(exc)
                lookup.exception()  # the first caller raises it; nobody else may wait
                raise
            else:
                publisher = TopicPublisher(
                    self._backend,
                    record,
                    self._batch_settings,
                    gate=self._publish_gate,
                    on_gone=self._forget_publisher,
                )
                self._publishers[topic] = publisher
                if self._trimmer is not None:
                    self._trimmer.watch_topic(topic)
                lookup.set_result(publisher)
            finally:
                del self._lookups[topic]
            return publisher
        self._handoffs[topic] = self._handoffs.get(topic, 0) + 1
        try:
            return await lookup
        finally:
            self._handoff_done(topic)

    def _handoff_done(self, topic: str) -> None:
        self._handoffs[topic] -= 1
        if not self._handoffs[topic]:
            del self._handoffs[topic]

    async def publish(
        self,
        topic: str,
        data: bytes,
        *,
        ordering_key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> str:
        """Publish one message; return its id once it is stored.

        Messages are batched with others published at the same time. If this
        raises a :class:`BackendError`, the message may or may not be stored,
        and its ``ordering_key`` is paused on this topic: later publishes with it
        raise :class:`OrderingKeyPausedError` until :meth:`resume_publish`.
        Waits for room, or raises :class:`FlowControlLimitError`, as the client's
        ``PublishFlowControl`` says.
        """
        if self._closed:  # _check_open(), its call spared on every publish
            self._check_open()
        if ordering_key is None and attributes is None and type(data) is bytes:
            # Data alone, the shape of most publishes: queued here, with no call
            # of its own, when nothing traces it and its publisher is at hand.
            publisher = self._publishers.get(topic)
            if (
                publisher is not None
                and len(data) <= self._max_bytes
                and topic not in self._handoffs
                and not tracing.active()
            ):
                future = publisher.submit_one(data)
                return await (future or self._publish_when_ready(topic, data))
        if tracing.active():
            with tracing.publish_span(topic, 1):
                attributes = tracing.inject(attributes)
                return await self._publish_one(topic, data, ordering_key, attributes)
        return await self._publish_one(topic, data, ordering_key, attributes)

    def _publish_one(
        self,
        topic: str,
        data: bytes,
        ordering_key: str | None,
        attributes: Mapping[str, str] | None,
    ) -> Awaitable[str]:
        """The message checked and, when the topic's publisher is at hand and
        flow control has room, queued at once: the future of its id (no
        coroutine of its own to run); else a coroutine that looks the
        publisher up or waits for room."""
        max_bytes = self._limits.max_message_bytes
        message: Encoded | bytes
        if type(data) is bytes and ordering_key is None and attributes is None:
            if len(data) > max_bytes:
                encode_data(data, max_bytes)  # raises MessageTooLargeError
            message = data  # data alone: to the batch's lane, packed with it as written
        else:
            message = encode(data, ordering_key, attributes, max_bytes=max_bytes)
        publisher = self._publishers.get(topic)
        if publisher is not None and topic not in self._handoffs:
            future = publisher.submit_one(message)
            if future is not None:
                return future
        return self._publish_when_ready(topic, message)

    async def _publish_when_ready(self, topic: str, message: Encoded | bytes) -> str:
        with self._on_the_way():
            publisher = await self._publisher(topic)
            future = publisher.submit_one(message)
        if future is not None:
            return await future
        max_bytes = self._limits.max_message_bytes
        encoded = encode_data(message, max_bytes) if isinstance(message, bytes) else message
        (message_id,) = await publisher.publish((encoded,))
        return message_id

    @contextlib.contextmanager
    def _on_the_way(self) -> Iterator[None]:
        """Count a publish call that looks its topic up until it has queued its
        messages (see :meth:`aclose`)."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1
            if not self._arriving:
                self._arrived.set()

    async def publish_many(
        self, topic: str, messages: Iterable[OutgoingMessage | bytes]
    ) -> list[str]:
        """Publish many messages (``OutgoingMessage`` or plain bytes); return their ids
        in order. Every message is checked before any is written, and flow
        control admits or refuses the call as a whole."""
        self._check_open()
        messages = list(messages)
        if tracing.active():
            with tracing.publish_span(topic, len(messages)):
                # The trace context of the publish span, the same for every message.
                return await self._publish_many(topic, messages, tracing.inject({}))
        return await self._publish_many(topic, messages, None)

    async def _publish_many(
        self,
        topic: str,
        messages: list[OutgoingMessage | bytes],
        context: Mapping[str, str] | None,
    ) -> list[str]:
        max_bytes = self._limits.max_message_bytes
        datas = None if context else _data_only(messages)
        if datas is not None:
            return await self._publish_data(topic, datas, max_bytes)
        encoded: list[Encoded] = []
        for index, message in enumerate(messages):
            try:
                if type(message) is bytes and not context:  # the common shapes first
                    encoded.append(encode_data(message, max_bytes))
                elif (
                    type(message) is OutgoingMessage
                    and type(message.data) is bytes
                    and message.ordering_key is None
                    and message.attributes is None
                    and not context
                ):
                    encoded.append(encode_data(message.data, max_bytes))
                elif isinstance(message, OutgoingMessage):
                    attributes = message.attributes
                    if context and tracing.can_carry(attributes):
                        attributes = {**(attributes or {}), **context}
                    encoded.append(
                        encode(message.data, message.ordering_key, attributes, max_bytes=max_bytes)
                    )
                elif context:
                    encoded.append(encode(message, None, context, max_bytes=max_bytes))
                else:
                    encoded.append(encode(message, max_bytes=max_bytes))
            except InvalidArgumentError as exc:
                raise type(exc)(f"message {index}: {exc}") from None
        if not encoded:
            return []
        with self._on_the_way():
            publisher = await self._publisher(topic)
            future = publisher.submit(encoded)
        return await (future if future is not None else publisher.publish(encoded))

    async def _publish_data(self, topic: str, datas: list[bytes], max_bytes: int) -> list[str]:
        """``publish_many`` of messages that are data alone: checked, then packed
        by the publisher as its writes go (see ``TopicPublisher.queue_data``)."""
        if not datas:
            return []
        sizes = [len(data) for data in datas]
        if max(sizes) > max_bytes:
            index = next(i for i, size in enumerate(sizes) if size > max_bytes)
            try:
                encode_data(datas[index], max_bytes)
            except InvalidArgumentError as exc:
                raise type(exc)(f"message {index}: {exc}") from None
        with self._on_the_way():
            publisher = await self._publisher(topic)
        return await (await publisher.queue_data(datas, sizes, sum(sizes)))

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        """Let publishes to ``topic`` with ``ordering_key`` go again after a failed
        publish paused them (as Pub/Sub's ``resume_publish``: a plain method, no I/O).

        Publish the failed messages again first to keep the key's order. A key
        that is not paused is left as it is.
        """
        if not isinstance(ordering_key, str) or not ordering_key:
            raise InvalidArgumentError(
                f"ordering_key must be a non-empty string, got {ordering_key!r}"
            )
        publisher = self._publishers.get(topic)
        if publisher is not None:
            publisher.resume(ordering_key)

    def _first_paused(self, topic: str, keys: Iterable[str | None]) -> str | None:
        """The first of ``keys`` that a failed publish paused on ``topic`` (safe to
        call from any thread: it only reads)."""
        publisher = self._publishers.get(topic)
        if publisher is None:
            return None
        return next((key for key in keys if key is not None and publisher.paused(key)), None)

    def _watch_pauses(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) whenever a failed publish pauses keys."""
        self._publish_gate.watch_pauses(callback)

    def _forget_publisher(self, publisher: TopicPublisher) -> None:
        """The topic was deleted under the publisher (it says so before the
        callers of the failed publishes resume): the next publish looks it up anew."""
        if self._publishers.get(publisher.topic.name) is publisher:
            del self._publishers[publisher.topic.name]
            closing = asyncio.get_running_loop().create_task(publisher.aclose())
            self._retiring.add(closing)  # kept, and awaited by aclose()
            closing.add_done_callback(self._retiring.discard)

    # --- subscribing -----------------------------------------------------------
    def subscribe(
        self,
        subscription: str,
        handler: Handler,
        *,
        flow_control: FlowControl | None = None,
        ack_mode: AckMode = "auto",
        consumer: str | None = None,
        max_lease_duration: float | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        consumer_expiry: float = DEFAULT_CONSUMER_EXPIRY,
        handler_threads: int = DEFAULT_HANDLER_THREADS,
    ) -> Subscriber:
        """Stream ``subscription`` to ``handler`` while the ``async with`` block runs.

        ``handler`` is ``async def`` (each call runs in an asyncio task that
        runs no other handler until it ends; see the README, "Receive") or plain
        ``def`` (run in a pool of ``handler_threads`` threads,
        default ``min(32, cpus + 4)``; an awaitable it returns is awaited).
        With ``ack_mode="auto"`` (default) a handler that returns acks and one
        that raises nacks; with ``"manual"`` the handler calls ``message.ack()``
        or ``message.nack()`` (plain calls, from any thread).
        ``flow_control`` bounds what is held at once (default 1000 messages,
        100 MiB) and how long: messages are leased while their handlers run, for
        at most its ``max_lease_duration`` (default 1 hour; the
        ``max_lease_duration`` argument is deprecated). ``consumer`` names this
        subscriber in the consumer group (default ``host-pid-n``, for the n-th
        subscriber of the process). Leaving the block waits up to
        ``shutdown_timeout`` (default 30 s) for running handlers, and at most
        ``SHUTDOWN_MARGIN`` seconds more in all. Consumers of the group idle for
        ``consumer_expiry`` (default 1 hour) that hold no message are deleted.

        If the subscription or its topic is deleted, the subscriber stops and
        leaving the block (or ``await subscriber.wait()``) raises
        :class:`SubscriptionNotFoundError`.
        """
        self._check_open()
        if not callable(handler):
            raise InvalidTypeError(f"handler must be callable, got {handler!r}")
        if ack_mode not in ("auto", "manual"):
            raise InvalidArgumentError(f"ack_mode must be 'auto' or 'manual', got {ack_mode!r}")
        if flow_control is not None and not isinstance(flow_control, FlowControl):
            raise InvalidTypeError(
                f"flow_control must be a streamsub.FlowControl, got {flow_control!r}"
            )
        flow_control = flow_control or FlowControl()
        if max_lease_duration is not None:
            warnings.warn(
                "subscribe(max_lease_duration=...) is deprecated: pass "
                "flow_control=streamsub.FlowControl(max_lease_duration=...)",
                DeprecationWarning,
                stacklevel=2,
            )
            flow_control = dataclasses.replace(flow_control, max_lease_duration=max_lease_duration)
        for name, value in (
            ("shutdown_timeout", shutdown_timeout),
            ("consumer_expiry", consumer_expiry),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidArgumentError(f"{name} must be seconds > 0, got {value!r}")
        if consumer == PARKED_CONSUMER:
            raise InvalidArgumentError(
                f"consumer {consumer!r} is reserved: delayed nacks wait parked under it"
            )
        if (
            isinstance(handler_threads, bool)
            or not isinstance(handler_threads, int)
            or handler_threads < 1
        ):
            raise InvalidArgumentError(
                f"handler_threads must be a whole number >= 1, got {handler_threads!r}"
            )
        if flow_control.max_lease_duration > DEFAULT_MAX_LEASE_DURATION:
            log.warning(
                "streamsub: max_lease_duration=%s s is over an hour: a stuck handler holds its "
                "message that long before another subscriber may take it",
                flow_control.max_lease_duration,
            )
        if self._trimmer is not None:
            self._trimmer.watch_subscription(subscription)
        return Subscriber(
            self,
            subscription,
            handler,
            flow_control=flow_control,
            ack_mode=ack_mode,
            consumer=consumer or _default_consumer(),
            shutdown_timeout=shutdown_timeout,
            consumer_expiry=consumer_expiry,
            handler_threads=handler_threads,
        )

    # --- operations: retention -------------------------------------------------
    async def update_topic_retention(self, name: str, retention: Retention | None) -> Topic:
        """Give topic ``name`` a new retention policy (None: keep everything);
        trimmers apply it from their next pass."""
        self._check_open()
        _check_retention(retention)
        record = await self._topic_record(name)
        await self._backend.set_retention(record, retention)
        return _topic(dataclasses.replace(record, retention=retention))

    async def enforce_retention(self, topic: str) -> RetentionResult:
        """Run one retention pass over ``topic`` now; return what it deleted per
        partition. It may overlap a background pass: each partition's trim is
        one atomic step, so nothing is deleted or counted twice."""
        self._check_open()
        record = await self._topic_record(topic)
        info = await self._backend.server_info()
        now = await self._backend.server_time()
        return await enforce_retention(
            self._backend,
            record,
            now=now,
            acked_trim=info.acked_trim,
            snapshots=await live_snapshots(self._backend, now),
            dead_letters=await is_dead_letter_topic(self._backend, record.name),
        )

    async def run_retention(self, *, interval: float = DEFAULT_RETENTION_INTERVAL) -> None:
        """Enforce the retention of every topic every ``interval`` seconds (default 5)
        until cancelled, one trimmer per topic across processes (a lock in Redis):
        what ``streamsub retention run`` does, for deployments that want trimming
        in a process of its own."""
        self._check_open()
        await Trimmer(self._backend, interval=interval, all_topics=True).run_forever()

    # --- operations: seek and snapshots ----------------------------------------
    async def seek(self, subscription: str, *, to: datetime.datetime | str) -> SeekResult:
        """Move ``subscription`` on every partition to ``to``: an aware ``datetime``,
        ``"earliest"``, ``"latest"``, a message id (``"<partition>-<ms>-<seq>"``)
        or a snapshot's name.

        As in Pub/Sub, messages before the point count as acknowledged and those
        at or after it as not acknowledged: every retained message published at
        or after the time (or the message) is delivered again. A snapshot seek
        goes back to the snapshot's position (its last delivered id per
        partition): the messages pending when it was taken and every message
        after that position are delivered again — those published after the
        snapshot and also those published before it that had not yet been
        delivered to the subscription — if retention has not removed them; the
        others count as acknowledged.
        """
        self._check_open()
        record = await self._subscription_record(subscription)
        topic = await self._topic_record(record.topic)
        snapshot = None
        if isinstance(to, str) and is_snapshot_name(to):
            snapshot = await self._snapshot_record(to)
            if snapshot.topic != record.topic:
                raise FailedPreconditionError(
                    f"snapshot {to!r} is of topic {snapshot.topic!r}; subscription "
                    f"{subscription!r} reads {record.topic!r}: seek only to a snapshot of its topic"
                )
        return await seek(self._backend, topic, subscription, to, snapshot)

    async def _snapshot_record(self, name: str) -> SnapshotRecord:
        check_name("snapshot", name)
        snapshot = await self._backend.get_snapshot(name)
        if snapshot is not None and snapshot.expires <= await self._backend.server_time():
            await self._backend.delete_snapshot(name)
            snapshot = None
        if snapshot is None:
            raise NotFoundError(
                f"snapshot {name!r} does not exist: create it with create_snapshot({name!r}, "
                "subscription) or `streamsub snapshot create`"
            )
        return snapshot

    async def create_snapshot(self, name: str, subscription: str) -> Snapshot:
        """Record ``subscription``'s acknowledgement state as snapshot ``name``: its
        position and pending messages on every partition (at most 100,000 pending
        per partition). For seven days, when it expires, it holds back its topic's
        retention (but not a ``drop_unacked`` hard cap), so that a seek to it
        finds every message it needs."""
        self._check_open()
        check_name("snapshot", name)
        if not is_snapshot_name(name):
            raise InvalidArgumentError(f"{name!r} is a seek target, not a snapshot name")
        record = await self._subscription_record(subscription)
        topic = await self._topic_record(record.topic)
        snapshot = await take_snapshot(self._backend, name, topic, subscription)
        return _snapshot(snapshot)

    async def get_snapshot(self, name: str) -> Snapshot:
        """The snapshot ``name``; raises :class:`NotFoundError` if there is none."""
        self._check_open()
        return _snapshot(await self._snapshot_record(name))

    async def list_snapshots(self) -> list[Snapshot]:
        """Every snapshot, sorted by name."""
        self._check_open()
        now = await self._backend.server_time()
        return [_snapshot(r) for r in await live_snapshots(self._backend, now)]

    async def delete_snapshot(self, name: str) -> None:
        """Delete snapshot ``name``; raises :class:`NotFoundError` if there is none."""
        self._check_open()
        check_name("snapshot", name)
        if not await self._backend.delete_snapshot(name):
            raise NotFoundError(f"snapshot {name!r} does not exist")

    # --- operations: dead letters ------------------------------------------------
    async def _dead_letter_topic(self, subscription: str) -> TopicRecord:
        record = await self._subscription_record(subscription)
        name = record.settings.get("dead_letter_topic")
        if not isinstance(name, str):
            raise FailedPreconditionError(
                f"subscription {subscription!r} has no dead-letter topic: nothing is "
                "dead-lettered from it"
            )
        return await self._topic_record(name)

    async def list_dead_letters(self, subscription: str, *, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` (default 100, at most 10,000) messages dead-lettered
        from ``subscription``, with their metadata, without delivering them."""
        self._check_open()
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidArgumentError(f"limit must be an int from 1 to 10000, got {limit!r}")
        topic = await self._dead_letter_topic(subscription)
        return await deadletters.find_dead_letters(self._backend, topic, subscription, limit=limit)

    async def get_dead_letter(self, subscription: str, message_id: str) -> DeadLetter:
        """One dead letter of ``subscription`` by its id in the dead-letter topic."""
        self._check_open()
        topic = await self._dead_letter_topic(subscription)
        found = await deadletters.find_dead_letters(
            self._backend, topic, subscription, limit=1, message_ids=[message_id]
        )
        if not found:
            raise NotFoundError(
                f"no dead letter {message_id!r} of subscription {subscription!r} in topic "
                f"{topic.name!r}"
            )
        return found[0]

    async def replay_dead_letters(
        self,
        subscription: str,
        *,
        to: str | None = None,
        message_ids: Iterable[str] | None = None,
    ) -> int:
        """Publish ``subscription``'s dead letters (all, or ``message_ids``) again to
        their source topic, or to topic ``to``, then delete them from the
        dead-letter topic; return how many this call published. Published to the
        source topic, they reach every subscription of it, as a new publish does.

        Each page is claimed first (in one atomic step; a claim lasts 60 s by
        the server's clock) and only what this call won is published, so two
        replays at once, or a retry, never publish a dead letter twice. After a
        crash between the claim and the delete, a replay once the claim expired
        publishes those again: at most one duplicate per crash, no loss."""
        self._check_open()
        topic = await self._dead_letter_topic(subscription)
        if to is not None:
            await self._topic_record(to)
        ids = None if message_ids is None else list(message_ids)
        return await deadletters.replay(
            self._backend, topic, subscription, self.publish_many, to=to, message_ids=ids
        )

    async def purge_dead_letters(
        self, subscription: str, *, message_ids: Iterable[str] | None = None
    ) -> int:
        """Delete ``subscription``'s dead letters (all, or ``message_ids``); return how many."""
        self._check_open()
        topic = await self._dead_letter_topic(subscription)
        ids = None if message_ids is None else list(message_ids)
        return await deadletters.purge(self._backend, topic, subscription, message_ids=ids)

    # --- operations: statistics --------------------------------------------------
    async def stats(self, topic: str | None = None) -> Stats:
        """Reports on every topic and subscription (or on ``topic`` and its
        subscriptions): per topic its length, memory, publish rate and retention
        losses; per subscription its backlog and pending per partition, oldest
        unacknowledged age, pending per consumer, delivery-attempt distribution
        (a sample) and dead-letter depth."""
        self._check_open()
        if topic is None:
            topics = await self._backend.list_topics()
            subscriptions = await self._backend.list_subscriptions()
        else:
            topics = [await self._topic_record(topic)]
            subscriptions = await self._backend.list_subscriptions(topic)
        names = {t.name for t in topics}
        subscriptions = [s for s in subscriptions if s.topic in names]
        now = await self._backend.server_time()  # ages by the server's clock, as ids are
        return await collect_stats(self._backend, topics, subscriptions, now=now)


class Subscriber:
    """A running subscription stream; leave its ``async with`` block to stop it."""

    def __init__(
        self,
        client: Client,
        subscription: str,
        handler: Handler,
        *,
        flow_control: FlowControl,
        ack_mode: AckMode,
        consumer: str,
        shutdown_timeout: float,
        consumer_expiry: float,
        handler_threads: int,
    ) -> None:
        self._client = client
        self._subscription = subscription
        self._handler = handler
        self._options = {
            "flow_control": flow_control,
            "ack_mode": ack_mode,
            "consumer": consumer,
            "consumer_expiry": consumer_expiry,
            "shutdown_timeout": shutdown_timeout,
            "handler_threads": handler_threads,
        }
        self.consumer = consumer
        self._receiver: Receiver | None = None
        self._last: Receiver | None = None

    async def start(self) -> None:
        """Start streaming (``async with`` does this)."""
        client = self._client
        client._check_open()
        record = await client._subscription_record(self._subscription)
        topic = await client._topic_record(record.topic)
        dead_letter_name = record.settings.get("dead_letter_topic")
        dead_letter_topic = None
        if isinstance(dead_letter_name, str):
            dead_letter_topic = await client._topic_record(dead_letter_name)
        self._receiver = self._last = Receiver(
            backend=client._backend,
            topic=topic,
            subscription=record,
            dead_letter_topic=dead_letter_topic,
            handler=self._handler,
            **self._options,  # type: ignore[arg-type]
        )
        self._receiver.start()
        client._subscribers.add(self)

    async def stop(self) -> None:
        """Stop reading, let handlers finish (up to shutdown_timeout), flush acks.
        Returns within shutdown_timeout plus ``SHUTDOWN_MARGIN`` seconds, even
        when Redis is gone."""
        receiver, self._receiver = self._receiver, None
        self._client._subscribers.discard(self)
        if receiver is not None:
            await receiver.stop()

    async def wait(self) -> None:
        """Wait until the subscriber stops: return after :meth:`stop`, raise the
        error (say :class:`SubscriptionNotFoundError`) that stopped it otherwise."""
        if self._last is None:
            raise ClosedError("the subscriber was never started")
        await self._last.wait()

    @property
    def error(self) -> StreamsubError | None:
        """The error that stopped the subscriber, if one did."""
        return None if self._last is None else self._last.error

    def statistics(self) -> ReceiverStatistics:
        """A snapshot of this subscriber's counters."""
        if self._last is None:
            raise ClosedError("the subscriber was never started")
        return self._last.statistics()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        if exc is None and self.error is not None:
            raise self.error


def _data_only(messages: list[OutgoingMessage | bytes]) -> list[bytes] | None:
    """The data of each of ``messages`` if every one is data alone (``bytes``, or
    an ``OutgoingMessage`` of ``bytes`` without ordering key and attributes),
    the shape of most ``publish_many`` calls; else None."""
    datas: list[bytes] = []
    append = datas.append
    for message in messages:
        if type(message) is bytes:
            append(message)
        elif (
            type(message) is OutgoingMessage
            and type(message.data) is bytes
            and message.ordering_key is None
            and message.attributes is None
        ):
            append(message.data)
        else:
            return None
    return datas

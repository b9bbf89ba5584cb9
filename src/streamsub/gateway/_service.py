"""google.pubsub.v1 Publisher and Subscriber, as plain request-to-response calls.

Each method takes a request message and returns the response message, raising
:class:`RpcError` with Pub/Sub's code; the gRPC, REST and gRPC-Web faces only
carry them. Admin and publishing go through :class:`streamsub.Client`; pulls,
acks and leases through the adapter (:mod:`._adapter`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

from .._backends.base import Backend, TopicRecord
from .._client import Client, Subscription
from .._core.retention import DEFAULT_RETENTION_INTERVAL, Retention
from .._core.seek import Snapshot
from .._engine.trimmer import Trimmer
from .._errors import (
    AlreadyExistsError,
    NotFoundError,
    StreamsubError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from .._message import OutgoingMessage
from .._settings import DEFAULT_MAX_DELIVERY_ATTEMPTS, RetryPolicy
from ._adapter import Adapter, Puller, Received, SubscriptionView
from ._names import from_native, project_prefix, to_native
from ._proto import Empty, pb
from ._status import Code, RpcError, already_exists, from_streamsub, not_found
from ._tasks import end_task

__all__ = ["PubSubService", "StreamSettings"]

log = logging.getLogger("streamsub.gateway")

DEFAULT_ACK_DEADLINE_SECONDS = 10
"""Pub/Sub's default ack deadline for a subscription created without one."""
_ACK_DEADLINE_RANGE = (10, 600)
_MODACK_RANGE = (0, 600)
_DEAD_LETTER_ATTEMPTS_RANGE = (5, 100)
_TOPIC_RETENTION_RANGE = (600, 31 * 86400)
"""Pub/Sub's bounds of a topic's message_retention_duration (10 minutes to 31 days)."""
_SHORTEST_BACKOFF = 0.001
"""A retry backoff of 0 (Pub/Sub: "as soon as possible") is stored as this."""
_PULL_BLOCK_MS = 1000
"""How long a unary Pull waits for messages before answering with none."""
_STREAM_BLOCK_MS = 500
_STREAM_READ = 1000
"""Messages one read of a stream takes at most (whatever its flow control allows)."""
_OUTBOX_LIMIT = 4
"""Responses a stream queues for its client before it reads more: a stream
without flow-control limits still reads no faster than its client receives."""
_NO_LIMIT = 2**62
"""A flow-control limit of <= 0 (Pub/Sub: "no limit")."""
_RESPONSE_BYTES = 3 * 2**20
"""A streaming response is cut below gRPC's default 4 MiB message limit."""
_FIELD_OVERHEAD = 8
"""Bytes a repeated field's tag and length add to each message in a response."""
_ACK_FAILURE = "PERMANENT_FAILURE_INVALID_ACK_ID"
_DELETED_TOPIC = "_deleted-topic_"
_background: set[asyncio.Task[None]] = set()
"""Tasks that end by themselves, referenced until they do."""
_END = object()
"""Put in a stream's outbox after its last response."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StreamSettings:
    """How streaming pulls are served.

    ``lifetime`` (default 1800 s, as Pub/Sub) ends a stream with UNAVAILABLE,
    which clients answer by opening another; nothing it delivered is lost, the
    leases run on.
    """

    lifetime: float = 1800.0


def _duration(seconds: float) -> Any:
    from google.protobuf import duration_pb2

    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def _backoff_out(seconds: float) -> float:
    """A stored backoff as Pub/Sub reads it: the shortest streamsub backoff
    stands for the 0 it was set as."""
    return 0.0 if seconds <= _SHORTEST_BACKOFF else seconds


def _seconds(duration: Any) -> float:
    return float(duration.seconds) + float(duration.nanos) / 1e9


def _topic_retention(topic: TopicRecord | None) -> float | None:
    """A topic's message_retention_duration: its retention's max_age."""
    if topic is None or topic.retention is None:
        return None
    return topic.retention.max_age


def _subscription_retention(topic: TopicRecord | None) -> float | None:
    """A subscription's message_retention_duration: its topic's hard cap on age
    (``drop_unacked``), else None (unacknowledged messages stay until acked)."""
    if topic is None or topic.retention is None or not topic.retention.drop_unacked:
        return None
    return topic.retention.max_age


class PubSubService:
    """The Pub/Sub API over one streamsub client and adapter."""

    def __init__(
        self,
        backend: Backend,
        *,
        partitions: int = 16,
        stream_settings: StreamSettings | None = None,
    ) -> None:
        self.backend = backend
        # Retention runs for the topics published to and the subscriptions
        # pulled here (and their dead-letter topics), one trimmer per topic
        # across processes.
        self.client = Client(backend, trim_in_background=False)
        self.trimmer = Trimmer(backend, interval=DEFAULT_RETENTION_INTERVAL)
        self.adapter = Adapter(backend)
        self.partitions = partitions
        self.stream_settings = stream_settings or StreamSettings()
        self.closing = asyncio.Event()
        self._unary_pullers: dict[str, Puller] = {}
        self.streams = 0
        self.streams_opened = 0
        self.no_streams = asyncio.Event()
        self.no_streams.set()

    async def close(self) -> None:
        """End every stream, give back every lease, close the client."""
        self.closing.set()
        for puller in self._unary_pullers.values():
            await puller.close(hand_back=True)
        await self.adapter.close()
        await self.trimmer.aclose()
        await self.client.aclose()

    # --- helpers ---------------------------------------------------------------
    @staticmethod
    def _native(resource: str, kind: Any) -> str:
        try:
            return to_native(resource, kind)
        except StreamsubError as exc:
            raise from_streamsub(exc) from None

    async def _topic_exists(self, resource: str, native: str) -> None:
        if await self.backend.get_topic(native) is None:
            raise not_found(resource)

    async def _view(self, resource: str) -> SubscriptionView:
        native = self._native(resource, "subscriptions")
        try:
            return await self.adapter.view(native)
        except NotFoundError:
            raise not_found(resource) from None

    async def _topic_message(self, native: str) -> Any:
        labels = await self.backend.get_labels("topic", native)
        message = pb.Topic(name=from_native(native, "topics"), labels=labels)
        record = await self.backend.get_topic(native)
        age = _topic_retention(record)
        if age is not None:
            message.message_retention_duration.CopyFrom(_duration(age))
        return message

    async def _subscription_message(self, sub: Subscription) -> Any:
        message = pb.Subscription(
            name=from_native(sub.name, "subscriptions"),
            topic=from_native(sub.topic, "topics") or sub.topic,
            ack_deadline_seconds=round(sub.ack_deadline),
            enable_message_ordering=sub.enable_message_ordering,
            enable_exactly_once_delivery=sub.enable_exactly_once_delivery,
            labels=await self.backend.get_labels("subscription", sub.name),
            state=1,  # ACTIVE
        )
        topic = await self.backend.get_topic(sub.topic)
        if topic is None:
            message.topic = _DELETED_TOPIC
        age = _topic_retention(topic)
        if age is not None:
            message.topic_message_retention_duration.CopyFrom(_duration(age))
        cap = _subscription_retention(topic)
        if cap is not None:
            message.message_retention_duration.CopyFrom(_duration(cap))
        if sub.dead_letter_topic is not None:
            message.dead_letter_policy.dead_letter_topic = (
                from_native(sub.dead_letter_topic, "topics") or sub.dead_letter_topic
            )
            message.dead_letter_policy.max_delivery_attempts = sub.max_delivery_attempts
        if sub.retry_policy is not None:
            message.retry_policy.minimum_backoff.CopyFrom(
                _duration(_backoff_out(sub.retry_policy.minimum_backoff))
            )
            message.retry_policy.maximum_backoff.CopyFrom(
                _duration(_backoff_out(sub.retry_policy.maximum_backoff))
            )
        return message

    @staticmethod
    def _check_range(what: str, value: float, bounds: tuple[int, int]) -> None:
        if not bounds[0] <= value <= bounds[1]:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                f"Invalid {what} ({value}): it must be from {bounds[0]} to {bounds[1]}.",
            )

    def _dead_letter(self, message: Any) -> tuple[str | None, int]:
        if not message.HasField("dead_letter_policy"):
            return None, DEFAULT_MAX_DELIVERY_ATTEMPTS
        policy = message.dead_letter_policy
        if not policy.dead_letter_topic:
            return None, DEFAULT_MAX_DELIVERY_ATTEMPTS
        attempts = policy.max_delivery_attempts or DEFAULT_MAX_DELIVERY_ATTEMPTS
        self._check_range("max_delivery_attempts", attempts, _DEAD_LETTER_ATTEMPTS_RANGE)
        return self._native(policy.dead_letter_topic, "topics"), attempts

    @staticmethod
    def _retry(message: Any) -> RetryPolicy | None:
        if not message.HasField("retry_policy"):
            return None
        policy = message.retry_policy
        minimum = _seconds(policy.minimum_backoff) if policy.HasField("minimum_backoff") else 10
        maximum = _seconds(policy.maximum_backoff) if policy.HasField("maximum_backoff") else 600
        for what, value in (("minimum_backoff", minimum), ("maximum_backoff", maximum)):
            PubSubService._check_range(f"retry_policy.{what}", value, (0, 600))
        if maximum < minimum:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "Invalid retry_policy: maximum_backoff must not be less than minimum_backoff.",
            )
        # streamsub's backoffs are > 0; Pub/Sub's 0 means "as soon as possible".
        return RetryPolicy(
            minimum_backoff=max(minimum, _SHORTEST_BACKOFF),
            maximum_backoff=max(maximum, _SHORTEST_BACKOFF),
        )

    @staticmethod
    def _unsupported(message: Any) -> None:
        checks = (
            ("push_config", message.HasField("push_config")),
            ("bigquery_config", message.HasField("bigquery_config")),
            ("cloud_storage_config", message.HasField("cloud_storage_config")),
            ("bigtable_config", message.HasField("bigtable_config")),
            ("filter", message.filter),
            ("retain_acked_messages", message.retain_acked_messages),
            ("detached", message.detached),
            ("message_transforms", len(message.message_transforms)),
            # An expiration_policy without a ttl is "never expire", as streamsub does.
            ("expiration_policy.ttl", message.expiration_policy.HasField("ttl")),
        )
        for field, value in checks:
            if value:
                raise RpcError(
                    Code.INVALID_ARGUMENT,
                    f"{field} is not supported by the streamsub gateway: pull subscriptions "
                    "without filters, transforms or expiry only.",
                )

    @staticmethod
    def _unsupported_topic(message: Any) -> None:
        checks = (
            ("kms_key_name", message.kms_key_name),
            ("schema_settings", message.HasField("schema_settings")),
            ("ingestion_data_source_settings", message.HasField("ingestion_data_source_settings")),
            ("message_transforms", len(message.message_transforms)),
        )
        for field, value in checks:
            if value:
                raise RpcError(
                    Code.INVALID_ARGUMENT,
                    f"{field} is not supported by the streamsub gateway.",
                )

    @staticmethod
    def _topic_retention_asked(message: Any) -> float | None:
        """The topic's message_retention_duration in seconds (None: unset or 0)."""
        if not message.HasField("message_retention_duration"):
            return None
        seconds = _seconds(message.message_retention_duration)
        if seconds == 0:
            return None
        PubSubService._check_range("message_retention_duration", seconds, _TOPIC_RETENTION_RANGE)
        return seconds

    @staticmethod
    def _check_subscription_retention(message: Any, topic: TopicRecord | None) -> None:
        """A subscription's message_retention_duration is its topic's hard cap (a
        ``drop_unacked`` max_age), the only bound streamsub puts on unacknowledged
        messages: accept exactly that, refuse anything else."""
        if not message.HasField("message_retention_duration"):
            return
        seconds = _seconds(message.message_retention_duration)
        cap = _subscription_retention(topic)
        if seconds == 0 or (cap is not None and abs(seconds - cap) < 0.001):
            return
        raise RpcError(
            Code.INVALID_ARGUMENT,
            "message_retention_duration of a subscription is not supported by the streamsub "
            "gateway: a subscription keeps its unacknowledged messages until they are "
            "acknowledged, unless its topic has a hard cap (streamsub Retention with "
            "drop_unacked=True), whose max_age is then the only value accepted here. Bound "
            "acknowledged messages with the topic's message_retention_duration.",
        )

    # --- Publisher -------------------------------------------------------------
    async def CreateTopic(self, request: Any) -> Any:
        native = self._native(request.name, "topics")
        self._unsupported_topic(request)
        age = self._topic_retention_asked(request)
        if await self.backend.get_topic(native) is not None:
            raise already_exists(request.name)
        try:
            await self.client.create_topic(
                native,
                partitions=self.partitions,
                retention=None if age is None else Retention(max_age=age),
            )
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        if age is not None:
            self.trimmer.watch_topic(native)
        await self.backend.set_labels("topic", native, dict(request.labels))
        return await self._topic_message(native)

    async def GetTopic(self, request: Any) -> Any:
        native = self._native(request.topic, "topics")
        await self._topic_exists(request.topic, native)
        return await self._topic_message(native)

    async def UpdateTopic(self, request: Any) -> Any:
        native = self._native(request.topic.name, "topics")
        paths = list(request.update_mask.paths)
        if not paths:
            raise RpcError(Code.INVALID_ARGUMENT, "The update_mask in the request is empty.")
        unsupported = [p for p in paths if p not in ("labels", "message_retention_duration")]
        if unsupported:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                f"Invalid update_mask provided in the UpdateTopicRequest: the streamsub "
                f"gateway updates labels and message_retention_duration, not "
                f"{', '.join(unsupported)}.",
            )
        record = await self.backend.get_topic(native)
        if record is None:
            raise not_found(request.topic.name)
        if "message_retention_duration" in paths:
            age = self._topic_retention_asked(request.topic)
            # Only the age changes: a length bound or hard cap set natively stays.
            retention = dataclasses.replace(record.retention or Retention(), max_age=age)
            try:
                await self.client.update_topic_retention(
                    native, retention if retention.bounded else None
                )
            except NotFoundError:
                raise not_found(request.topic.name) from None
            except StreamsubError as exc:
                raise from_streamsub(exc) from None
            self.trimmer.watch_topic(native)
        if "labels" in paths:
            await self.backend.set_labels("topic", native, dict(request.topic.labels))
        return await self._topic_message(native)

    async def ListTopics(self, request: Any) -> Any:
        prefix = self._project(request.project)
        names = sorted(
            t.name for t in await self.backend.list_topics() if t.name.startswith(prefix)
        )
        page, token = self._page(
            names, request.page_size, request.page_token, f"ListTopics {request.project}"
        )
        topics = [await self._topic_message(n) for n in page]
        return pb.ListTopicsResponse(topics=topics, next_page_token=token)

    async def ListTopicSubscriptions(self, request: Any) -> Any:
        native = self._native(request.topic, "topics")
        await self._topic_exists(request.topic, native)
        names = sorted(s.name for s in await self.backend.list_subscriptions(native))
        page, token = self._page(
            names, request.page_size, request.page_token, f"ListTopicSubscriptions {request.topic}"
        )
        return pb.ListTopicSubscriptionsResponse(
            subscriptions=[from_native(n, "subscriptions") or n for n in page],
            next_page_token=token,
        )

    async def DeleteTopic(self, request: Any) -> Any:
        native = self._native(request.topic, "topics")
        await self._topic_exists(request.topic, native)
        try:
            await self.client.delete_topic(native)
        except NotFoundError:
            raise not_found(request.topic) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        await self.backend.set_labels("topic", native, {})
        return Empty()

    async def Publish(self, request: Any) -> Any:
        native = self._native(request.topic, "topics")
        if not request.messages:
            raise RpcError(Code.INVALID_ARGUMENT, "The request contains no messages.")
        outgoing = []
        for message in request.messages:
            if not message.data and not message.attributes:
                raise RpcError(
                    Code.INVALID_ARGUMENT,
                    "Some messages are empty: a message needs data or at least one attribute.",
                )
            outgoing.append(
                OutgoingMessage(
                    data=message.data,
                    ordering_key=message.ordering_key or None,
                    attributes=dict(message.attributes) or None,
                )
            )
        try:
            ids = await self.client.publish_many(native, outgoing)
        except NotFoundError:
            raise not_found(request.topic) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        self.trimmer.watch_topic(native)
        return pb.PublishResponse(message_ids=ids)

    # --- Subscriber: admin -----------------------------------------------------
    async def CreateSubscription(self, request: Any) -> Any:
        native = self._native(request.name, "subscriptions")
        topic = self._native(request.topic, "topics")
        self._unsupported(request)
        ack_deadline = request.ack_deadline_seconds or DEFAULT_ACK_DEADLINE_SECONDS
        self._check_range("ack_deadline_seconds", ack_deadline, _ACK_DEADLINE_RANGE)
        dead_letter_topic, attempts = self._dead_letter(request)
        retry = self._retry(request)
        if await self.backend.get_subscription(native) is not None:
            raise already_exists(request.name)
        topic_record = await self.backend.get_topic(topic)
        if topic_record is None:
            raise not_found(request.topic)
        self._check_subscription_retention(request, topic_record)
        if dead_letter_topic is not None:
            await self._topic_exists(
                request.dead_letter_policy.dead_letter_topic, dead_letter_topic
            )
        try:
            sub = await self.client.create_subscription(
                native,
                topic=topic,
                ack_deadline=float(ack_deadline),
                max_delivery_attempts=attempts,
                dead_letter_topic=dead_letter_topic,
                retry_policy=retry,
                enable_message_ordering=request.enable_message_ordering,
                enable_exactly_once_delivery=request.enable_exactly_once_delivery,
            )
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        await self.backend.set_labels("subscription", native, dict(request.labels))
        return await self._subscription_message(sub)

    async def _subscription(self, resource: str) -> Subscription:
        native = self._native(resource, "subscriptions")
        try:
            return await self.client.get_subscription(native)
        except NotFoundError:
            raise not_found(resource) from None

    async def GetSubscription(self, request: Any) -> Any:
        return await self._subscription_message(await self._subscription(request.subscription))

    async def UpdateSubscription(self, request: Any) -> Any:
        wanted = request.subscription
        native = self._native(wanted.name, "subscriptions")
        paths = set(request.update_mask.paths)
        if not paths:
            raise RpcError(Code.INVALID_ARGUMENT, "The update_mask in the request is empty.")
        supported = {
            "ack_deadline_seconds",
            "dead_letter_policy",
            "retry_policy",
            "labels",
            "enable_exactly_once_delivery",
            "message_retention_duration",
            "expiration_policy",  # to "never" only, what streamsub does (below)
        }
        if paths - supported:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "Invalid update_mask provided in the UpdateSubscriptionRequest: the streamsub "
                f"gateway updates {', '.join(sorted(supported))}, not "
                f"{', '.join(sorted(paths - supported))}.",
            )
        if "expiration_policy" in paths and wanted.expiration_policy.HasField("ttl"):
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "expiration_policy.ttl is not supported by the streamsub gateway: a "
                "subscription never expires (an empty expiration_policy says so).",
            )
        record = await self.backend.get_subscription(native)
        if record is None:
            raise not_found(wanted.name)
        settings = dict(record.settings)
        if "ack_deadline_seconds" in paths:
            deadline = wanted.ack_deadline_seconds or DEFAULT_ACK_DEADLINE_SECONDS
            self._check_range("ack_deadline_seconds", deadline, _ACK_DEADLINE_RANGE)
            settings["ack_deadline"] = float(deadline)
        if "dead_letter_policy" in paths:
            dead_letter_topic, attempts = self._dead_letter(wanted)
            if dead_letter_topic is not None:
                await self._topic_exists(
                    wanted.dead_letter_policy.dead_letter_topic, dead_letter_topic
                )
            settings["dead_letter_topic"] = dead_letter_topic
            settings["max_delivery_attempts"] = attempts
        if "retry_policy" in paths:
            retry = self._retry(wanted)
            settings["retry_policy"] = None if retry is None else dataclasses.asdict(retry)
        if "enable_exactly_once_delivery" in paths:
            settings["enable_exactly_once_delivery"] = wanted.enable_exactly_once_delivery
        if "message_retention_duration" in paths:
            self._check_subscription_retention(wanted, await self.backend.get_topic(record.topic))
        if "labels" in paths:
            await self.backend.set_labels("subscription", native, dict(wanted.labels))
        if settings != dict(record.settings):
            updated = dataclasses.replace(record, settings=settings)
            if not await self.backend.update_subscription(updated):
                raise not_found(wanted.name)
        self.adapter.forget(native)
        try:
            await self.adapter.rebase(native)
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        return await self._subscription_message(await self._subscription(wanted.name))

    async def ListSubscriptions(self, request: Any) -> Any:
        prefix = self._project(request.project)
        names = sorted(
            s.name for s in await self.backend.list_subscriptions() if s.name.startswith(prefix)
        )
        page, token = self._page(
            names, request.page_size, request.page_token, f"ListSubscriptions {request.project}"
        )
        subs = []
        for name in page:
            with contextlib.suppress(NotFoundError):
                subs.append(
                    await self._subscription_message(await self.client.get_subscription(name))
                )
        return pb.ListSubscriptionsResponse(subscriptions=subs, next_page_token=token)

    async def DeleteSubscription(self, request: Any) -> Any:
        native = self._native(request.subscription, "subscriptions")
        try:
            await self.client.delete_subscription(native)
        except NotFoundError:
            raise not_found(request.subscription) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        await self.backend.set_labels("subscription", native, {})
        await self.adapter.deleted(native)
        puller = self._unary_pullers.pop(native, None)
        if puller is not None:
            await puller.close(hand_back=False)
        return Empty()

    @staticmethod
    def _project(resource: str) -> str:
        try:
            return project_prefix(resource)
        except StreamsubError as exc:
            raise from_streamsub(exc) from None

    @staticmethod
    def _page(names: list[str], size: int, token: str, listing: str) -> tuple[list[str], str]:
        """Pages by name: the token names the listing (the call and what it
        lists) and the last name of the previous page, so that a token this
        listing did not issue is INVALID_ARGUMENT (AIP-158), whichever gateway
        process issued it."""
        if token:
            try:
                issued, _, last = base64.urlsafe_b64decode(token).decode().partition("\n")
            except (ValueError, UnicodeDecodeError):
                issued, last = "", ""
            if issued != listing or not last:
                raise RpcError(Code.INVALID_ARGUMENT, f"Invalid page_token: {token!r}.")
            names = [n for n in names if n > last]
        if size <= 0 or len(names) <= size:
            return names, ""
        issued_token = f"{listing}\n{names[size - 1]}".encode()
        return names[:size], base64.urlsafe_b64encode(issued_token).decode()

    # --- Subscriber: seek and snapshots ----------------------------------------
    def _snapshot_message(self, snapshot: Snapshot) -> Any:
        message = pb.Snapshot(
            name=from_native(snapshot.name, "snapshots") or snapshot.name,
            topic=from_native(snapshot.topic, "topics") or snapshot.topic,
        )
        message.expire_time.FromDatetime(snapshot.expires)
        return message

    @staticmethod
    def _no_labels(labels: Any) -> None:
        if labels:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "Snapshot labels are not kept by the streamsub gateway: create or update the "
                "snapshot without labels.",
            )

    async def Seek(self, request: Any) -> Any:
        native = self._native(request.subscription, "subscriptions")
        target = request.WhichOneof("target")
        to: datetime.datetime | str
        if target == "time":
            to = request.time.ToDatetime(tzinfo=datetime.UTC)
        elif target == "snapshot":
            to = self._native(request.snapshot, "snapshots")
        else:
            raise RpcError(Code.INVALID_ARGUMENT, "A seek needs a target: a time or a snapshot.")
        try:
            if isinstance(to, datetime.datetime) and to.timestamp() > (
                await self.backend.server_time()
            ):
                # Pub/Sub's seek acts on the messages the subscription holds now:
                # a time ahead acknowledges them all, and later ones still come.
                # (streamsub's own seek would move each partition to that time.)
                to = "latest"
            await self.client.seek(native, to=to)
        except SubscriptionNotFoundError:
            raise not_found(request.subscription) from None
        except TopicNotFoundError:
            raise RpcError(
                Code.FAILED_PRECONDITION,
                f"The subscription's topic was deleted (subscription={request.subscription}).",
            ) from None
        except NotFoundError:
            raise not_found(request.snapshot) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        await self.adapter.sought(native)
        return pb.SeekResponse()

    async def CreateSnapshot(self, request: Any) -> Any:
        subscription = self._native(request.subscription, "subscriptions")
        name = request.name
        if not name:
            # Pub/Sub assigns a random name in the subscription's project.
            project = request.subscription.split("/")[1]
            name = f"projects/{project}/snapshots/snapshot-{uuid.uuid4().hex}"
        native = self._native(name, "snapshots")
        self._no_labels(request.labels)
        try:
            snapshot = await self.client.create_snapshot(native, subscription)
        except SubscriptionNotFoundError:
            raise not_found(request.subscription) from None
        except TopicNotFoundError:
            raise RpcError(
                Code.FAILED_PRECONDITION,
                f"The subscription's topic was deleted (subscription={request.subscription}).",
            ) from None
        except AlreadyExistsError:
            raise already_exists(name) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        return self._snapshot_message(snapshot)

    async def _snapshot(self, resource: str) -> Snapshot:
        native = self._native(resource, "snapshots")
        try:
            return await self.client.get_snapshot(native)
        except NotFoundError:
            raise not_found(resource) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None

    async def GetSnapshot(self, request: Any) -> Any:
        return self._snapshot_message(await self._snapshot(request.snapshot))

    async def ListSnapshots(self, request: Any) -> Any:
        prefix = self._project(request.project)
        snapshots = {s.name: s for s in await self.client.list_snapshots()}
        names = sorted(n for n in snapshots if n.startswith(prefix))
        page, token = self._page(
            names, request.page_size, request.page_token, f"ListSnapshots {request.project}"
        )
        return pb.ListSnapshotsResponse(
            snapshots=[self._snapshot_message(snapshots[n]) for n in page], next_page_token=token
        )

    async def ListTopicSnapshots(self, request: Any) -> Any:
        native = self._native(request.topic, "topics")
        await self._topic_exists(request.topic, native)
        names = sorted(s.name for s in await self.client.list_snapshots() if s.topic == native)
        page, token = self._page(
            names, request.page_size, request.page_token, f"ListTopicSnapshots {request.topic}"
        )
        return pb.ListTopicSnapshotsResponse(
            snapshots=[from_native(n, "snapshots") or n for n in page], next_page_token=token
        )

    async def UpdateSnapshot(self, request: Any) -> Any:
        wanted = request.snapshot
        paths = set(request.update_mask.paths)
        if not paths:
            raise RpcError(Code.INVALID_ARGUMENT, "The update_mask in the request is empty.")
        unsupported = paths - {"labels", "expire_time"}
        if unsupported:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "Invalid update_mask provided in the UpdateSnapshotRequest: a snapshot has "
                f"labels and expire_time, not {', '.join(sorted(unsupported))}.",
            )
        snapshot = await self._snapshot(wanted.name)
        if "labels" in paths:
            self._no_labels(wanted.labels)
        if "expire_time" in paths:
            asked = wanted.expire_time.ToDatetime(tzinfo=datetime.UTC)
            if abs((asked - snapshot.expires).total_seconds()) >= 1:
                raise RpcError(
                    Code.INVALID_ARGUMENT,
                    "A streamsub snapshot expires seven days after it was created "
                    f"({snapshot.expires.isoformat()}); its expire_time cannot be changed.",
                )
        return self._snapshot_message(snapshot)

    async def DeleteSnapshot(self, request: Any) -> Any:
        native = self._native(request.snapshot, "snapshots")
        try:
            await self.client.delete_snapshot(native)
        except NotFoundError:
            raise not_found(request.snapshot) from None
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        return Empty()

    # --- Subscriber: data ------------------------------------------------------
    def _received(self, view: SubscriptionView, items: Sequence[Received]) -> list[Any]:
        dead_letter = view.dead_letter_topic is not None
        out = []
        for item in items:
            message = pb.PubsubMessage(
                data=item.data,
                attributes=item.attributes,
                message_id=item.message_id,
                ordering_key=item.ordering_key or "",
            )
            message.publish_time.FromMilliseconds(item.publish_ms)
            received = pb.ReceivedMessage(ack_id=item.ack_id, message=message)
            if dead_letter:  # Pub/Sub sets it only under a dead-letter policy
                received.delivery_attempt = item.delivery_attempt
            out.append(received)
        return out

    async def Pull(self, request: Any) -> Any:
        view = await self._view(request.subscription)
        self.trimmer.watch_subscription(view.name)
        if request.max_messages <= 0:
            raise RpcError(Code.INVALID_ARGUMENT, "max_messages must be greater than 0.")
        puller = self._unary_pullers.get(view.name)
        if puller is None or puller.closed:
            puller = self.adapter.puller(
                view,
                consumer=self.adapter.new_consumer("pull"),
                max_messages=2**31,
                max_bytes=2**62,
                deadline=view.ack_deadline,
            )
            self._unary_pullers[view.name] = puller
        puller.view = view
        puller.deadline = view.ack_deadline
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0 if request.return_immediately else _PULL_BLOCK_MS / 1000)
        try:
            while True:
                remaining_ms = int((deadline - loop.time()) * 1000)
                items = await puller.pull(max(1, remaining_ms), limit=request.max_messages)
                if items or remaining_ms <= 0:
                    break
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        return pb.PullResponse(received_messages=self._received(view, items))

    async def _settle(
        self, resource: str, ack_ids: Sequence[str], seconds: float | None
    ) -> tuple[SubscriptionView, list[str]]:
        view = await self._view(resource)
        try:
            if seconds is None:
                failed = await self.adapter.acknowledge(view, ack_ids)
            else:
                failed = await self.adapter.modify_deadline(view, ack_ids, seconds)
        except StreamsubError as exc:
            raise from_streamsub(exc) from None
        return view, failed

    @staticmethod
    def _ack_failure(view: SubscriptionView, failed: Sequence[str]) -> None:
        # Without exactly-once delivery, Pub/Sub drops invalid acks silently.
        if view.exactly_once and failed:
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "Some acknowledgement ids in the request were invalid. This could be because "
                "the acknowledgement ids have expired or the acknowledgement ids were malformed.",
                ack_errors=dict.fromkeys(failed, _ACK_FAILURE),
            )

    async def Acknowledge(self, request: Any) -> Any:
        if not request.ack_ids:
            raise RpcError(Code.INVALID_ARGUMENT, "No ack ids were given.")
        view, failed = await self._settle(request.subscription, request.ack_ids, None)
        self._ack_failure(view, failed)
        return Empty()

    async def ModifyAckDeadline(self, request: Any) -> Any:
        self._check_range("ack deadline", request.ack_deadline_seconds, _MODACK_RANGE)
        if not request.ack_ids:
            raise RpcError(Code.INVALID_ARGUMENT, "No ack ids were given.")
        view, failed = await self._settle(
            request.subscription, request.ack_ids, float(request.ack_deadline_seconds)
        )
        self._ack_failure(view, failed)
        return Empty()

    # --- Subscriber: StreamingPull ---------------------------------------------
    async def streaming_pull(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Serve one StreamingPull: the first request opens it, later ones carry
        acks, modacks, a new stream deadline, or nothing (a keep-alive, answered
        at once). Raises RpcError UNAVAILABLE when the stream's lifetime ends or
        the gateway stops; the client then opens another."""
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        if not first.subscription:
            raise RpcError(Code.INVALID_ARGUMENT, "The first request must name a subscription.")
        if first.ack_ids or first.modify_deadline_ack_ids:
            raise RpcError(
                Code.INVALID_ARGUMENT, "The first request must not acknowledge or modify deadlines."
            )
        self._check_range(
            "stream_ack_deadline_seconds", first.stream_ack_deadline_seconds, (10, 600)
        )
        view = await self._view(first.subscription)
        self.trimmer.watch_subscription(view.name)
        await self.adapter.delete_idle_consumers(view)
        puller = self.adapter.puller(
            view,
            consumer=self.adapter.new_consumer("stream"),
            # Pub/Sub: a limit <= 0 is no limit (Go's client sends negative ones).
            max_messages=_limit(first.max_outstanding_messages),
            max_bytes=_limit(first.max_outstanding_bytes),
            deadline=float(first.stream_ack_deadline_seconds),
            stream=True,
            client_id=first.client_id,
        )
        stream = _Stream(self, first.subscription, view, puller)
        self.streams += 1
        self.streams_opened += 1
        self.no_streams.clear()
        log.debug(
            "stream %s opened for %s (client %s)", puller.consumer, view.name, first.client_id
        )
        try:
            async for response in stream.run(requests):
                yield response
        finally:
            try:
                await stream.close()
            finally:
                self.streams -= 1
                if not self.streams:
                    self.no_streams.set()


class _Stream:
    """One StreamingPull: a reader task, a request task, one outbox."""

    def __init__(
        self, service: PubSubService, resource: str, view: SubscriptionView, puller: Puller
    ) -> None:
        self._service = service
        self._resource = resource
        self._view = view
        self._puller = puller
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._drained = asyncio.Event()
        self._ended = asyncio.Event()
        self._error: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _properties(self, response: Any) -> Any:
        response.subscription_properties.exactly_once_delivery_enabled = self._view.exactly_once
        response.subscription_properties.message_ordering_enabled = self._view.ordering
        return response

    def _end(self, error: BaseException | None) -> None:
        if not self._ended.is_set():
            self._error = error
            self._ended.set()
            self._outbox.put_nowait(_END)

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._guard(self._read())),
            loop.create_task(self._guard(self._watch())),
        ]
        # Not cancelled at the end: cancelling a read of the request stream
        # cancels the whole call, and clients treat CANCELLED as final. It ends
        # by itself when the call does.
        self._request_task = loop.create_task(self._guard(self._requests(requests)))
        _background.add(self._request_task)
        self._request_task.add_done_callback(_background.discard)
        while True:
            response = await self._outbox.get()
            if self._outbox.qsize() <= _OUTBOX_LIMIT:
                self._drained.set()
            if response is _END:
                break
            yield response
        if self._error is not None:
            raise self._error

    async def _guard(self, work: Awaitable[None]) -> None:
        try:
            await work
        except RpcError as exc:
            self._end(exc)
        except StreamsubError as exc:
            self._end(from_streamsub(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._ended.is_set():
                return  # the call is over, and reading its requests says so
            log.exception("streamsub gateway: a stream failed")
            self._end(RpcError(Code.INTERNAL, f"the gateway failed: {exc}"))

    async def _watch(self) -> None:
        lifetime = self._service.stream_settings.lifetime
        closing = asyncio.ensure_future(self._service.closing.wait())
        try:
            await asyncio.wait_for(asyncio.shield(closing), lifetime)
        except TimeoutError:
            self._end(
                RpcError(Code.UNAVAILABLE, "The stream reached its lifetime; open another one.")
            )
        else:
            self._end(RpcError(Code.UNAVAILABLE, "The gateway is shutting down."))
        finally:
            closing.cancel()

    async def _read(self) -> None:
        puller = self._puller
        while not self._ended.is_set():
            if puller.budget() <= 0:
                puller.room.clear()
                if puller.budget() <= 0:
                    await puller.room.wait()
                continue
            try:
                if self._outbox.qsize() > _OUTBOX_LIMIT:
                    self._drained.clear()
                    await self._drained.wait()
                    continue
                # The subscription's settings as they are now (cached a second):
                # an updated ack deadline is the reclaimers' min-idle at once.
                puller.view = await self._service.adapter.view(self._view.name)
                items = await puller.pull(_STREAM_BLOCK_MS, limit=_STREAM_READ)
            except StreamsubError:
                # A subscription deleted under the stream fails its reads: say
                # NOT_FOUND, which clients take as final, not a retryable error.
                self._service.adapter.forget(self._view.name)
                await self._service._view(self._resource)
                raise
            if items:
                for chunk in _chunks(self._service._received(self._view, items)):
                    response = pb.StreamingPullResponse(received_messages=chunk)
                    self._outbox.put_nowait(self._properties(response))

    async def _requests(self, requests: AsyncIterator[Any]) -> None:
        service = self._service
        async for request in requests:
            answered = False
            if request.max_outstanding_messages or request.max_outstanding_bytes:
                raise RpcError(
                    Code.INVALID_ARGUMENT,
                    "max_outstanding_messages and max_outstanding_bytes can only be set on "
                    "the first request of a stream.",
                )
            if request.stream_ack_deadline_seconds:
                self._puller.deadline = float(
                    min(max(request.stream_ack_deadline_seconds, 10), 600)
                )
            if request.ack_ids:
                view, failed = await service._settle(self._resource, request.ack_ids, None)
                if view.exactly_once:
                    answered = True
                    response = pb.StreamingPullResponse()
                    confirmation = response.acknowledge_confirmation
                    bad = set(failed)
                    confirmation.ack_ids.extend(i for i in request.ack_ids if i not in bad)
                    confirmation.invalid_ack_ids.extend(failed)
                    self._outbox.put_nowait(self._properties(response))
            if request.modify_deadline_ack_ids:
                answered = await self._modacks(request) or answered
            if not answered and not request.ack_ids and not request.modify_deadline_ack_ids:
                # A keep-alive: answer it, so clients that expect to hear back
                # (Java's closes a silent stream) keep the stream.
                self._outbox.put_nowait(self._properties(pb.StreamingPullResponse()))
        self._end(None)  # the client half-closed: end the stream with OK

    async def _modacks(self, request: Any) -> bool:
        ids, seconds = request.modify_deadline_ack_ids, request.modify_deadline_seconds
        if len(ids) != len(seconds):
            raise RpcError(
                Code.INVALID_ARGUMENT,
                "modify_deadline_ack_ids and modify_deadline_seconds must have the same length.",
            )
        groups: dict[int, list[str]] = {}
        for ack_id, value in zip(ids, seconds, strict=True):
            PubSubService._check_range("ack deadline", value, _MODACK_RANGE)
            groups.setdefault(value, []).append(ack_id)
        failed: list[str] = []
        view = self._view
        for value, group in groups.items():
            view, bad = await self._service._settle(self._resource, group, float(value))
            failed += bad
        if not view.exactly_once:
            return False
        response = pb.StreamingPullResponse()
        confirmation = response.modify_ack_deadline_confirmation
        bad_set = set(failed)
        confirmation.ack_ids.extend(i for i in ids if i not in bad_set)
        confirmation.invalid_ack_ids.extend(failed)
        self._outbox.put_nowait(self._properties(response))
        return True

    async def close(self) -> None:
        self._end(None)
        await asyncio.gather(*(end_task(task, "a stream's task") for task in self._tasks))
        # Leases run on when the client went away or the lifetime ended (it may
        # ack on its next stream); a stopping gateway gives them back.
        await self._puller.close(hand_back=self._service.closing.is_set())


def _limit(value: int) -> int:
    """A StreamingPull flow-control limit: <= 0 is none."""
    return value if value > 0 else _NO_LIMIT


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    """ReceivedMessages cut into responses of at most ``_RESPONSE_BYTES`` each
    (counted as encoded: data, attributes, ids, ordering key and all), except
    that one message larger than that goes alone."""
    chunks: list[Sequence[Any]] = []
    start, size = 0, 0
    for index, item in enumerate(items):
        weight = item.ByteSize() + _FIELD_OVERHEAD
        if index > start and size + weight > _RESPONSE_BYTES:
            chunks.append(items[start:index])
            start, size = index, 0
        size += weight
    chunks.append(items[start:])
    return chunks

"""streamsub for code that is not async: a Django or Flask view, a script, a worker.

::

    import streamsub.blocking

    client = streamsub.blocking.connect("redis://localhost:6379/0")
    future = client.publish("orders", b"...", ordering_key="customer-7")
    message_id = future.result()            # or let it resolve in the background

    def handle(message: streamsub.Message) -> None:
        ...
        message.ack()

    streaming = client.subscribe("billing", handle, ack_mode="manual")
    try:
        streaming.result()                  # until cancel(), or what ended it
    except KeyboardInterrupt:
        streaming.cancel()
        streaming.result()
    client.close()

The blocking :class:`Client` runs one event-loop thread of its own (a daemon
named ``streamsub-blocking-n``) hosting an async :class:`streamsub.Client`;
each method hands its call to that loop, so every method may be called from
any thread at once. Errors are the async client's, unchanged (the same
exception classes, the same objects). Calling a blocking method from the
loop's own thread, where it would wait for ever, raises
:class:`~streamsub.FailedPreconditionError` instead: from an ``async def``
callback, or from a done callback, which runs on that thread.

A client that is never closed is closed when the interpreter exits (``atexit``),
so what was published is still written; its thread is a daemon and never
holds the process up by itself.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import datetime
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from . import _client
from ._backends.base import Backend
from ._blocking_loop import LoopThread, PublishRoom
from ._client import (
    DEFAULT_CONSUMER_EXPIRY,
    DEFAULT_SHUTDOWN_TIMEOUT,
    PartitionNode,
    Start,
    Subscriber,
    Subscription,
    SubscriptionStats,
    Topic,
)
from ._core.codec import size_of
from ._core.retention import DEFAULT_RETENTION_INTERVAL, Retention, RetentionResult
from ._core.seek import SeekResult, Snapshot
from ._core.stats import Stats
from ._engine.deadletters import DeadLetter
from ._engine.dispatcher import DEFAULT_HANDLER_THREADS
from ._engine.receiver import AckMode, Handler, ReceiverStatistics
from ._errors import ClosedError, OrderingKeyPausedError
from ._message import OutgoingMessage
from ._settings import (
    DEFAULT_ACK_DEADLINE,
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    DEFAULT_PARTITIONS,
    BatchSettings,
    Durability,
    FlowControl,
    Limits,
    PublishFlowControl,
    RetryPolicy,
)

__all__ = ["Client", "StreamingPullFuture", "connect"]

log = logging.getLogger("streamsub")


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
    """A blocking client for the server at ``url``, connected and ready.

    Takes the settings of :func:`streamsub.connect` (same names, same
    defaults). Unlike it, this checks the server at once: it raises
    :class:`~streamsub.UnavailableError` when the server cannot be reached.
    Use it as ``with streamsub.blocking.connect(...) as client:`` or call
    :meth:`Client.close` when done.
    """
    return Client(
        url,
        batch_settings=batch_settings,
        publish_flow_control=publish_flow_control,
        limits=limits,
        backend=backend,
        trim_in_background=trim_in_background,
        retention_interval=retention_interval,
        socket_timeout=socket_timeout,
        ssl_ca_certs=ssl_ca_certs,
        durability=durability,
    )


class StreamingPullFuture(concurrent.futures.Future[None]):
    """A running subscriber, shaped like Pub/Sub's ``StreamingPullFuture``.

    - ``result(timeout=None)`` blocks until the subscriber has stopped: it
      returns None after :meth:`cancel` (or the client's ``close()``), and
      raises the error that stopped it otherwise, say
      :class:`~streamsub.SubscriptionNotFoundError` when the subscription or
      its topic was deleted. With a ``timeout`` it raises
      :class:`TimeoutError` if the subscriber still runs.
    - :meth:`cancel` starts a graceful stop and returns at once (as Pub/Sub's
      since 2.4.1); call ``result()`` after it to wait until stopped.
    - ``running()`` is True from ``subscribe()`` until it stopped, ``done()``
      after; ``cancelled()`` says whether :meth:`cancel` (or ``close()``)
      stopped it.
    - ``add_done_callback(fn)`` calls ``fn(future)`` once stopped, on the
      client's event-loop thread (at once if already stopped): keep it short,
      and do not call the blocking client from it.

    It is a :class:`concurrent.futures.Future`, so ``concurrent.futures.wait``
    and ``as_completed`` work on several at once.
    """

    def __init__(self, loop: LoopThread, subscriber: Subscriber) -> None:
        super().__init__()
        self._loop = loop
        self._subscriber = subscriber
        self._cancel_requested = False
        self._stopping: asyncio.Task[None] | None = None
        self.set_running_or_notify_cancel()

    @property
    def consumer(self) -> str:
        """This subscriber's consumer name in the subscription's consumer groups."""
        return self._subscriber.consumer

    def cancel(self) -> bool:
        """Stop the subscriber gracefully, as leaving the async ``async with`` does:
        reading stops, running callbacks get ``shutdown_timeout`` to finish, acks
        are flushed. Returns True at once, without waiting (Pub/Sub's
        semantics); a call after the first, or after it stopped, does nothing
        more. Call ``result()`` to wait until it has stopped."""
        if not self.done():
            self._cancel_requested = True
            self._loop.call_soon(self._stop_on_loop)
        return True

    def _stop_on_loop(self) -> None:
        if self._stopping is None:  # held here, so the task is not collected mid-way
            self._stopping = asyncio.get_running_loop().create_task(self._subscriber.stop())

    def cancelled(self) -> bool:
        """Whether :meth:`cancel` or the client's ``close()`` asked the subscriber to
        stop before it stopped on its own."""
        return self._cancel_requested

    def statistics(self) -> ReceiverStatistics:
        """A snapshot of this subscriber's counters (a plain read, no round trip)."""
        return self._subscriber.statistics()

    def _finish(self, error: BaseException | None) -> None:
        if self.done():
            return
        if error is None:
            self.set_result(None)
        else:
            self.set_exception(error)


_open_clients: set[Client] = set()
"""Clients not yet closed, closed at interpreter exit if their owner forgot."""
_open_clients_lock = threading.Lock()


@atexit.register
def _close_forgotten() -> None:
    with _open_clients_lock:
        forgotten = list(_open_clients)
    for client in forgotten:
        try:
            client.close()
        except Exception:
            log.exception("streamsub: closing a blocking client at exit failed")


class Client:
    """The blocking face of :class:`streamsub.Client`; create it with :func:`connect`.

    Every method may be called from any thread. The admin methods block until
    done and return or raise exactly what the async client's do; ``publish``
    and ``publish_many`` return a :class:`concurrent.futures.Future` (at once,
    or once ``PublishFlowControl`` has room under ``BLOCK``);
    ``subscribe`` returns a :class:`StreamingPullFuture`. After :meth:`close`
    every method raises :class:`~streamsub.ClosedError`.
    """

    def __init__(
        self,
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
    ) -> None:
        """Start the loop thread and connect on it (see :func:`connect`)."""
        self._loop = LoopThread("the streamsub.blocking client")
        self._room = PublishRoom(publish_flow_control or PublishFlowControl())
        self._subscribers: set[StreamingPullFuture] = set()
        self._watchers: set[asyncio.Task[None]] = set()

        async def open_client() -> _client.Client:
            client = _client.connect(
                url,
                batch_settings=batch_settings,
                publish_flow_control=publish_flow_control,
                limits=limits,
                backend=backend,
                trim_in_background=trim_in_background,
                retention_interval=retention_interval,
                socket_timeout=socket_timeout,
                ssl_ca_certs=ssl_ca_certs,
                durability=durability,
            )
            try:
                return await client.__aenter__()
            except BaseException:
                await client.aclose()
                raise

        try:
            self._client = self._loop.call(open_client)
        except BaseException:
            self._loop.stop(_nothing)
            raise
        self._client._watch_pauses(self._room.wake)
        with _open_clients_lock:
            _open_clients.add(self)

    @property
    def url(self) -> str:
        """The server's URL, without password."""
        return self._client.url

    @property
    def thread_name(self) -> str:
        """The name of this client's event-loop thread (``streamsub-blocking-n``)."""
        return self._loop.name

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop every subscriber (as :meth:`StreamingPullFuture.cancel` does, and
        wait for them), write what publishers hold (their futures resolve), close
        the connections and end the loop thread. Takes as long as the async
        client's ``aclose()``. A second call does nothing; afterwards every
        method raises :class:`~streamsub.ClosedError`."""
        self._loop.stop(self._aclose)
        with _open_clients_lock:
            _open_clients.discard(self)

    async def _aclose(self) -> None:
        for future in list(self._subscribers):
            if not future.done():
                future._cancel_requested = True
        # A subscriber still starting when close() began is not yet among the
        # async client's: stop ours too (stop is idempotent).
        await asyncio.gather(*(future._subscriber.stop() for future in list(self._subscribers)))
        await self._client.aclose()
        if self._watchers:
            await asyncio.gather(*self._watchers, return_exceptions=True)

    # --- publishing ------------------------------------------------------------
    def publish(
        self,
        topic: str,
        data: bytes,
        *,
        ordering_key: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> concurrent.futures.Future[str]:
        """Publish one message; return at once a future of its id, resolved once it
        is stored (as Pub/Sub's ``publish``).

        Calls from one thread are published in call order (per ordering key,
        also in the order stored). The future raises what the async
        ``publish`` raises: bad input, :class:`~streamsub.TopicNotFoundError`,
        or a :class:`~streamsub.BackendError` (the message may or may not be
        stored).

        Under the client's ``PublishFlowControl`` with ``BLOCK`` (the default),
        this blocks the calling thread, before returning, until the call fits
        the limits (messages and bytes whose futures are not yet done), as
        Pub/Sub's does; a call larger than a whole limit goes once nothing else
        is outstanding. With ``ERROR`` the future raises
        :class:`~streamsub.FlowControlLimitError`, as the async ``publish``
        does; with ``IGNORE`` it never waits.
        """
        self._loop.check_caller()  # before waiting for room that would never come
        if isinstance(attributes, Mapping):
            attributes = dict(attributes)  # the caller may change theirs once we return
        size = size_of(data, ordering_key, attributes)
        try:
            entered = self._room.enter(1, size, self._pause_check(topic, [ordering_key]))
        except OrderingKeyPausedError as exc:
            return _failed(exc)
        try:
            future = _uncancellable(
                self._loop.submit(
                    self._client.publish,
                    topic,
                    data,
                    ordering_key=ordering_key,
                    attributes=attributes,
                )
            )
        except BaseException:
            if entered:
                self._room.leave(1, size)
            raise
        if entered:
            self._room.leave_when_done(future, 1, size)
        return future

    def _pause_check(
        self, topic: str, keys: list[str | None]
    ) -> Callable[[], OrderingKeyPausedError | None]:
        """What tells a call waiting for room that one of its keys was paused."""

        def paused() -> OrderingKeyPausedError | None:
            key = self._client._first_paused(topic, keys)
            return None if key is None else OrderingKeyPausedError(topic, key)

        return paused

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        """Let publishes to ``topic`` with ``ordering_key`` go again after a failed
        publish paused them (see :meth:`streamsub.Client.resume_publish`)."""
        self._loop.call(self._resume_publish, topic, ordering_key)

    async def _resume_publish(self, topic: str, ordering_key: str) -> None:
        self._client.resume_publish(topic, ordering_key)

    def publish_many(
        self, topic: str, messages: Iterable[OutgoingMessage | bytes]
    ) -> concurrent.futures.Future[list[str]]:
        """Publish many messages (``OutgoingMessage`` or plain bytes); return at once a
        future of their ids, in order. Every message is checked before any is
        written. Waits for room for the whole call as :meth:`publish` does."""
        self._loop.check_caller()
        messages = list(messages)
        size = sum(
            size_of(m.data, m.ordering_key, m.attributes)
            if isinstance(m, OutgoingMessage)
            else size_of(m)
            for m in messages
        )
        count = len(messages)
        keys = [m.ordering_key for m in messages if isinstance(m, OutgoingMessage)]
        try:
            entered = bool(count) and self._room.enter(count, size, self._pause_check(topic, keys))
        except OrderingKeyPausedError as exc:
            return _failed(exc)
        try:
            future = _uncancellable(self._loop.submit(self._client.publish_many, topic, messages))
        except BaseException:
            if entered:
                self._room.leave(count, size)
            raise
        if entered:
            self._room.leave_when_done(future, count, size)
        return future

    # --- subscribing -----------------------------------------------------------
    def subscribe(
        self,
        subscription: str,
        callback: Handler,
        *,
        flow_control: FlowControl | None = None,
        ack_mode: AckMode = "auto",
        consumer: str | None = None,
        max_lease_duration: float | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        consumer_expiry: float = DEFAULT_CONSUMER_EXPIRY,
        handler_threads: int = DEFAULT_HANDLER_THREADS,
    ) -> StreamingPullFuture:
        """Stream ``subscription`` to ``callback`` in the background until
        :meth:`StreamingPullFuture.cancel` or :meth:`close`.

        The settings and their defaults are those of
        :meth:`streamsub.Client.subscribe`. ``callback`` is a plain ``def``
        (run in a pool of ``handler_threads`` threads) or an ``async def`` (run
        on this client's loop; it must not call this blocking client). With
        ``ack_mode="auto"`` (default) a callback that returns acks and one that
        raises nacks; with ``"manual"`` it calls ``message.ack()`` or
        ``message.nack()``.

        Returns once the subscriber has started; raises at once what starting
        raises (bad settings, :class:`~streamsub.SubscriptionNotFoundError` for
        a subscription that does not exist), as entering the async ``async
        with`` does. What stops it later is raised by ``result()``.
        """
        return self._loop.call(
            self._subscribe,
            subscription,
            callback,
            flow_control=flow_control,
            ack_mode=ack_mode,
            consumer=consumer,
            max_lease_duration=max_lease_duration,
            shutdown_timeout=shutdown_timeout,
            consumer_expiry=consumer_expiry,
            handler_threads=handler_threads,
        )

    async def _subscribe(
        self,
        subscription: str,
        callback: Handler,
        *,
        flow_control: FlowControl | None,
        ack_mode: AckMode,
        consumer: str | None,
        max_lease_duration: float | None,
        shutdown_timeout: float,
        consumer_expiry: float,
        handler_threads: int,
    ) -> StreamingPullFuture:
        subscriber = self._client.subscribe(
            subscription,
            callback,
            flow_control=flow_control,
            ack_mode=ack_mode,
            consumer=consumer,
            max_lease_duration=max_lease_duration,
            shutdown_timeout=shutdown_timeout,
            consumer_expiry=consumer_expiry,
            handler_threads=handler_threads,
        )
        await subscriber.start()
        future = StreamingPullFuture(self._loop, subscriber)
        self._subscribers.add(future)
        watcher = asyncio.get_running_loop().create_task(self._watch(future))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return future

    async def _watch(self, future: StreamingPullFuture) -> None:
        """Resolve ``future`` once its subscriber stopped, with what stopped it."""
        subscriber = future._subscriber
        error: BaseException | None = None
        try:
            await subscriber.wait()
        except asyncio.CancelledError:
            # The loop is going away under a subscriber close() did not see.
            future._cancel_requested = True
            future._finish(None)
            raise
        except BaseException as exc:
            error = exc
        finally:
            self._subscribers.discard(future)
        # Stopped on its own (an error): leave the client's set of subscribers.
        await subscriber.stop()
        future._finish(error)

    # --- topics ----------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        retention: Retention | None = None,
    ) -> Topic:
        """Create a topic; see :meth:`streamsub.Client.create_topic`."""
        return self._loop.call(
            self._client.create_topic, name, partitions=partitions, retention=retention
        )

    def get_topic(self, name: str) -> Topic:
        """The topic ``name``; raises :class:`~streamsub.TopicNotFoundError` if none."""
        return self._loop.call(self._client.get_topic, name)

    def locate_partitions(self, topic: str) -> list[PartitionNode]:
        """Per partition of ``topic``, the server that holds it now; see
        :meth:`streamsub.Client.locate_partitions`."""
        return self._loop.call(self._client.locate_partitions, topic)

    def list_topics(self) -> list[Topic]:
        """Every topic, sorted by name."""
        return self._loop.call(self._client.list_topics)

    def delete_topic(self, name: str, *, force: bool = False) -> None:
        """Delete a topic; see :meth:`streamsub.Client.delete_topic`."""
        return self._loop.call(self._client.delete_topic, name, force=force)

    def update_topic_retention(self, name: str, retention: Retention | None) -> Topic:
        """Give topic ``name`` a new retention policy; see
        :meth:`streamsub.Client.update_topic_retention`."""
        return self._loop.call(self._client.update_topic_retention, name, retention)

    def enforce_retention(self, topic: str) -> RetentionResult:
        """Run one retention pass over ``topic`` now; see
        :meth:`streamsub.Client.enforce_retention`."""
        return self._loop.call(self._client.enforce_retention, topic)

    # --- subscriptions ---------------------------------------------------------
    def create_subscription(
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
        """Create a subscription on ``topic``; see
        :meth:`streamsub.Client.create_subscription` for the settings."""
        return self._loop.call(
            self._client.create_subscription,
            name,
            topic=topic,
            start=start,
            ack_deadline=ack_deadline,
            max_delivery_attempts=max_delivery_attempts,
            dead_letter_topic=dead_letter_topic,
            retry_policy=retry_policy,
            enable_message_ordering=enable_message_ordering,
            enable_exactly_once_delivery=enable_exactly_once_delivery,
        )

    def get_subscription(self, name: str) -> Subscription:
        """The subscription ``name``; raises :class:`~streamsub.SubscriptionNotFoundError`."""
        return self._loop.call(self._client.get_subscription, name)

    def list_subscriptions(self, topic: str | None = None) -> list[Subscription]:
        """Every subscription (of ``topic``), sorted by name."""
        return self._loop.call(self._client.list_subscriptions, topic)

    def delete_subscription(self, name: str) -> None:
        """Delete a subscription; its running subscribers stop with
        :class:`~streamsub.SubscriptionNotFoundError`."""
        return self._loop.call(self._client.delete_subscription, name)

    def subscription_stats(self, name: str) -> SubscriptionStats:
        """Messages, pending and lag of a subscription, summed over partitions."""
        return self._loop.call(self._client.subscription_stats, name)

    # --- seek and snapshots ------------------------------------------------------
    def seek(self, subscription: str, *, to: datetime.datetime | str) -> SeekResult:
        """Move ``subscription`` to ``to``; see :meth:`streamsub.Client.seek`."""
        return self._loop.call(self._client.seek, subscription, to=to)

    def create_snapshot(self, name: str, subscription: str) -> Snapshot:
        """Record ``subscription``'s state as snapshot ``name``; see
        :meth:`streamsub.Client.create_snapshot`."""
        return self._loop.call(self._client.create_snapshot, name, subscription)

    def get_snapshot(self, name: str) -> Snapshot:
        """The snapshot ``name``; raises :class:`~streamsub.NotFoundError` if none."""
        return self._loop.call(self._client.get_snapshot, name)

    def list_snapshots(self) -> list[Snapshot]:
        """Every snapshot, sorted by name."""
        return self._loop.call(self._client.list_snapshots)

    def delete_snapshot(self, name: str) -> None:
        """Delete snapshot ``name``; raises :class:`~streamsub.NotFoundError` if none."""
        return self._loop.call(self._client.delete_snapshot, name)

    # --- dead letters ------------------------------------------------------------
    def list_dead_letters(self, subscription: str, *, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` messages dead-lettered from ``subscription``; see
        :meth:`streamsub.Client.list_dead_letters`."""
        return self._loop.call(self._client.list_dead_letters, subscription, limit=limit)

    def get_dead_letter(self, subscription: str, message_id: str) -> DeadLetter:
        """One dead letter of ``subscription`` by its id in the dead-letter topic."""
        return self._loop.call(self._client.get_dead_letter, subscription, message_id)

    def replay_dead_letters(
        self,
        subscription: str,
        *,
        to: str | None = None,
        message_ids: Iterable[str] | None = None,
    ) -> int:
        """Publish dead letters again and delete them; see
        :meth:`streamsub.Client.replay_dead_letters`."""
        ids = None if message_ids is None else list(message_ids)
        return self._loop.call(
            self._client.replay_dead_letters, subscription, to=to, message_ids=ids
        )

    def purge_dead_letters(
        self, subscription: str, *, message_ids: Iterable[str] | None = None
    ) -> int:
        """Delete ``subscription``'s dead letters (all, or ``message_ids``); return how many."""
        ids = None if message_ids is None else list(message_ids)
        return self._loop.call(self._client.purge_dead_letters, subscription, message_ids=ids)

    # --- statistics ----------------------------------------------------------------
    def stats(self, topic: str | None = None) -> Stats:
        """Reports on every topic and subscription (or on ``topic``); see
        :meth:`streamsub.Client.stats`."""
        return self._loop.call(self._client.stats, topic)


async def _nothing() -> None:
    """Nothing to close: the client never opened."""


def _failed(error: BaseException) -> concurrent.futures.Future[Any]:
    """A future that has already failed with ``error``."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_exception(error)
    return future


T = TypeVar("T")


class _PublishFuture(concurrent.futures.Future[T]):
    """A publish's future. As Pub/Sub's, it cannot be cancelled (:meth:`cancel`
    returns False): once ``publish`` has returned, the message is on its way and
    may be stored whatever its caller does."""

    def cancel(self) -> bool:
        return False


def _uncancellable(inner: concurrent.futures.Future[T]) -> concurrent.futures.Future[T]:
    """``inner``'s outcome, in a future that refuses to be cancelled."""
    outer: _PublishFuture[T] = _PublishFuture()

    def copy(done: concurrent.futures.Future[T]) -> None:
        if done.cancelled():  # the loop stopped under it
            outer.set_exception(
                ClosedError(
                    "the client closed before the publish completed; the message may "
                    "or may not be stored"
                )
            )
        elif (error := done.exception()) is not None:
            outer.set_exception(error)
        else:
            outer.set_result(done.result())

    inner.add_done_callback(copy)
    return outer

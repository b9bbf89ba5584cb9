"""The contract every benchmarked implementation follows, and the process plumbing.

An implementation provides four coroutines:

* ``reset()``    -- forget everything left over by an earlier round (the runner has
  already sent FLUSHALL to redis; only non-redis peers need more);
* ``setup()``    -- create what a round needs before anything is published (topics,
  subscriptions, streams); runs in the orchestrating process, untimed;
* ``publish(n, size)``   -- publish ``n`` stamped messages as fast as possible and
  return the elapsed seconds (time until the server confirmed the last one);
* ``consume(n, ready)``  -- subscribe, call ``ready()`` once messages published from
  now on are sure to be delivered, receive and acknowledge all ``n`` messages
  and return a :class:`ConsumeResult`.

For benchmarks/latency.py an implementation also offers ``open_sender(size)``: a
connection that sends a burst of stamped messages without waiting for the one
before, which :class:`PacedPublish` calls at a steady rate.

An implementation that also runs on Redis Cluster names the class that does
(:meth:`Implementation.cluster_variant`); the runners' ``--cluster`` option
starts a private cluster and runs those beside the standalone rows, with an
:class:`Env` whose ``redis_url`` is the cluster's ``redis+cluster://`` URL.

``publish`` and ``consume`` always run in freshly spawned interpreters
(:func:`run_publish`, :func:`run_end_to_end`, :func:`run_pair`), so no implementation shares an
event loop, a garbage collector or imported modules with another.

Every message body is ``size`` bytes: a 16-byte header -- the publish wall-clock
time (``time.time_ns()``, taken when the message is built, just before it is sent)
and a sequence number -- then padding. The sequence number lets the consumer count
*distinct* messages, so a redelivery is noticed instead of being counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import queue
import struct
import threading
import time
import traceback
from abc import ABC, abstractmethod
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

    from redis.asyncio import Redis
    from redis.asyncio.cluster import ClusterNode

HEADER = struct.Struct(">QQ")
"""Publish time in ns since the epoch, then the message's sequence number."""

MIN_SIZE = HEADER.size

_SPAWN = multiprocessing.get_context("spawn")

STALL_SECONDS = 30.0
"""Once the publisher is done, a consumer that makes no progress for this long fails."""

_PROGRESS_EVERY = 256
_progress: Any = None
"""In a consumer process: a shared counter of distinct messages received, for the parent."""


CLUSTER_SCHEME = "redis+cluster://"


@dataclasses.dataclass(frozen=True, slots=True)
class Env:
    """Where the servers of this run listen. Picklable: it travels to child processes.
    ``redis_url`` is a ``redis://`` URL, or a cluster's ``redis+cluster://host:port,...``."""

    redis_url: str
    nats_url: str | None = None
    nats_storage: str = "memory"

    @property
    def cluster(self) -> bool:
        """Whether ``redis_url`` names a Redis Cluster."""
        return self.redis_url.startswith(CLUSTER_SCHEME)


def cluster_nodes(url: str) -> list[ClusterNode]:
    """The nodes a ``redis+cluster://host:port,host:port`` URL names (no auth: the
    benchmarks' private cluster has none)."""
    from redis.asyncio.cluster import ClusterNode

    hosts = url.removeprefix(CLUSTER_SCHEME).split("/", 1)[0].split(",")
    return [ClusterNode(host, int(port)) for host, _, port in (h.rpartition(":") for h in hosts)]


@contextlib.asynccontextmanager
async def redis_nodes(url: str) -> AsyncIterator[list[Redis]]:
    """A client on each server that holds data: the one server of a ``redis://``
    URL, or each master of a cluster."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    if url.startswith(CLUSTER_SCHEME):
        cluster = RedisCluster(startup_nodes=cluster_nodes(url))
        try:
            await cluster.initialize()
            masters = cluster.get_primaries()
            clients = [Redis(host=node.host, port=int(node.port)) for node in masters]
        finally:
            await cluster.aclose()
    else:
        clients = [Redis.from_url(url)]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()


@dataclasses.dataclass(slots=True)
class ConsumeResult:
    """What a consumer saw. Latencies are in ns, one per distinct message, in the
    order received; ``seqs`` holds the sequence number of each."""

    latencies_ns: array[int]
    first_publish_ns: int
    last_ack_ns: int
    deliveries: int
    distinct: int
    seqs: array[int] = dataclasses.field(default_factory=lambda: array("q"))


@dataclasses.dataclass(frozen=True, slots=True)
class PublishResult:
    n: int
    elapsed_s: float

    @property
    def throughput(self) -> float:
        return self.n / self.elapsed_s


@dataclasses.dataclass(frozen=True, slots=True)
class EndToEndResult:
    n: int
    elapsed_s: float
    """Time of the last ack minus the publish time of the first message."""
    publisher_elapsed_s: float
    latencies_ms: dict[str, float]
    duplicates: int

    @property
    def throughput(self) -> float:
        return self.n / self.elapsed_s


@dataclasses.dataclass(frozen=True, slots=True)
class PathResult:
    """One round of one publish path (see benchmarks/paths.py)."""

    n: int
    elapsed_s: float
    latencies_ms: dict[str, float] | None = None
    """For ``each``: each publish's latency, summarised."""

    @property
    def throughput(self) -> float:
        return self.n / self.elapsed_s


WARMUP = 20
"""Messages published, untimed, before an ``each``/``workers``/``calls`` run
(for ``calls``, as calls of one message each, which reach every partition and
so every master): connections are open and a library's first-publish lookups
are done. They are stored too."""


SendBurst = Callable[[Sequence[tuple[int, bytes]]], Awaitable[object]]
"""Send a burst of ``(sequence number, body)`` messages; the awaitable completes
when the server has confirmed them all. Bursts may overlap: the caller does not
wait for one before sending the next."""


class BenchmarkError(RuntimeError):
    """A round failed: a child process crashed, timed out or lost messages."""


# -- message stamping ------------------------------------------------------------------


def padding(size: int) -> bytes:
    if size < MIN_SIZE:
        msg = f"message size must be at least {MIN_SIZE} bytes, got {size}"
        raise ValueError(msg)
    return b"x" * (size - MIN_SIZE)


def stamp(seq: int, pad: bytes) -> bytes:
    """A message body carrying the current wall-clock time and ``seq``."""
    return HEADER.pack(time.time_ns(), seq) + pad


class Receiver:
    """Consumer-side bookkeeping: latencies, distinct count, first publish time."""

    __slots__ = (
        "_seen",
        "deliveries",
        "distinct",
        "done",
        "first_publish_ns",
        "latencies",
        "n",
        "seqs",
    )

    def __init__(self, n: int) -> None:
        self.n = n
        self._seen = bytearray(n)
        self.deliveries = 0
        self.distinct = 0
        self.first_publish_ns = 0
        self.latencies: array[int] = array("q")
        self.seqs: array[int] = array("q")
        self.done = asyncio.Event()

    @property
    def complete(self) -> bool:
        return self.distinct >= self.n

    def on_message(self, body: bytes) -> None:
        """Record one delivered message body; call it where user code would handle it."""
        now = time.time_ns()
        published, seq = HEADER.unpack_from(body)
        self.deliveries += 1
        if self._seen[seq]:
            return
        self._seen[seq] = 1
        self.distinct += 1
        self.latencies.append(now - published)
        self.seqs.append(seq)
        if self.first_publish_ns == 0 or published < self.first_publish_ns:
            self.first_publish_ns = published
        if _progress is not None and (
            self.distinct % _PROGRESS_EVERY == 0 or self.distinct >= self.n
        ):
            _progress.value = self.distinct
        if self.distinct >= self.n:
            self.done.set()

    def result(self, last_ack_ns: int) -> ConsumeResult:
        return ConsumeResult(
            latencies_ns=self.latencies,
            first_publish_ns=self.first_publish_ns,
            last_ack_ns=last_ack_ns,
            deliveries=self.deliveries,
            distinct=self.distinct,
            seqs=self.seqs,
        )


class _LoopEvent(asyncio.Event):
    """An ``asyncio.Event`` that may be set from any thread: off the event loop's
    thread, ``set`` is handed to the loop with ``call_soon_threadsafe``."""

    def __init__(self) -> None:
        super().__init__()
        self._owner = asyncio.get_running_loop()
        self._owner_thread = threading.get_ident()

    def set(self) -> None:
        if threading.get_ident() == self._owner_thread:
            super().set()
        else:
            self._owner.call_soon_threadsafe(super().set)


class ThreadSafeReceiver(Receiver):
    """A :class:`Receiver` for handlers that run in a thread pool: one lock around
    the bookkeeping, and ``done`` set on the event loop. Create it on the loop."""

    __slots__ = ("_lock",)

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self._lock = threading.Lock()
        self.done = _LoopEvent()

    def on_message(self, body: bytes) -> None:
        with self._lock:
            super().on_message(body)


async def wait_until_all_acked(
    *clients: Redis, poll_interval: float = 0.0005, timeout: float = 30.0
) -> int:
    """Wait until no consumer group of any stream in the databases of ``clients``
    (one server, or each master of a cluster: :func:`redis_nodes`) has pending entries.

    For libraries that acknowledge after the handler returns, out of our sight: once
    the consumer has *handled* every message, the moment the servers' pending count
    reaches zero is the moment of the last ack (within one poll). Returns that
    moment as ``time.time_ns()``.
    """
    keys = [
        [key async for key in client.scan_iter(_type="STREAM", count=1000)] for client in clients
    ]

    async def pending_on(client: Redis, streams: list[Any]) -> int:
        async with client.pipeline(transaction=False) as pipe:
            for key in streams:
                pipe.xinfo_groups(key)
            replies: list[list[dict[Any, Any]]] = await pipe.execute()
        return sum(int(group["pending"]) for groups in replies for group in groups)

    deadline = time.monotonic() + timeout
    while True:
        pending = 0
        for client, streams in zip(clients, keys, strict=True):
            pending += await pending_on(client, streams)
        if pending == 0:
            return time.time_ns()
        if time.monotonic() > deadline:
            msg = f"{pending} messages still unacknowledged after {timeout}s"
            raise BenchmarkError(msg)
        await asyncio.sleep(poll_interval)


# -- the implementation contract ------------------------------------------------------


class Implementation(ABC):
    """One messaging implementation under test."""

    name: ClassVar[str]

    def __init__(self, env: Env) -> None:
        self.env = env

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this implementation cannot run here (it is then skipped), or None.
        Called once in the orchestrating process, before any round."""
        return None

    async def reset(self) -> None:  # noqa: B027 - optional hook
        """Drop state a previous round left outside redis (redis itself is flushed)."""

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Create what a round needs (topics, groups...) before the timed part."""

    @classmethod
    def cluster_variant(cls) -> type[Implementation] | None:
        """The class that runs this implementation on a Redis Cluster (given an
        :class:`Env` with a ``redis+cluster://`` URL), or None: no cluster rows."""
        return None

    async def flush(self) -> None:
        """``FLUSHALL`` on the Redis server, or on every master of the cluster."""
        async with redis_nodes(self.env.redis_url) as clients:
            for client in clients:
                await client.flushall()

    async def stored_count(self) -> int:
        """How many messages the servers hold: the sum of XLEN over every stream."""
        total = 0
        async with redis_nodes(self.env.redis_url) as clients:
            for client in clients:
                keys = [key async for key in client.scan_iter(_type="STREAM", count=1000)]
                async with client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.xlen(key)
                    lengths: list[int] = await pipe.execute()
                total += sum(lengths)
        return total

    @abstractmethod
    async def publish(self, n: int, size: int) -> float:
        """Publish n stamped messages of ``size`` bytes; return the elapsed seconds."""

    @abstractmethod
    async def consume(self, n: int, ready: Callable[[], None]) -> ConsumeResult:
        """Receive and ack n distinct messages; call ``ready`` once subscribed."""

    # -- publishing at a steady rate (optional: benchmarks/latency.py) ----------------

    def open_sender(self) -> AbstractAsyncContextManager[SendBurst]:
        """A connection that sends bursts of messages as a user publishing at a
        steady rate would (one ``publish`` call per message where the library
        has one), for :class:`PacedPublish`."""
        raise NotImplementedError

    @classmethod
    def sends(cls) -> bool:
        """Whether this implementation offers :meth:`open_sender`."""
        return cls.open_sender is not Implementation.open_sender

    # -- publishing as users publish (optional: benchmarks/paths.py) -----------------

    async def publish_each(self, n: int, size: int) -> tuple[float, array[int]]:
        """One caller awaiting each publish in turn: elapsed seconds and each
        publish's latency in ns (:func:`each_in_turn`), after WARMUP publishes."""
        raise NotImplementedError

    async def publish_workers(self, n: int, size: int, workers: int) -> float:
        """``workers`` concurrent callers, each awaiting its publishes one by one,
        taking sequence numbers from a shared counter (:func:`worker_pool`)."""
        raise NotImplementedError

    async def publish_calls(self, n: int, size: int, per_call: int) -> float:
        """The library's batch call (``publish_many``, a pipeline), ``per_call``
        messages a call, one call after the other."""
        raise NotImplementedError

    @classmethod
    def publishes(cls, path: str) -> bool:
        """Whether this implementation offers the publish path ``path``."""
        method = getattr(cls, f"publish_{path}")
        return method is not getattr(Implementation, f"publish_{path}")

    async def path_in_child(
        self, path: str, param: int, n: int, size: int, timeout: float
    ) -> PathResult:
        """One publish path, in a fresh process."""
        return await run_path(self, path, param, n, size, timeout)

    async def publish_in_child(self, n: int, size: int, timeout: float) -> PublishResult:
        """The publish scenario, in a fresh process."""
        return await run_publish(self, n, size, timeout)

    async def end_to_end(self, n: int, size: int, timeout: float) -> EndToEndResult:
        """The end-to-end scenario: publisher and consumer in two concurrent processes."""
        return await run_end_to_end(self, n, size, timeout)


# -- publish paths --------------------------------------------------------------------


async def warm_up(publish_one: Callable[[int], Awaitable[object]]) -> None:
    """WARMUP publishes, untimed, with sequence numbers past any run's."""
    for seq in range(WARMUP):
        await publish_one(10**9 + seq)


async def each_in_turn(
    n: int, publish_one: Callable[[int], Awaitable[object]]
) -> tuple[float, array[int]]:
    """Await ``publish_one(seq)`` for seq in 0..n-1, one after the other."""
    await warm_up(publish_one)
    latencies: array[int] = array("q")
    clock = time.perf_counter_ns
    start = clock()
    for seq in range(n):
        began = clock()
        await publish_one(seq)
        latencies.append(clock() - began)
    return (clock() - start) / 1e9, latencies


async def calls_in_turn(
    n: int, per_call: int, publish_call: Callable[[range], Awaitable[object]]
) -> float:
    """Await ``publish_call(seqs)`` (the library's batch call of the messages
    ``seqs``) for each ``per_call`` of 0..n-1, one call after the other, after
    WARMUP untimed calls of one message each, as :func:`each_in_turn` warms up."""
    for seq in range(10**9, 10**9 + WARMUP):
        await publish_call(range(seq, seq + 1))
    start = time.perf_counter()
    for base in range(0, n, per_call):
        await publish_call(range(base, min(base + per_call, n)))
    return time.perf_counter() - start


async def worker_pool(
    n: int, workers: int, publish_one: Callable[[int], Awaitable[object]]
) -> float:
    """``workers`` coroutines, each awaiting ``publish_one`` in a loop over one
    shared counter until n are published: a worker pool, not n coroutines behind
    a semaphore (on Python 3.11 ``asyncio.Semaphore`` wakes waiters in O(waiters))."""
    await warm_up(publish_one)
    sequence = iter(range(n))

    async def worker() -> None:
        for seq in sequence:  # shared: each number is taken once
            await publish_one(seq)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return time.perf_counter() - start


# -- a steady publish rate ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PacedResult:
    """What a paced publisher did. ``lateness_ms`` summarises how far behind its
    schedule each burst went out: the part of the delay a message's own
    timestamp does not show (it is stamped when it is sent)."""

    sent: int
    elapsed_s: float
    bursts: int
    max_in_flight: int
    lateness_ms: dict[str, float]

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else float("inf")


@dataclasses.dataclass(frozen=True, slots=True)
class PacedPublish:
    """A publisher job: ``round(rate * seconds)`` messages at a steady ``rate``.

    Message ``i`` is due at ``start + i / rate``: the schedule is absolute, so a
    late wake-up does not push later messages back (no drift). Each wake-up sends
    every message due by then as one burst -- one message per wake-up at low
    rates, a few at high rates, where the event loop's timer (``epoll``: whole
    milliseconds) wakes less often than messages fall due -- and does not wait for
    the burst's confirmation: bursts overlap, as independent callers' publishes
    would. Picklable: it travels to the publisher process.
    """

    rate: float
    seconds: float
    size: int

    @property
    def n(self) -> int:
        return round(self.rate * self.seconds)

    async def __call__(self, impl: Implementation) -> PacedResult:
        pad = padding(self.size)
        n, rate = self.n, self.rate
        clock = time.monotonic
        in_flight: set[asyncio.Future[object]] = set()
        errors: list[BaseException] = []
        lateness: array[int] = array("q")
        max_in_flight = bursts = sent = 0

        def settled(future: asyncio.Future[object]) -> None:
            in_flight.discard(future)
            if not future.cancelled() and future.exception() is not None:
                errors.append(future.exception())  # type: ignore[arg-type]

        async with impl.open_sender() as send:
            start = clock()
            while sent < n and not errors:
                now = clock()
                due = min(n, int((now - start) * rate) + 1)
                if due > sent:
                    lateness.append(int((now - (start + sent / rate)) * 1e9))
                    burst = [(seq, stamp(seq, pad)) for seq in range(sent, due)]
                    future = asyncio.ensure_future(send(burst))
                    in_flight.add(future)
                    future.add_done_callback(settled)
                    max_in_flight = max(max_in_flight, len(in_flight))
                    bursts += 1
                    sent = due
                if sent < n:
                    await asyncio.sleep(max(0.0, start + sent / rate - clock()))
            elapsed = clock() - start
            await asyncio.gather(*in_flight, return_exceptions=True)
        if errors:
            raise errors[0]
        return PacedResult(
            sent=sent,
            elapsed_s=elapsed,
            bursts=bursts,
            max_in_flight=max_in_flight,
            lateness_ms=latency_summary(lateness),
        )


# -- child processes ------------------------------------------------------------------


PublisherJob = Callable[["Implementation"], Coroutine[Any, Any, Any]]
"""What a publisher process runs (picklable): all n at once, or at a steady rate."""


@dataclasses.dataclass(frozen=True, slots=True)
class PublishAll:
    """A publisher job: ``impl.publish(n, size)``, as fast as it goes."""

    n: int
    size: int

    def __call__(self, impl: Implementation) -> Coroutine[Any, Any, float]:
        return impl.publish(self.n, self.size)


def _publisher_main(impl: Implementation, job: PublisherJob, results: Queue[Any]) -> None:
    try:
        value = asyncio.run(job(impl))
    except BaseException:
        results.put(("error", traceback.format_exc()))
    else:
        results.put(("ok", value))


def _consumer_main(
    impl: Implementation,
    n: int,
    timeout: float,
    ready: Event,
    results: Queue[Any],
    progress: Any,
) -> None:
    global _progress
    _progress = progress
    try:
        result = asyncio.run(asyncio.wait_for(impl.consume(n, ready.set), timeout))
    except BaseException:
        results.put(("error", traceback.format_exc()))
    else:
        results.put(("ok", result))


class _StallWatch:
    """Fails a consumer whose progress counter has not moved for STALL_SECONDS."""

    def __init__(self, progress: Any, n: int) -> None:
        self.progress = progress
        self.n = n
        self.seen = progress.value
        self.since = time.monotonic()

    def check(self) -> None:
        value = self.progress.value
        now = time.monotonic()
        if value != self.seen:
            self.seen, self.since = value, now
        elif now - self.since > STALL_SECONDS:
            msg = (
                f"consumer stalled after {value:,}+ of {self.n:,} distinct messages "
                f"(no progress for {STALL_SECONDS:.0f}s after the publisher finished)"
            )
            raise BenchmarkError(msg)


async def _wait_for(
    what: str,
    proc: SpawnProcess,
    poll: Callable[[float], Any],
    deadline: float,
    stall: _StallWatch | None = None,
) -> Any:
    """Poll ``poll(timeout)`` (blocking, run in a thread) until it returns non-None."""
    while True:
        got = await asyncio.to_thread(poll, 0.2)
        if got is not None:
            return got
        if stall is not None:
            stall.check()
        if not proc.is_alive():
            got = await asyncio.to_thread(poll, 1.0)  # it may have answered, then exited
            if got is not None:
                return got
            msg = f"{what}: process exited with code {proc.exitcode} without a result"
            raise BenchmarkError(msg)
        if time.monotonic() > deadline:
            msg = f"{what}: timed out"
            raise BenchmarkError(msg)


def _queue_poll(results: Queue[Any]) -> Callable[[float], Any]:
    def poll(timeout: float) -> Any:
        try:
            return results.get(timeout=timeout)
        except queue.Empty:
            return None

    return poll


def _ready_poll(ready: Event, results: Queue[Any]) -> Callable[[float], Any]:
    """Poll for the consumer's ready signal, or for its error report if it failed first."""

    def poll(timeout: float) -> Any:
        if ready.wait(timeout):
            return ("ready", None)
        try:
            return ("reply", results.get_nowait())
        except queue.Empty:
            return None

    return poll


def _unwrap(what: str, reply: tuple[str, Any]) -> Any:
    status, value = reply
    if status != "ok":
        msg = f"{what} failed:\n{value}"
        raise BenchmarkError(msg)
    return value


def _stop(proc: SpawnProcess) -> None:
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    with contextlib.suppress(ValueError):
        proc.close()


async def run_publish(impl: Implementation, n: int, size: int, timeout: float) -> PublishResult:
    results: Queue[Any] = _SPAWN.Queue()
    proc = _SPAWN.Process(
        target=_publisher_main,
        args=(impl, PublishAll(n, size), results),
        name=f"{impl.name}-publisher",
    )
    proc.start()
    try:
        deadline = time.monotonic() + timeout
        reply = await _wait_for("publisher", proc, _queue_poll(results), deadline)
        elapsed: float = _unwrap("publisher", reply)
    finally:
        _stop(proc)
    return PublishResult(n=n, elapsed_s=elapsed)


def _path_main(
    impl: Implementation, path: str, param: int, n: int, size: int, results: Queue[Any]
) -> None:
    try:
        if path == "each":
            elapsed, latencies = asyncio.run(impl.publish_each(n, size))
            value: Any = (elapsed, latency_summary(latencies))
        elif path == "workers":
            value = (asyncio.run(impl.publish_workers(n, size, param)), None)
        else:
            value = (asyncio.run(impl.publish_calls(n, size, param)), None)
    except BaseException:
        results.put(("error", traceback.format_exc()))
    else:
        results.put(("ok", value))


async def run_path(
    impl: Implementation, path: str, param: int, n: int, size: int, timeout: float
) -> PathResult:
    results: Queue[Any] = _SPAWN.Queue()
    proc = _SPAWN.Process(
        target=_path_main,
        args=(impl, path, param, n, size, results),
        name=f"{impl.name}-{path}-{param}",
    )
    proc.start()
    try:
        deadline = time.monotonic() + timeout
        reply = await _wait_for(f"{path} publisher", proc, _queue_poll(results), deadline)
        elapsed, latencies = _unwrap(f"{path} publisher", reply)
    finally:
        _stop(proc)
    return PathResult(n=n, elapsed_s=elapsed, latencies_ms=latencies)


async def run_end_to_end(impl: Implementation, n: int, size: int, timeout: float) -> EndToEndResult:
    publisher_elapsed, result = await run_pair(impl, n, timeout, PublishAll(n, size))
    elapsed = (result.last_ack_ns - result.first_publish_ns) / 1e9
    return EndToEndResult(
        n=n,
        elapsed_s=elapsed,
        publisher_elapsed_s=publisher_elapsed,
        latencies_ms=latency_summary(result.latencies_ns),
        duplicates=result.deliveries - result.distinct,
    )


async def run_pair(
    impl: Implementation, n: int, timeout: float, job: PublisherJob
) -> tuple[Any, ConsumeResult]:
    """A consumer process expecting ``n`` messages and, once it is subscribed, a
    publisher process running ``job``; both freshly spawned. Returns what the
    publisher's job returned and what the consumer saw (all n, checked)."""
    ready = _SPAWN.Event()
    progress = _SPAWN.RawValue("q", 0)  # one writer (the consumer), read by us
    consumer_results: Queue[Any] = _SPAWN.Queue()
    publisher_results: Queue[Any] = _SPAWN.Queue()
    consumer = _SPAWN.Process(
        target=_consumer_main,
        args=(impl, n, timeout, ready, consumer_results, progress),
        name=f"{impl.name}-consumer",
    )
    publisher = _SPAWN.Process(
        target=_publisher_main,
        args=(impl, job, publisher_results),
        name=f"{impl.name}-publisher",
    )
    deadline = time.monotonic() + timeout + 30.0  # + startup of two interpreters
    consumer.start()
    try:
        kind, reply = await _wait_for(
            "consumer start", consumer, _ready_poll(ready, consumer_results), deadline
        )
        if kind == "reply":  # it answered without signalling ready: an error
            _unwrap("consumer", reply)
            msg = "consumer returned before signalling ready"
            raise BenchmarkError(msg)
        publisher.start()
        try:
            reply = await _wait_for(
                "publisher", publisher, _queue_poll(publisher_results), deadline
            )
            published: Any = _unwrap("publisher", reply)
            stall = _StallWatch(progress, n)
            reply = await _wait_for(
                "consumer", consumer, _queue_poll(consumer_results), deadline, stall
            )
            result: ConsumeResult = _unwrap("consumer", reply)
        finally:
            _stop(publisher)
    finally:
        _stop(consumer)

    if result.distinct != n:
        msg = f"consumer saw {result.distinct} distinct messages, expected {n}"
        raise BenchmarkError(msg)
    return published, result


def latency_summary(latencies_ns: array[int]) -> dict[str, float]:
    """Percentiles (nearest rank) and mean of ns latencies, in milliseconds."""
    ordered = sorted(latencies_ns)
    count = len(ordered)

    def pct(p: float) -> float:
        rank = min(count - 1, max(0, round(p / 100 * count) - 1))
        return ordered[rank] / 1e6

    return {
        "min": ordered[0] / 1e6,
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "p99.9": pct(99.9),
        "max": ordered[-1] / 1e6,
        "mean": sum(ordered) / count / 1e6,
    }

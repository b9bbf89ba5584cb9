"""The demo behind ``streamsub demo``: a whole deployment on one machine, measured.

It starts a private redis-server in a temporary directory, creates a topic and
a subscription, starts subscriber *processes* (spawned, so each is a real
separate client as in production), publishes keyed messages, and checks what
came back. Each message carries its publish wall time in the ``ts`` attribute;
a subscriber notes the message id and ``receive time - ts`` and sends them to
the parent in batches over a queue. The parent merges the ids, so it can count
duplicates and, what matters most, published messages never delivered (lost).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import multiprocessing
import queue as queue_module
import signal
import time
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Table
from rich.text import Text

import streamsub
from streamsub import OutgoingMessage

from ._server import redis_server

__all__ = ["DemoError", "DemoResult", "DemoSettings", "run_demo"]

TOPIC = "demo"
SUBSCRIPTION = "demo-sub"
PUBLISH_CHUNK = 1000
"""Messages per ``publish_many`` call: one full batch."""
PUBLISH_IN_FLIGHT = 4
"""Chunks in flight at once, so one batch is written while the next is encoded."""
REPORT_INTERVAL = 0.1
"""How often a subscriber sends what it received (ids and latencies) to the parent."""
READY_TIMEOUT = 60.0
"""Spawning a process and importing streamsub takes about a second; allow for a slow box."""
STOP_TIMEOUT = 30.0
"""How long subscribers get to flush their acks and report at the end."""
POLL_INTERVAL = 0.05


class DemoError(Exception):
    """The demo could not run (a subscriber process failed, or never got ready)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DemoSettings:
    """What the demo runs: the defaults take well under a minute on two cores."""

    messages: int = 100_000
    subscribers: int = 3
    partitions: int = 16
    keys: int = 1000
    timeout: float = 120.0
    """Seconds to wait, after the last publish, for every message to be acked."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DemoResult:
    """What the demo measured."""

    published: int
    delivered: int
    """Deliveries to handlers, duplicates included."""
    acked: int
    duplicates: int
    lost: int
    """Published ids no subscriber ever received."""
    pending: int
    """Delivered and unacked on the server at the end (0 when all went well)."""
    publish_seconds: float
    end_to_end_seconds: float
    """From the first publish to the last message received."""
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    timed_out: bool

    @property
    def publish_rate(self) -> float:
        """Messages published per second."""
        return self.published / self.publish_seconds if self.publish_seconds else 0.0

    @property
    def end_to_end_rate(self) -> float:
        """Messages published and received per second."""
        return self.published / self.end_to_end_seconds if self.end_to_end_seconds else 0.0


# --- messages from subscriber processes --------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class _Ready:
    worker: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Failed:
    worker: int
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class _Report:
    """What a subscriber received since its last report, and its running ack count."""

    worker: int
    ids: list[str]
    latencies_ms: list[float]
    acked: int
    last_receive: float
    """Wall-clock seconds of its latest delivery (0 before the first)."""
    final: bool


# --- the subscriber process ----------------------------------------------------------
def _worker(worker: int, url: str, reports: Queue[Any], stop: Event) -> None:
    """A subscriber process's main: receive until the parent says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the parent decides
    try:
        asyncio.run(_consume(worker, url, reports, stop))
    except BaseException as exc:
        reports.put(_Failed(worker, repr(exc)))
        raise SystemExit(1) from None


async def _consume(worker: int, url: str, reports: Queue[Any], stop: Event) -> None:
    ids: list[str] = []
    latencies: list[float] = []
    last_ns = 0

    async def handler(message: streamsub.Message) -> None:
        nonlocal last_ns
        now = time.time_ns()
        ids.append(message.message_id)
        sent = message.attributes.get("ts")
        if sent is not None:
            latencies.append((now - int(sent)) / 1e6)
        last_ns = now

    def report(acked: int, *, final: bool) -> None:
        nonlocal ids, latencies
        reports.put(_Report(worker, ids, latencies, acked, last_ns / 1e9, final))
        ids, latencies = [], []

    async with streamsub.connect(url) as client:
        subscriber = client.subscribe(SUBSCRIPTION, handler)
        async with subscriber:
            reports.put(_Ready(worker))
            reported_acked = 0
            while not stop.is_set():
                await asyncio.sleep(REPORT_INTERVAL)
                acked = subscriber.statistics().acked
                if ids or acked != reported_acked:
                    report(acked, final=False)
                    reported_acked = acked
            acked = subscriber.statistics().acked
            await subscriber.stop()  # flushes the acks of what is still running
        report(acked, final=True)


# --- the parent -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class _Timing:
    wall_start: float
    """Wall-clock seconds when publishing began (the subscribers' clock, too)."""
    publish_seconds: float
    timed_out: bool


class _Tally:
    """The parent's merge of every subscriber's reports."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.delivered = 0
        self.duplicates = 0
        self.latencies: list[float] = []
        self.acked: dict[int, int] = {}
        self.last_receive = 0.0
        self.ready: set[int] = set()
        self.finished: set[int] = set()
        self.failures: list[str] = []

    def drain(self, reports: Queue[Any]) -> None:
        while True:
            try:
                item = reports.get_nowait()
            except queue_module.Empty:
                return
            self._take(item)

    def _take(self, item: object) -> None:
        if isinstance(item, _Report):
            before = len(self.seen)
            self.seen.update(item.ids)
            self.delivered += len(item.ids)
            self.duplicates += len(item.ids) - (len(self.seen) - before)
            self.latencies += item.latencies_ms
            self.acked[item.worker] = item.acked
            self.last_receive = max(self.last_receive, item.last_receive)
            if item.final:
                self.finished.add(item.worker)
        elif isinstance(item, _Ready):
            self.ready.add(item.worker)
        elif isinstance(item, _Failed):
            self.failures.append(f"subscriber {item.worker} failed: {item.error}")
            self.finished.add(item.worker)

    def check(self, workers: list[BaseProcess]) -> None:
        """Raise if a subscriber failed or died while it should be running."""
        if self.failures:
            raise DemoError(self.failures[0])
        for index, process in enumerate(workers):
            if process.exitcode is not None and index not in self.finished:
                raise DemoError(f"subscriber process {index} exited with code {process.exitcode}")


class _RateColumn(ProgressColumn):
    """Messages per second over the last couple of seconds."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(f"{speed:>9,.0f} msg/s" if speed else "        - msg/s", style="cyan")


def _percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return math.nan
    rank = max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))
    return ordered[rank]


async def _publish(client: streamsub.Client, settings: DemoSettings, ids: list[str]) -> float:
    """Publish the demo's messages with ordering keys, appending their ids as they land;
    return the monotonic time the last one was stored."""
    keys = [f"key-{k}" for k in range(settings.keys)]
    in_flight: collections.deque[asyncio.Task[list[str]]] = collections.deque()
    try:
        for start in range(0, settings.messages, PUBLISH_CHUNK):
            end = min(settings.messages, start + PUBLISH_CHUNK)
            chunk = [
                OutgoingMessage(
                    data=b"demo message %d" % i,
                    ordering_key=keys[i % settings.keys],
                    attributes={"ts": str(time.time_ns())},
                )
                for i in range(start, end)
            ]
            in_flight.append(asyncio.create_task(client.publish_many(TOPIC, chunk)))
            if len(in_flight) >= PUBLISH_IN_FLIGHT:
                ids += await in_flight.popleft()
        while in_flight:
            ids += await in_flight.popleft()
        return time.monotonic()
    finally:
        for task in in_flight:
            task.cancel()


async def _wait_ready(tally: _Tally, reports: Queue[Any], workers: list[BaseProcess]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while len(tally.ready) < len(workers):
        tally.drain(reports)
        tally.check(workers)
        if time.monotonic() > deadline:
            raise DemoError(
                f"only {len(tally.ready)} of {len(workers)} subscribers were ready "
                f"after {READY_TIMEOUT:g} s"
            )
        await asyncio.sleep(POLL_INTERVAL)


async def _stop_workers(
    tally: _Tally, reports: Queue[Any], stop: Event, workers: list[BaseProcess]
) -> None:
    """Tell subscribers to stop, collect their last reports, and make sure they are gone."""
    stop.set()
    started = [i for i, p in enumerate(workers) if p.pid is not None]
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        tally.drain(reports)
        if all(i in tally.finished or workers[i].exitcode is not None for i in started):
            break
        await asyncio.sleep(POLL_INTERVAL)
    for index in started:
        process = workers[index]
        process.join(timeout=max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
    tally.drain(reports)


async def _run(settings: DemoSettings, url: str, console: Console) -> DemoResult:
    context = multiprocessing.get_context("spawn")
    reports: Queue[Any] = context.Queue()
    stop = context.Event()
    workers: list[BaseProcess] = [
        context.Process(
            target=_worker,
            args=(index, url, reports, stop),
            name=f"streamsub-demo-{index}",
            daemon=True,
        )
        for index in range(settings.subscribers)
    ]
    tally = _Tally()
    published: list[str] = []
    async with streamsub.connect(url) as client:
        await client.create_topic(TOPIC, partitions=settings.partitions)
        await client.create_subscription(SUBSCRIPTION, topic=TOPIC, start="earliest")
        console.print(
            f"topic [bold]{TOPIC}[/] ({settings.partitions} partitions), subscription "
            f"[bold]{SUBSCRIPTION}[/]; starting {settings.subscribers} subscriber processes"
        )
        try:
            began = time.monotonic()
            for process in workers:
                process.start()
            await _wait_ready(tally, reports, workers)
            console.print(f"subscribers ready in {time.monotonic() - began:.1f} s")
            timing = await _measure(client, settings, console, tally, reports, workers, published)
        finally:
            await _stop_workers(tally, reports, stop, workers)
            reports.close()
        stats = await client.subscription_stats(SUBSCRIPTION)
    lost = len(set(published) - tally.seen)
    latencies = sorted(tally.latencies)
    return DemoResult(
        published=len(published),
        delivered=tally.delivered,
        acked=sum(tally.acked.values()),
        duplicates=tally.duplicates,
        lost=lost,
        pending=stats.pending,
        publish_seconds=timing.publish_seconds,
        end_to_end_seconds=max(0.0, tally.last_receive - timing.wall_start),
        latency_p50_ms=_percentile(latencies, 0.50),
        latency_p99_ms=_percentile(latencies, 0.99),
        latency_max_ms=latencies[-1] if latencies else math.nan,
        timed_out=timing.timed_out,
    )


async def _measure(
    client: streamsub.Client,
    settings: DemoSettings,
    console: Console,
    tally: _Tally,
    reports: Queue[Any],
    workers: list[BaseProcess],
    published: list[str],
) -> _Timing:
    """Publish while showing progress; return when every message is acked or time is up."""
    total = settings.messages
    progress = Progress(
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        _RateColumn(),
        console=console,
        speed_estimate_period=2.0,
        refresh_per_second=10,
    )
    wall_start = time.time()
    start = time.monotonic()
    publish_seconds = 0.0
    deadline: float | None = None
    timed_out = False
    with progress:
        bars = {
            name: progress.add_task(name, total=total)
            for name in ("published", "delivered", "acked")
        }
        publisher = asyncio.create_task(_publish(client, settings, published))
        try:
            while True:
                await asyncio.sleep(POLL_INTERVAL)
                tally.drain(reports)
                tally.check(workers)
                progress.update(bars["published"], completed=len(published))
                progress.update(bars["delivered"], completed=len(tally.seen))
                progress.update(bars["acked"], completed=sum(tally.acked.values()))
                if not publisher.done():
                    continue
                if deadline is None:
                    # a failed publish ends the demo with its error
                    publish_seconds = publisher.result() - start
                    deadline = time.monotonic() + settings.timeout
                if len(tally.seen) >= len(published):
                    stats = await client.subscription_stats(SUBSCRIPTION)
                    if stats.pending == 0 and not stats.lag:
                        break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
        finally:
            publisher.cancel()
    return _Timing(wall_start, publish_seconds, timed_out)


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n:,} {noun}{plural * (n != 1)}"


def summary(result: DemoResult, settings: DemoSettings) -> Table:
    """The demo's result as a table."""
    table = Table(
        title="streamsub demo",
        caption=f"{_count(settings.subscribers, 'subscriber process', 'es')}, "
        f"{_count(settings.partitions, 'partition')}, {_count(settings.keys, 'ordering key')}",
        show_header=False,
        title_style="bold",
    )
    table.add_column("what")
    table.add_column("value", justify="right")

    def ok(value: int, *, bad: bool) -> str:
        return f"[bold red]{value:,}[/]" if bad else f"[green]{value:,}[/]"

    table.add_row("published", f"{result.published:,}")
    table.add_row("delivered", f"{result.delivered:,}")
    table.add_row("acked", f"{result.acked:,}")
    table.add_row("duplicates", f"{result.duplicates:,}")
    table.add_row("lost", ok(result.lost, bad=result.lost > 0))
    table.add_row("pending at end", ok(result.pending, bad=result.pending > 0))
    table.add_row("publish throughput", f"{result.publish_rate:,.0f} msg/s")
    table.add_row("end-to-end throughput", f"{result.end_to_end_rate:,.0f} msg/s")
    table.add_row("latency p50", f"{result.latency_p50_ms:,.1f} ms")
    table.add_row("latency p99", f"{result.latency_p99_ms:,.1f} ms")
    table.add_row("latency max", f"{result.latency_max_ms:,.1f} ms")
    table.add_row("end-to-end time", f"{result.end_to_end_seconds:.2f} s")
    if result.timed_out:
        table.add_row("[red]timed out[/]", f"after waiting {settings.timeout:g} s")
    return table


def run_demo(settings: DemoSettings, console: Console) -> DemoResult:
    """Run the demo on an embedded redis-server, print progress and a summary table."""
    with redis_server() as server:
        console.print(
            f"embedded redis-server at [bold]{server.url}[/] (pid {server.pid}, "
            f"data in {server.data_dir}, AOF on)"
        )
        result = asyncio.run(_run(settings, server.url, console))
    console.print(summary(result, settings))
    return result

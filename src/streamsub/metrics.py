"""Prometheus metrics for streamsub: counters kept in-process, exported on request.

The counters cost a dictionary update each and need no extra package; they are
exported through :class:`StreamsubCollector` and :func:`serve`, which need
``prometheus-client`` (``pip install 'streamsub[metrics]'``)::

    import streamsub.metrics
    server = streamsub.metrics.serve(9464)        # http://127.0.0.1:9464/metrics

or ``streamsub pull --metrics-port 9464``. What is exported (labels in braces):

=====================================================  ===========================
``streamsub_published_total{topic}``                   messages stored by publish
``streamsub_delivered_total{subscription}``            handed to a handler
``streamsub_redelivered_total{subscription}``          of those, delivery attempt > 1
``streamsub_acked_total{subscription}``                acknowledged
``streamsub_nacked_total{subscription}``               given back for redelivery
``streamsub_dead_lettered_total{subscription}``        moved to the dead-letter topic
``streamsub_lost_total{subscription}``                 pending entries found trimmed
``streamsub_dropped_unacked_total{topic}``             dropped by a retention hard cap
``streamsub_handler_seconds{subscription}``            handler run time (histogram)
``streamsub_end_to_end_seconds{subscription}``         publish to handling done (histogram)
``streamsub_in_flight_messages{subscription}``         held by this process now (gauge)
=====================================================  ===========================

Counters are per process (each process serves its own, as Prometheus expects);
the topic-wide, cross-process figures are in ``Client.stats()``.

Who reports what: the publisher calls :func:`on_published` once per write
(and once per write again of messages refused behind a failed one), with the
messages it stored (so a publish pays nothing for it), and the
retention trimmer :func:`on_dropped_unacked`. The receiver reports
through the other hooks, each a dictionary update under a lock:
:func:`on_delivered` when a batch is handed to handlers (``redelivered``: those
with delivery attempt > 1), :func:`on_acked` / :func:`on_nacked` with the
counts the backend confirmed, :func:`on_dead_lettered` after each dead letter
is stored, :func:`on_lost` where it counts an entry lost, and
:func:`observe_handler_latencies` (handler run times, a batch of handlers that
ended in one turn of the event loop), :func:`observe_end_to_end_latencies` (now
minus each message's publish time, for a batch of acks the server confirmed); a
running subscriber
registers its held-message count with :func:`watch_in_flight`, read at scrape.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "LATENCY_BUCKETS",
    "StreamsubCollector",
    "on_acked",
    "on_dead_lettered",
    "on_delivered",
    "on_dropped_unacked",
    "on_lost",
    "on_nacked",
    "on_published",
    "observe_end_to_end_latencies",
    "observe_end_to_end_latency",
    "observe_handler_latencies",
    "observe_handler_latency",
    "registry",
    "reset",
    "serve",
    "set_in_flight",
    "snapshot",
    "watch_in_flight",
]

LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
)  # fmt: skip
"""Histogram bucket upper bounds, seconds: a millisecond to five minutes."""

_COUNTERS = {
    "published": ("topic", "Messages stored by publish."),
    "delivered": ("subscription", "Messages handed to a handler."),
    "redelivered": ("subscription", "Messages handed to a handler again (attempt > 1)."),
    "acked": ("subscription", "Messages acknowledged."),
    "nacked": ("subscription", "Messages given back for redelivery."),
    "dead_lettered": ("subscription", "Messages moved to the dead-letter topic."),
    "lost": ("subscription", "Pending messages found deleted by trimming."),
    "dropped_unacked": ("topic", "Unacknowledged messages dropped by a retention hard cap."),
}
_HISTOGRAMS = {
    "handler_seconds": "Time a handler ran, seconds.",
    "end_to_end_seconds": "Time from publish until handling finished, seconds.",
}

_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}
_histograms: dict[tuple[str, str], list[float]] = {}
"""Per (histogram, label): a count per bucket (the last is +Inf), then the sum."""
_in_flight: dict[str, int] = {}
_in_flight_sources: dict[str, list[Callable[[], int]]] = {}


def _add(name: str, label: str, n: int) -> None:
    with _lock:
        key = (name, label)
        _counts[key] = _counts.get(key, 0) + n


def on_published(topic: str, n: int = 1) -> None:
    """``n`` messages were stored in ``topic``."""
    _add("published", topic, n)


def on_delivered(subscription: str, n: int = 1, *, redelivered: int = 0) -> None:
    """``n`` messages were handed to handlers, ``redelivered`` of them not the first time."""
    _add("delivered", subscription, n)
    if redelivered:
        _add("redelivered", subscription, redelivered)


def on_acked(subscription: str, n: int = 1) -> None:
    """``n`` messages were acknowledged."""
    _add("acked", subscription, n)


def on_nacked(subscription: str, n: int = 1) -> None:
    """``n`` messages were given back for redelivery."""
    _add("nacked", subscription, n)


def on_dead_lettered(subscription: str, n: int = 1) -> None:
    """``n`` messages went to the dead-letter topic."""
    _add("dead_lettered", subscription, n)


def on_lost(subscription: str, n: int = 1) -> None:
    """``n`` pending entries were found deleted (trimmed before anyone acked them)."""
    _add("lost", subscription, n)


def on_dropped_unacked(topic: str, n: int) -> None:
    """A retention hard cap dropped ``n`` unacknowledged messages of ``topic``."""
    _add("dropped_unacked", topic, n)


def _observe(name: str, label: str, seconds: float) -> None:
    with _lock:
        key = (name, label)
        row = _histograms.get(key)
        if row is None:
            row = _histograms[key] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        row[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        row[-1] += seconds


def _observe_many(name: str, label: str, values: Iterable[float]) -> None:
    with _lock:
        key = (name, label)
        row = _histograms.get(key)
        if row is None:
            row = _histograms[key] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        where = bisect.bisect_left
        total = 0.0
        for seconds in values:
            row[where(LATENCY_BUCKETS, seconds)] += 1
            total += seconds
        row[-1] += total


def observe_handler_latencies(subscription: str, seconds: Iterable[float]) -> None:
    """Handlers of ``subscription`` ran for ``seconds`` each (one lock for the batch)."""
    _observe_many("handler_seconds", subscription, seconds)


def observe_end_to_end_latencies(subscription: str, seconds: Iterable[float]) -> None:
    """Messages were handled ``seconds`` each after they were published (one lock
    for the batch)."""
    _observe_many("end_to_end_seconds", subscription, seconds)


def observe_handler_latency(subscription: str, seconds: float) -> None:
    """A handler of ``subscription`` ran for ``seconds``."""
    _observe("handler_seconds", subscription, seconds)


def observe_end_to_end_latency(subscription: str, seconds: float) -> None:
    """A message was handled ``seconds`` after it was published."""
    _observe("end_to_end_seconds", subscription, seconds)


def set_in_flight(subscription: str, messages: int) -> None:
    """This process holds ``messages`` of ``subscription`` now (read, not yet settled),
    besides what its subscribers report through :func:`watch_in_flight`."""
    with _lock:
        _in_flight[subscription] = messages


def watch_in_flight(subscription: str, count: Callable[[], int]) -> Callable[[], None]:
    """Count ``count()`` into the in-flight gauge of ``subscription`` at each scrape
    (a running subscriber; several in one process add up); return the function
    that stops it. Nothing runs on the message path."""
    with _lock:
        _in_flight_sources.setdefault(subscription, []).append(count)

    def unwatch() -> None:
        with _lock:
            sources = _in_flight_sources.get(subscription, [])
            if count in sources:
                sources.remove(count)
            if not sources:
                _in_flight_sources.pop(subscription, None)

    return unwatch


def _in_flight_now() -> dict[str, int]:
    with _lock:
        values = dict(_in_flight)
        sources = {name: list(counts) for name, counts in _in_flight_sources.items()}
    for name, counts in sources.items():
        values[name] = values.get(name, 0) + sum(count() for count in counts)
    return values


def snapshot() -> dict[str, dict[str, int]]:
    """The counters as {name: {label: value}} (for tests and quick looks)."""
    with _lock:
        result: dict[str, dict[str, int]] = {name: {} for name in _COUNTERS}
        for (name, label), value in _counts.items():
            result[name][label] = value
        return result


def reset() -> None:
    """Forget every count (for tests)."""
    with _lock:
        _counts.clear()
        _histograms.clear()
        _in_flight.clear()
        _in_flight_sources.clear()


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        from ._errors import FailedPreconditionError

        raise FailedPreconditionError(
            "exporting metrics needs prometheus-client: pip install 'streamsub[metrics]'"
        ) from None
    return prometheus_client


class StreamsubCollector:
    """A prometheus-client collector of streamsub's counters, histograms and gauges."""

    def collect(self) -> Iterator[Any]:
        """The metric families, as prometheus-client asks for them."""
        _prometheus()  # a clear error when it is missing
        from prometheus_client import core

        with _lock:
            counts = dict(_counts)
            histograms = {k: list(v) for k, v in _histograms.items()}
        in_flight = _in_flight_now()
        for name, (label, text) in _COUNTERS.items():
            family = core.CounterMetricFamily(f"streamsub_{name}", text, labels=[label])
            for (counter, value_label), value in sorted(counts.items()):
                if counter == name:
                    family.add_metric([value_label], value)
            yield family
        for name, text in _HISTOGRAMS.items():
            histogram_family = core.HistogramMetricFamily(
                f"streamsub_{name}", text, labels=["subscription"]
            )
            for (histogram, label), row in sorted(histograms.items()):
                if histogram != name:
                    continue
                cumulative, buckets = 0.0, []
                for bound, count in zip((*LATENCY_BUCKETS, float("inf")), row[:-1], strict=True):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
                histogram_family.add_metric([label], buckets, row[-1])
            yield histogram_family
        gauge = core.GaugeMetricFamily(
            "streamsub_in_flight_messages",
            "Messages of a subscription this process holds now.",
            labels=["subscription"],
        )
        for label, value in sorted(in_flight.items()):
            gauge.add_metric([label], value)
        yield gauge


def registry() -> Any:
    """A prometheus-client registry holding only the streamsub collector."""
    prometheus = _prometheus()
    reg = prometheus.CollectorRegistry(auto_describe=False)
    reg.register(StreamsubCollector())
    return reg


def serve(port: int, addr: str = "127.0.0.1") -> Any:
    """Serve the metrics at ``http://addr:port/metrics`` from a background thread
    (default address: loopback only); return the server (``.shutdown()`` stops it)."""
    prometheus = _prometheus()
    server, _thread = prometheus.start_http_server(port, addr=addr, registry=registry())
    return server

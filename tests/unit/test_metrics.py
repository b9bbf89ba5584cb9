"""The in-process counters and their Prometheus exposition, on plain values."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamsub import metrics


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """Every test starts from zero counts."""
    metrics.reset()
    yield
    metrics.reset()


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry()).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_add_up_per_label() -> None:
    """Each hook adds to its counter under its topic or subscription label."""
    metrics.on_published("orders", 100)
    metrics.on_published("orders", 20)
    metrics.on_published("audit")
    metrics.on_delivered("billing", 10, redelivered=3)
    metrics.on_acked("billing", 7)
    metrics.on_nacked("billing", 2)
    metrics.on_dead_lettered("billing")
    metrics.on_lost("billing", 4)
    metrics.on_dropped_unacked("orders", 5)
    samples = _samples()
    assert samples[("streamsub_published_total", (("topic", "orders"),))] == 120
    assert samples[("streamsub_published_total", (("topic", "audit"),))] == 1
    assert samples[("streamsub_delivered_total", (("subscription", "billing"),))] == 10
    assert samples[("streamsub_redelivered_total", (("subscription", "billing"),))] == 3
    assert samples[("streamsub_acked_total", (("subscription", "billing"),))] == 7
    assert samples[("streamsub_nacked_total", (("subscription", "billing"),))] == 2
    assert samples[("streamsub_dead_lettered_total", (("subscription", "billing"),))] == 1
    assert samples[("streamsub_lost_total", (("subscription", "billing"),))] == 4
    assert samples[("streamsub_dropped_unacked_total", (("topic", "orders"),))] == 5
    assert metrics.snapshot()["published"] == {"orders": 120, "audit": 1}


def test_histograms_bucket_latencies_cumulatively() -> None:
    """Latencies land in cumulative buckets with their count and sum."""
    for seconds in (0.0005, 0.003, 0.003, 0.2, 400.0):
        metrics.observe_handler_latency("billing", seconds)
    metrics.observe_end_to_end_latency("billing", 1.5)
    samples = _samples()
    bucket = "streamsub_handler_seconds_bucket"
    label = ("subscription", "billing")
    assert samples[(bucket, (("le", "0.001"), label))] == 1
    assert samples[(bucket, (("le", "0.005"), label))] == 3
    assert samples[(bucket, (("le", "0.25"), label))] == 4
    assert samples[(bucket, (("le", "300.0"), label))] == 4
    assert samples[(bucket, (("le", "+Inf"), label))] == 5
    assert samples[("streamsub_handler_seconds_count", (label,))] == 5
    assert samples[("streamsub_handler_seconds_sum", (label,))] == pytest.approx(400.2065)
    assert samples[("streamsub_end_to_end_seconds_count", (label,))] == 1


def test_in_flight_gauge_shows_the_last_value() -> None:
    """The in-flight gauge reports what was last set per subscription."""
    metrics.set_in_flight("billing", 12)
    metrics.set_in_flight("billing", 3)
    assert _samples()[("streamsub_in_flight_messages", (("subscription", "billing"),))] == 3


def test_in_flight_gauge_adds_up_the_subscribers_of_a_subscription() -> None:
    """Two subscribers of one subscription in a process add up in the gauge, read at
    scrape time; one that stops no longer counts."""
    metrics.reset()
    held = {"a": 25, "b": 15}
    stop_a = metrics.watch_in_flight("billing", lambda: held["a"])
    stop_b = metrics.watch_in_flight("billing", lambda: held["b"])
    key = ("streamsub_in_flight_messages", (("subscription", "billing"),))
    assert _samples()[key] == 40
    held["a"] = 5
    assert _samples()[key] == 20
    stop_a()
    assert _samples()[key] == 15
    stop_b()
    assert key not in _samples()

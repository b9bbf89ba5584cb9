"""The operator's commands (stats, retention, seek, snapshots, dead letters) on a real server."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner, Result

import streamsub
from streamsub.cli import app
from streamsub.testing import RedisServer
from tests._layout import stream_key
from tests._wait import until

from .test_stats import make_known_traffic

STREAMSUB = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from streamsub.cli import main; main()",
]
"""The console script's entry point, run as a real process. Ctrl-C as in a
terminal: a test run started in the background of a shell (``./scripts/test &``)
hands its children SIGINT ignored, and Python keeps it so."""


@pytest.fixture
def cli(server: RedisServer, redis_client: redis.Redis) -> Any:
    """Invoke the CLI in-process on an emptied test server, via STREAMSUB_URL."""
    redis_client.flushall()
    runner = CliRunner(env={"STREAMSUB_URL": server.url, "COLUMNS": "250"})

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(app, list(args), input=input, catch_exceptions=False)

    return invoke


def _with_client(server: RedisServer, body: Callable[[streamsub.Client], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with streamsub.connect(server.url, trim_in_background=False) as client:
            return await body(client)

    return asyncio.run(main())


def test_stats_json_and_table_show_known_traffic(
    cli: Any, server: RedisServer, redis_client: redis.Redis
) -> None:
    """`streamsub stats` prints the known traffic's counts as JSON and in its tables."""
    _with_client(server, lambda client: make_known_traffic(client, redis_client))

    as_json = cli("stats", "orders", "--json")
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    (topic,) = report["topics"]
    assert (topic["topic"], topic["length"], topic["lengths"]) == ("orders", 160, [40] * 4)
    assert topic["publish_rate"] == pytest.approx(16.0)
    billing = next(s for s in report["subscriptions"] if s["subscription"] == "billing")
    assert (billing["backlog"], billing["pending"], billing["dead_letter_topic_length"]) == (
        130,
        30,
        3,
    )
    assert billing["pending_per_consumer"] == {"c1": 20, "c2": 10}
    assert billing["delivery_attempts"] == {"1": 27, "2": 3}
    assert [p["pending"] for p in billing["partitions"]] == [10, 10, 5, 5]

    table = cli("stats", "orders")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    orders_row = next(line for line in lines if line.strip("│ ").startswith("orders"))
    assert "160" in orders_row
    assert "16.0" in orders_row
    billing_row = next(line for line in lines if line.strip("│ ").startswith("billing"))
    for cell in ("130", "30", "c1=20, c2=10", "1x: 27, 2x: 3", "3"):
        assert cell in billing_row, (cell, billing_row)


def test_retention_commands(cli: Any, redis_client: redis.Redis, server: RedisServer) -> None:
    """A topic created with --max-length is trimmed by `retention run` to the policy."""
    created = cli("topic", "create", "logs", "--partitions", "2", "--max-length", "10")
    assert created.exit_code == 0, created.output
    assert "max length 10" in cli("topic", "describe", "logs").stdout
    assert "max length 10" in cli("topic", "list").stdout
    _with_client(server, lambda c: c.publish_many("logs", [b"x"] * 100))
    _with_client(server, lambda c: c.publish_many("logs", [b"y"] * 50))
    lengths = [int(redis_client.xlen(stream_key(redis_client, "logs", p))) for p in range(2)]
    result = cli("retention", "run", "--json")
    assert result.exit_code == 0, result.output
    (logs,) = json.loads(result.stdout)
    expected = sum(max(0, n - 10) for n in lengths)
    assert (logs["topic"], logs["trimmed"], logs["dropped_unacked"]) == ("logs", expected, 0)
    assert [int(redis_client.xlen(stream_key(redis_client, "logs", p))) for p in range(2)] == [
        min(n, 10) for n in lengths
    ]
    changed = cli("topic", "retention", "logs")
    assert "keep everything" in changed.stdout


def test_seek_and_snapshot_commands(cli: Any, server: RedisServer) -> None:
    """Snapshots are created, listed and deleted (after confirmation), and seek moves a
    subscription so its messages are delivered again."""

    async def setup(client: streamsub.Client) -> None:
        await client.create_topic("orders", partitions=3)
        await client.create_subscription("billing", topic="orders")
        await client.publish_many("orders", [str(i).encode() for i in range(30)])

    _with_client(server, setup)
    pulled = cli("pull", "billing", "-n", "30", "--json")
    assert len(json.loads(pulled.stdout)) == 30
    assert cli("snapshot", "create", "snap-1", "--sub", "billing").exit_code == 0
    listed = json.loads(cli("snapshot", "list", "--json").stdout)
    assert [(s["name"], s["subscription"], s["topic"]) for s in listed] == [
        ("snap-1", "billing", "orders")
    ]
    sought = cli("seek", "billing", "--to", "earliest", "--yes")
    assert sought.exit_code == 0, sought.output
    again = cli("pull", "billing", "-n", "30", "--json")
    assert len(json.loads(again.stdout)) == 30
    assert cli("seek", "billing", "--to", "snap-1", "--yes").exit_code == 0
    refused = cli("snapshot", "delete", "snap-1", input="n\n")
    assert refused.exit_code == 1
    assert len(json.loads(cli("snapshot", "list", "--json").stdout)) == 1
    assert cli("snapshot", "delete", "snap-1", input="y\n").exit_code == 0
    assert json.loads(cli("snapshot", "list", "--json").stdout) == []
    assert cli("seek", "billing", "--to", "2024-01-01T00:00:00Z", "--yes").exit_code == 0


def test_dead_letter_commands(cli: Any, server: RedisServer) -> None:
    """Dead letters are listed with metadata, purged and replayed only after a
    confirmation that says how many, and each reports its count."""

    async def setup(client: streamsub.Client) -> None:
        await client.create_topic("orders", partitions=3)
        await client.create_topic("dead", partitions=2)
        await client.create_subscription(
            "billing", topic="orders", dead_letter_topic="dead", max_delivery_attempts=1
        )

        async def refuse(message: streamsub.Message) -> None:
            raise ValueError("bad order")

        async with client.subscribe("billing", refuse) as subscriber:
            await client.publish_many("orders", [f"o{i}".encode() for i in range(9)])
            await until(lambda: subscriber.statistics().dead_lettered == 9, 30, "9 dead letters")

    _with_client(server, setup)
    listed = json.loads(cli("dead-letters", "list", "billing", "--json").stdout)
    assert len(listed) == 9
    assert {d["data"] for d in listed} == {f"o{i}" for i in range(9)}
    assert all(d["source_topic"] == "orders" and "bad order" in d["reason"] for d in listed)
    shown = json.loads(cli("dead-letters", "show", "billing", listed[0]["id"], "--json").stdout)
    assert shown == listed[0]
    assert "bad order" in cli("dead-letters", "list", "billing").stdout

    refused = cli("dead-letters", "purge", "billing", input="n\n")
    assert refused.exit_code == 1
    assert "delete 9 dead letters of 'billing' for good?" in refused.stderr
    assert len(json.loads(cli("dead-letters", "list", "billing", "--json").stdout)) == 9
    chosen = ["--id", listed[0]["id"], "--id", "0-1-0"]  # one of them does not exist
    purged = cli("dead-letters", "purge", "billing", *chosen, input="y\n")
    assert "delete 1 dead letters" in purged.stderr
    assert "purged 1 " in purged.stdout
    asked = cli("dead-letters", "replay", "billing", "--to", "orders", input="n\n")
    assert "replay 8 dead letters of 'billing' to orders?" in asked.stderr
    replayed = cli("dead-letters", "replay", "billing", "--yes")
    assert "replayed 8 " in replayed.stdout
    assert json.loads(cli("dead-letters", "list", "billing", "--json").stdout) == []
    nothing = cli("dead-letters", "purge", "billing")  # asks nothing: there is nothing
    assert (nothing.exit_code, "nothing done" in nothing.stderr) == (0, True)


def test_stats_watch_prints_fresh_figures_until_stopped(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """`streamsub stats --watch --json` prints one report per interval, each read anew,
    until it is stopped."""
    redis_client.flushall()

    async def setup(client: streamsub.Client) -> None:
        await client.create_topic("orders", partitions=2)

    _with_client(server, setup)
    process = subprocess.Popen(
        [*STREAMSUB, "stats", "orders", "--watch", "0.2", "--json", "--url", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        assert first["topics"][0]["length"] == 0
        _with_client(server, lambda c: c.publish_many("orders", [b"x"] * 25))
        lengths = []
        while not lengths or lengths[-1] != 25:
            lengths.append(json.loads(process.stdout.readline())["topics"][0]["length"])
        assert lengths[-1] == 25
    finally:
        _interrupt(process)
    assert process.returncode == 130


def _interrupt(process: subprocess.Popen[Any]) -> None:
    """Ctrl-C ``process``; kill it if it is still running 10 s later (and fail),
    so that it does not go on beside the next tests."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def _background(*args: str) -> subprocess.Popen[bytes]:
    """The streamsub command running as a real process, its output discarded."""
    return subprocess.Popen(
        [*STREAMSUB, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dropped_metric(port: int, host: str = "127.0.0.1") -> float | None:
    """streamsub_dropped_unacked_total{topic="capped"} from the endpoint, None if unreachable."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "streamsub_dropped_unacked_total" and sample.labels == {
                "topic": "capped"
            }:
                return float(sample.value)
    return 0.0


async def test_retention_run_forever_serves_its_metrics(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """`streamsub retention run --forever --metrics-port` trims in the background and its
    endpoint reports exactly the unacknowledged messages its hard cap dropped."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as client:
        await client.create_topic(
            "capped", partitions=2, retention=streamsub.Retention(max_length=4, drop_unacked=True)
        )
        await client.create_subscription("behind", topic="capped")
        await client.publish_many("capped", [b"a"] * 30)
        await client.publish_many("capped", [b"b"] * 20)
    lengths = [int(redis_client.xlen(stream_key(redis_client, "capped", p))) for p in range(2)]
    expected = sum(max(0, n - 4) for n in lengths)
    port = _free_port()
    command = ["retention", "run", "--forever", "--interval", "0.1", "--metrics-port", str(port)]
    process = _background(*command, "--url", server.url)
    try:
        await until(
            lambda: process.poll() is not None or _dropped_metric(port) == expected,
            30,
            f"the endpoint to report {expected} dropped",
        )
        assert process.poll() is None, "retention run --forever ended early"
    finally:
        _interrupt(process)
    assert [int(redis_client.xlen(stream_key(redis_client, "capped", p))) for p in range(2)] == [
        min(n, 4) for n in lengths
    ]


def test_metrics_addr_chooses_the_interface_the_endpoint_binds(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """`--metrics-addr 127.0.0.2` serves the metrics there, not on 127.0.0.1."""
    redis_client.flushall()
    port = _free_port()
    command = ["retention", "run", "--forever", "--interval", "0.1"]
    process = _background(
        *command, "--metrics-port", str(port), "--metrics-addr", "127.0.0.2", "--url", server.url
    )
    try:
        deadline = time.monotonic() + 30
        while _dropped_metric(port, "127.0.0.2") is None:
            assert process.poll() is None, "retention run --forever ended early"
            assert time.monotonic() < deadline, "the endpoint never answered on 127.0.0.2"
            time.sleep(0.05)
        assert _dropped_metric(port, "127.0.0.1") is None
    finally:
        _interrupt(process)


def test_sub_describe_shows_partition_owners_of_an_ordered_subscription(
    cli: Any, server: RedisServer
) -> None:
    """describe names each partition's owner and fencing token (table and --json)."""

    async def setup(client: streamsub.Client) -> None:
        topic = await client.create_topic("ordered", partitions=2)
        await client.create_subscription(
            "ordered-sub", topic="ordered", enable_message_ordering=True
        )
        record = await client._topic_record(topic.name)
        owned = await client._backend.own_partitions(record, "ordered-sub", "worker-1", 30_000)
        tokens.extend(owned.owned[p] for p in range(2))

    tokens: list[int] = []
    _with_client(server, setup)
    described = json.loads(cli("sub", "describe", "ordered-sub", "--json").stdout)
    assert [p["owner"] for p in described["stats"]["partitions"]] == ["worker-1", "worker-1"]
    text = cli("sub", "describe", "ordered-sub").stdout
    for token in tokens:
        assert f"worker-1 ({token})" in text

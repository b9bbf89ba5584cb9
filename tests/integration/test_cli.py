"""The ``streamsub`` command against a real, private redis-server."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner, Result

from streamsub.cli import app
from streamsub.testing import RedisServer, redis_server

# Standalone: the CLI tests run on a private server of their own whatever the session's
# server is (the operator commands on a cluster: test_cli_ops.py).
pytestmark = pytest.mark.standalone

STREAMSUB = [sys.executable, "-c", "from streamsub.cli import main; main()"]
"""The console script's entry point, run as a real process."""


@pytest.fixture(scope="module")
def cli_server() -> Iterator[RedisServer]:
    """A redis-server private to this module, so names cannot clash with other tests."""
    with redis_server() as server:
        yield server


@pytest.fixture
def cli(cli_server: RedisServer) -> Any:
    """Invoke the CLI in-process against the module's server, via STREAMSUB_URL."""
    runner = CliRunner(env={"STREAMSUB_URL": cli_server.url})

    def invoke(*args: str, input: bytes | str | None = None) -> Result:
        return runner.invoke(app, list(args), input=input, catch_exceptions=False)

    return invoke


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_topic_create_list_describe_delete_round_trip(cli: Any) -> None:
    """A created topic shows in list and describe as JSON, and is gone after delete."""
    created = cli("topic", "create", "cli-orders", "--partitions", "4")
    assert created.exit_code == 0, created.output
    assert "cli-orders" in created.stdout

    listed = json.loads(cli("topic", "list", "--json").stdout)
    assert {"name": "cli-orders", "partitions": 4, "subscriptions": []}.items() <= next(
        t for t in listed if t["name"] == "cli-orders"
    ).items()

    described = json.loads(cli("topic", "describe", "cli-orders", "--json").stdout)
    assert described["name"] == "cli-orders"
    assert described["partitions"] == 4

    table = cli("topic", "list")
    assert table.exit_code == 0
    assert "cli-orders" in table.stdout

    assert cli("topic", "delete", "cli-orders").exit_code == 0
    gone = cli("topic", "describe", "cli-orders")
    assert gone.exit_code == 3
    assert "does not exist" in gone.stderr


def test_topic_delete_with_subscriptions_needs_force(cli: Any) -> None:
    """Deleting a topic that has subscriptions exits 4 naming --force, and --force deletes both."""
    cli("topic", "create", "cli-guarded")
    cli("sub", "create", "cli-guarded-sub", "--topic", "cli-guarded")

    refused = cli("topic", "delete", "cli-guarded")
    assert refused.exit_code == 4
    assert refused.stderr.startswith("error: ")
    assert "--force" in refused.stderr

    assert cli("topic", "delete", "cli-guarded", "--force").exit_code == 0
    assert cli("sub", "describe", "cli-guarded-sub").exit_code == 3


def test_topic_create_with_other_partition_count_exits_4(cli: Any) -> None:
    """Creating an existing topic with another partition count is a conflict (exit 4)."""
    assert cli("topic", "create", "cli-fixed", "--partitions", "2").exit_code == 0
    assert cli("topic", "create", "cli-fixed", "--partitions", "2").exit_code == 0
    conflict = cli("topic", "create", "cli-fixed", "--partitions", "3")
    assert conflict.exit_code == 4
    assert "partitions=2" in conflict.stderr


def test_sub_create_and_describe_show_settings_and_stats(cli: Any) -> None:
    """A subscription's settings and per-partition stats come back from describe --json."""
    cli("topic", "create", "cli-events", "--partitions", "3")
    cli("topic", "create", "cli-events-dead")
    created = cli(
        "sub", "create", "cli-events-sub", "--topic", "cli-events",
        "--start", "earliest", "--ack-deadline", "12", "--max-delivery-attempts", "7",
        "--dead-letter-topic", "cli-events-dead", "--min-backoff", "1", "--max-backoff", "9",
    )  # fmt: skip
    assert created.exit_code == 0, created.output

    described = json.loads(cli("sub", "describe", "cli-events-sub", "--json").stdout)
    assert described["topic"] == "cli-events"
    assert described["start"] == "earliest"
    assert described["ack_deadline"] == 12.0
    assert described["max_delivery_attempts"] == 7
    assert described["dead_letter_topic"] == "cli-events-dead"
    assert described["retry_policy"] == {"minimum_backoff": 1.0, "maximum_backoff": 9.0}
    assert described["stats"]["pending"] == 0
    assert described["stats"]["messages"] == 0
    assert [p["partition"] for p in described["stats"]["partitions"]] == [0, 1, 2]

    listed = json.loads(cli("sub", "list", "--topic", "cli-events", "--json").stdout)
    assert [s["name"] for s in listed] == ["cli-events-sub"]
    text = cli("sub", "describe", "cli-events-sub")
    assert text.exit_code == 0
    assert "pending" in text.stdout

    assert cli("sub", "delete", "cli-events-sub").exit_code == 0
    assert cli("sub", "list", "--topic", "cli-events", "--json").stdout.strip() == "[]"


def test_published_messages_are_pulled_once_and_acked(cli: Any) -> None:
    """Messages published from arguments and stdin are pulled with their key and attributes,
    acked, and a second pull gets nothing."""
    cli("topic", "create", "cli-mail")
    cli("sub", "create", "cli-mail-sub", "--topic", "cli-mail")

    from_args = cli(
        "publish", "cli-mail", "hello", "world",
        "--ordering-key", "customer-7", "--attr", "kind=greeting", "--json",
    )  # fmt: skip
    assert from_args.exit_code == 0, from_args.output
    arg_ids = json.loads(from_args.stdout)["ids"]
    from_stdin = cli("publish", "cli-mail", input="line one\nline two\nline three\n")
    assert from_stdin.exit_code == 0, from_stdin.output
    stdin_ids = from_stdin.stdout.split()
    assert len(arg_ids) == 2
    assert len(stdin_ids) == 3

    pulled = cli("pull", "cli-mail-sub", "-n", "10", "--timeout", "3", "--json")
    assert pulled.exit_code == 0, pulled.output
    messages = {m["id"]: m for m in json.loads(pulled.stdout)}
    assert set(messages) == set(arg_ids + stdin_ids)
    assert [messages[i]["data"] for i in arg_ids] == ["hello", "world"]
    assert [messages[i]["data"] for i in stdin_ids] == ["line one", "line two", "line three"]
    assert messages[arg_ids[0]]["ordering_key"] == "customer-7"
    assert messages[arg_ids[0]]["attributes"] == {"kind": "greeting"}
    assert all(m["delivery_attempt"] == 1 for m in messages.values())
    assert "pulled and acked 5 of at most 10" in pulled.stderr

    again = cli("pull", "cli-mail-sub", "--timeout", "1", "--json")
    assert again.exit_code == 0
    assert json.loads(again.stdout) == []
    stats = json.loads(cli("sub", "describe", "cli-mail-sub", "--json").stdout)["stats"]
    assert stats["pending"] == 0


def test_pull_shows_binary_data_as_base64(cli: Any) -> None:
    """Data that is not UTF-8 is pulled as base64 and says so."""
    cli("topic", "create", "cli-bytes")
    cli("sub", "create", "cli-bytes-sub", "--topic", "cli-bytes")
    assert cli("publish", "cli-bytes", input=b"\xff\xfe\x00\n").exit_code == 0

    (message,) = json.loads(cli("pull", "cli-bytes-sub", "-n", "1", "--json").stdout)
    assert message["data_encoding"] == "base64"
    assert message["data"] == "//4A"


def test_publish_quiet_prints_only_the_count(cli: Any) -> None:
    """``publish --quiet`` prints the number of messages and nothing else on stdout."""
    cli("topic", "create", "cli-count")
    lines = "".join(f"m{i}\n" for i in range(2500))
    result = cli("publish", "cli-count", "--quiet", input=lines)
    assert result.exit_code == 0
    assert result.stdout == "2500\n"


def test_publish_to_missing_topic_exits_3(cli: Any) -> None:
    """Publishing to a topic that does not exist exits 3 with one red line saying what to do."""
    result = cli("publish", "cli-nowhere", "hello")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.startswith("error: topic 'cli-nowhere' does not exist")
    assert "streamsub topic create cli-nowhere" in result.stderr
    assert result.stderr.count("\n") == 1


def test_bad_input_exits_2(cli: Any) -> None:
    """An invalid topic name or a malformed --attr is bad input (exit 2)."""
    bad_name = cli("topic", "create", "x")
    assert bad_name.exit_code == 2
    assert "invalid topic name" in bad_name.stderr
    assert cli("publish", "cli-any", "m", "--attr", "novalue").exit_code == 2


def test_unreachable_server_exits_5(cli: Any) -> None:
    """A server that cannot be reached exits 5 and names the URL."""
    url = f"redis://127.0.0.1:{_free_port()}/0"
    result = cli("topic", "list", "--url", url)
    assert result.exit_code == 5
    assert url in result.stderr


def test_demo_delivers_every_message() -> None:
    """The demo runs with nothing started beforehand, exits 0 and reports nothing lost."""
    result = subprocess.run(
        [*STREAMSUB, "demo", "--messages", "2000", "--subscribers", "2"],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\blost\W+0\b", result.stdout), result.stdout
    assert re.search(r"\bpublished\W+2,000\b", result.stdout), result.stdout


def test_dev_server_serves_until_sigterm(tmp_path: Path) -> None:
    """``dev-server`` prints the URL to export, serves it, and stops cleanly on SIGTERM."""
    port = _free_port()
    process = subprocess.Popen(
        [*STREAMSUB, "dev-server", "--dir", str(tmp_path / "dev"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url == f"redis://127.0.0.1:{port}/0"
        assert process.stdout.readline().strip() == f"export STREAMSUB_URL={url}"
        runner = CliRunner()
        created = runner.invoke(app, ["topic", "create", "cli-dev", "--url", url])
        assert created.exit_code == 0, created.output
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert "stopped" in stderr
    assert (tmp_path / "dev" / "appendonlydir").is_dir()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if runner.invoke(app, ["topic", "list", "--url", url]).exit_code == 5:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the dev server still answers after SIGTERM")


def test_pull_stopped_by_sigterm_gives_its_messages_back(cli: Any, cli_server: RedisServer) -> None:
    """SIGTERM stops ``pull`` gracefully: it exits 130 and releases what it held, so
    another subscriber may take it at once instead of after the ack deadline."""
    assert cli("topic", "create", "sigterm-t", "--partitions", "1").exit_code == 0
    created = cli("sub", "create", "sigterm-s", "--topic", "sigterm-t", "--ack-deadline", "60")
    assert created.exit_code == 0
    assert cli("publish", "sigterm-t", "one", "two").exit_code == 0
    process = subprocess.Popen(
        [*STREAMSUB, "pull", "sigterm-s", "-n", "10", "--timeout", "30"],
        env={**os.environ, "STREAMSUB_URL": cli_server.url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = redis.Redis.from_url(cli_server.url)
    try:
        deadline = time.monotonic() + 20
        while not client.xpending("ss:{sigterm-t.0}", "sigterm-s")["pending"]:
            assert time.monotonic() < deadline, "pull never received the messages"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 130, stderr
        pending = client.xpending_range("ss:{sigterm-t.0}", "sigterm-s", "-", "+", 10)
        assert len(pending) == 2
        assert all(entry["time_since_delivered"] >= 60_000 for entry in pending)
    finally:
        if process.poll() is None:
            process.kill()
        client.close()

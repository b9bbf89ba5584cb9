"""``streamsub topic describe`` on one server: every partition is on that server."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import streamsub
import streamsub.blocking
from streamsub.cli import app
from streamsub.testing import redis_server


def _cli(url: str, *args: str) -> str:
    runner = CliRunner(env={"STREAMSUB_URL": url, "COLUMNS": "300"})
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_topic_describe_shows_the_one_server_for_every_partition(
    tmp_path: Path, redis_binary: str | None
) -> None:
    """On a TCP server and on a unix socket, describe (text and JSON) places
    each of a topic's 6 partitions on that server, with no cluster node id;
    the library call says the same."""
    with (
        redis_server(tmp_path / "tcp", binary=redis_binary) as tcp,
        redis_server(tmp_path / "unix", binary=redis_binary, unix_socket=True) as unix,
    ):
        for server, address in ((tcp, f"127.0.0.1:{tcp.port}"), (unix, str(unix.unix_socket))):
            _cli(server.url, "topic", "create", "placed", "--partitions", "6")
            with streamsub.blocking.connect(server.url) as client:
                located = client.locate_partitions("placed")
            assert located == [streamsub.PartitionNode(p, address, None) for p in range(6)]
            described = json.loads(_cli(server.url, "topic", "describe", "placed", "--json"))
            assert described["placement"] == [
                {"partition": p, "address": address, "node_id": None} for p in range(6)
            ]
            text = _cli(server.url, "topic", "describe", "placed")
            row = next(line for line in text.splitlines() if address in line)
            assert [cell.strip() for cell in row.strip("│ ").split("│")] == [
                address,
                "-",
                "0-5",
                "6",
            ]

"""Connecting, ``streamsub topic describe`` and ``client.locate_partitions``
while one master of three is down (SIGKILLed, its replica not yet promoted:
about two ``cluster-node-timeout``s).

Five of the six nodes answer and two thirds of the slots are served the whole
time; after the promotion every slot is. README (Redis Cluster): describe
lists each partition's master "as ``CLUSTER SLOTS`` says at that moment (after
a failover or a slot move it names the new master)"; issue 9 point 3: a closed
socket "is retried after a topology refresh, not surfaced as a failure"; the
Failover done-when: the stall "no longer than the failover itself plus a
bounded retry".
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import streamsub
from streamsub.testing import redis_cluster


async def _describe(url: str) -> tuple[int, str]:
    """``streamsub topic describe placed --json`` in a process of its own."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from streamsub.cli import app; app()",
        "topic", "describe", "placed", "--json",
        env={**os.environ, "STREAMSUB_URL": url, "COLUMNS": "300"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode()


async def test_connect_describe_and_locate_work_while_a_master_is_down(tmp_path: Path) -> None:
    """Every ~0.3 s for 8 s after a master is SIGKILLed: ``async with
    connect(url)`` (a service starting or restarting during a failover),
    ``topic describe`` and ``locate_partitions`` on a client connected before
    the kill must succeed. Connecting fails (``server_info`` asks INFO of every
    master, the dead one too, and the error blames the URL and suggests
    ``streamsub dev-server``), and so does describe, which connects."""
    with redis_cluster(tmp_path) as cluster:
        async with streamsub.connect(cluster.url) as client:
            await client.create_topic("placed", partitions=16)
            code, output = await _describe(cluster.url)
            assert code == 0, output  # healthy: describe works
            victim = cluster.master_ports()[0]
            server = next(s for s in cluster.servers if s.port == victim)
            server.kill()
            failures: dict[str, list[str]] = {"connect": [], "describe": [], "locate": []}
            deadline = time.monotonic() + 8
            rounds = 0
            while time.monotonic() < deadline:
                rounds += 1
                try:
                    async with streamsub.connect(cluster.url):
                        pass
                except streamsub.StreamsubError as exc:
                    failures["connect"].append(f"{type(exc).__name__}: {exc}")
                code, output = await _describe(cluster.url)
                if code != 0:
                    failures["describe"].append(output.strip()[-300:])
                try:
                    await client.locate_partitions("placed")
                except streamsub.StreamsubError as exc:
                    failures["locate"].append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.3)
            summary = {k: (len(v), v[:1]) for k, v in failures.items() if v}
            assert not summary, f"in {rounds} rounds: {summary}"

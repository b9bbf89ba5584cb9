"""The cluster backend's reads that ask the next node (a replica) when one
does not answer, and how it finds a master's replicas (no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.exceptions as rexc

from streamsub._backends.redis._cluster import _first_answer, _no_answer, _replicas_in


def _attempts(
    *behaviours: str,
) -> tuple[list[Callable[[], Awaitable[str]]], list[str], list[str]]:
    """Attempts that each, by name: ``hang`` (never answer), ``refuse`` (a
    ConnectionError), ``error`` (an error reply) or ``answer``; with the log
    of those started and of those cancelled."""
    started: list[str] = []
    cancelled: list[str] = []

    def attempt(index: int, behaviour: str) -> Callable[[], Awaitable[str]]:
        async def run() -> str:
            name = f"{index}:{behaviour}"
            started.append(name)
            try:
                if behaviour == "hang":
                    await asyncio.Event().wait()
                if behaviour == "refuse":
                    raise rexc.ConnectionError(f"{name} refused")
                if behaviour == "error":
                    raise rexc.ResponseError(f"{name} WRONGTYPE")
                return name
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        return run

    return [attempt(i, b) for i, b in enumerate(behaviours)], started, cancelled


async def test_a_silent_node_is_passed_over_after_the_patience_and_cancelled() -> None:
    """The first attempt hangs: the second starts after the patience, its
    answer is returned, and the hanging one is cancelled."""
    attempts, started, cancelled = _attempts("hang", "answer")
    assert await _first_answer(attempts, 0.05) == "1:answer"
    assert started == ["0:hang", "1:answer"]
    assert cancelled == ["0:hang"]


async def test_a_refused_connection_moves_on_at_once() -> None:
    """The first refuses: the next starts without waiting out a long patience."""
    attempts, started, _ = _attempts("refuse", "answer")
    assert await asyncio.wait_for(_first_answer(attempts, 3600), 5) == "1:answer"
    assert started == ["0:refuse", "1:answer"]


async def test_the_first_node_answering_is_not_second_guessed() -> None:
    """An answer of the first attempt is returned; no other node is asked."""
    attempts, started, _ = _attempts("answer", "answer")
    assert await _first_answer(attempts, 3600) == "0:answer"
    assert started == ["0:answer"]


async def test_when_no_node_answers_the_first_ones_error_is_raised() -> None:
    """Every attempt refuses: the first one's error (the master's) is raised."""
    attempts, started, _ = _attempts("refuse", "refuse", "refuse")
    with pytest.raises(rexc.ConnectionError, match="0:refuse"):
        await _first_answer(attempts, 3600)
    assert started == ["0:refuse", "1:refuse", "2:refuse"]


async def test_an_error_reply_is_raised_at_once_and_the_others_cancelled() -> None:
    """A node that answers with an error answered: raised, without asking the
    next, and a node still silent is cancelled."""
    attempts, started, cancelled = _attempts("hang", "error", "answer")
    with pytest.raises(rexc.ResponseError, match="1:error"):
        await _first_answer(attempts, 0.05)
    assert started == ["0:hang", "1:error"]
    assert cancelled == ["0:hang"]


NODES = """\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003 master - 0 1426238318243 3 connected 10923-16383
6ec2 127.0.0.1:30005@40005,host5 slave 67ed 0 1426238316232 5 connected
824f 127.0.0.1:30006@40006 slave 292f 0 1426238317741 6 connected
a1b2 127.0.0.1:30007@40007 slave,fail e7d1 0 1426238317741 6 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
c3d4 127.0.0.1:30008@40008 slave e7d1 0 1426238317741 6 disconnected
"""


def test_replicas_of_a_master_are_read_from_cluster_nodes() -> None:
    """A master's replicas, by ``host:port``, without one marked failed; none
    for a master the listing does not know."""
    assert _replicas_in(NODES, "127.0.0.1:30001") == ["127.0.0.1:30004", "127.0.0.1:30008"]
    assert _replicas_in(NODES, "127.0.0.1:30002") == ["127.0.0.1:30005"]
    assert _replicas_in(NODES, "127.0.0.1:39999") == []


async def test_redis_py_tripping_over_a_dropped_connection_counts_as_no_answer() -> None:
    """redis-py 5.0.1 raised AttributeError ("'NoneType' object has no attribute
    'writelines'") from a connection of a killed master, and the replica was
    never asked (test_describe_during_failover on redis-py 5.0.1): an error of
    that kind raised inside redis-py is no answer; one raised outside is a bug."""
    from redis.asyncio.connection import Connection

    connection = Connection()  # never connected: no writer
    with pytest.raises(AttributeError) as inside:
        await connection._send_packed_command([b"PING"])
    assert _no_answer(inside.value)
    assert not _no_answer(AttributeError("ours"))

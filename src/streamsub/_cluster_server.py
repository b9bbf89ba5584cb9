"""A private Redis Cluster of redis-server processes, for tests and development.

``redis_cluster()`` starts ``masters`` masters and as many replicas per master
as asked, each a :class:`~streamsub._server.RedisServer` (loopback port,
private directory, AOF) with ``cluster-enabled yes``. It builds the cluster
itself with plain commands, as ``redis-cli --cluster create`` does but without
its one-second polls (and without needing redis-cli): the slots split evenly
over the masters (``CLUSTER ADDSLOTS``), a distinct config epoch each,
``CLUSTER MEET`` from the first node, ``CLUSTER REPLICATE`` once every node
knows every other. It returns once every node says ``cluster_state:ok`` (every
slot served, in its own view), sees the same masters and each replica with
the same master, and every replica's link is up with its initial sync done.
On this 2-core machine that takes about 1.5 s for 3 masters and 3 replicas
(``repl-diskless-sync-delay 0``; the default 5 s delay makes it 7 s).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from ._errors import StreamsubError
from ._server import RedisServer

__all__ = ["RedisClusterServers", "redis_cluster"]

SLOTS = 16384
_READY_TIMEOUT = 30.0
NODE_TIMEOUT_MS = 2000
"""``cluster-node-timeout``: a master that stops answering is failed over after
about twice this (measured here: 4 s at 2000 ms)."""
_CLUSTER_ARGS = (
    "--cluster-enabled", "yes",
    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
    "--repl-diskless-sync-delay", "0",
    "--cluster-config-file",
)  # fmt: skip


def _free_port_pair(taken: Collection[int] = ()) -> int:
    """A free loopback port ``p`` whose cluster bus port ``p + 10000`` is free too,
    neither of them the port or bus port of a port in ``taken`` (picked for
    another node that has not started yet: a port is free until its server
    binds it).

    Both below the kernel's ephemeral range (32768+ by default), where the
    local ports of outgoing connections (the nodes' own, to each other's bus,
    and every client's) come from: one there could take a bus port between
    this check and its node's start. (Bus ports were picked from 30000-39999
    until a node once "did not start" in a run of the cluster tests; its log
    was not kept, so that this was the cause is not proven.)
    """
    for _ in range(1000):
        port = random.randrange(10000, 22768)
        if port in taken or port + 10000 in taken or port - 10000 in taken:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for candidate in (port, port + 10000):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise StreamsubError("no free pair of loopback ports (p, p + 10000) for a cluster node")


def _runs(server: RedisServer) -> bool:
    """Whether the server's process runs (not stopped, not killed)."""
    return server.process is not None and server.process.poll() is None


def _masters(lines: list[str]) -> list[str]:
    """``CLUSTER NODES`` lines of the masters not marked failed."""
    return [
        line
        for line in lines
        if "master" in (flags := line.split()[2]).split(",") and "fail" not in flags
    ]


def _slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The slots each master serves: ``SLOTS`` split evenly, in order (as redis-cli does)."""
    per = SLOTS / masters
    return [(round(i * per), round((i + 1) * per) - 1) for i in range(masters)]


class RedisClusterServers:
    """The processes of one private cluster: ``servers[:masters]`` start as masters.

    ``url`` (``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``) names every
    node, so a client can connect while any of them runs. ``client()`` is a
    synchronous, cluster-aware redis-py client for inspecting state.
    """

    def __init__(self, servers: Sequence[RedisServer], masters: int) -> None:
        self.servers = list(servers)
        self.masters = masters

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL of every node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    @property
    def ports(self) -> list[int]:
        """The nodes' ports, masters first (as started)."""
        return [s.port for s in self.servers]

    def client(self) -> redis.RedisCluster:
        """A synchronous cluster client (for tests: inspecting keys, failing over)."""
        return redis.RedisCluster(host="127.0.0.1", port=self.servers[0].port)

    def node(self, port: int) -> redis.Redis:
        """A plain client on one node (close it after use)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self) -> None:
        """Start the processes and build the cluster; return once it is ready."""
        for server in self.servers:
            server.start()
        nodes: list[Any] = [self.node(s.port) for s in self.servers]
        try:
            self._create(nodes)
            self.wait_ready()
        finally:
            for node in nodes:
                node.close()

    def _create(self, nodes: list[Any]) -> None:
        ids = [str(node.execute_command("CLUSTER", "MYID"), "ascii") for node in nodes]
        for i, (first, last) in enumerate(_slot_ranges(self.masters)):
            nodes[i].execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        for epoch, node in enumerate(nodes, start=1):
            node.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
        for server in self.servers[1:]:
            nodes[0].execute_command("CLUSTER MEET", "127.0.0.1", server.port)
        self._wait("every node to know every other", lambda: all(
            len(self._nodes_lines(node)) == len(nodes) for node in nodes
        ))  # fmt: skip
        for i, node in enumerate(nodes[self.masters :]):
            master = ids[i % self.masters]

            def knows_master(node: Any = node, master: str = master) -> bool:
                return any(line.startswith(master) for line in self._nodes_lines(node))

            # A replica may only follow a master it has heard of by gossip.
            self._wait("a replica to see its master", knows_master)
            node.execute_command("CLUSTER REPLICATE", master)

    @staticmethod
    def _nodes_lines(node: Any) -> list[str]:
        raw = node.execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return [line for line in text.splitlines() if line.strip()]

    @staticmethod
    def _wait(what: str, ready: Callable[[], bool], timeout: float = _READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except (redis.RedisError, OSError):
                pass
            time.sleep(0.02)
        raise StreamsubError(f"the test cluster did not become ready: waited for {what}")

    def wait_ready(self, timeout: float = _READY_TIMEOUT) -> None:
        """Wait until every running node says ``cluster_state:ok`` with the same
        view of the masters and of every running replica's master, and every
        running replica is in sync."""
        running = [s for s in self.servers if _runs(s)]
        nodes: list[Any] = [self.node(s.port) for s in running]
        try:
            self._wait("cluster_state:ok and synced replicas", lambda: self._ready(nodes), timeout)
        except StreamsubError as exc:
            # What each node sees, to tell which one disagrees.
            views = [f"{exc}; the nodes' views:"]
            for server, node in zip(running, nodes, strict=True):
                try:
                    views += [f"port {server.port}:", *self._nodes_lines(node)]
                except (redis.RedisError, OSError) as error:
                    views.append(f"port {server.port}: {error!r}")
            raise StreamsubError("\n".join(views)) from None
        finally:
            for node in nodes:
                node.close()

    def _ready(self, nodes: list[Any]) -> bool:
        views = set()
        for node in nodes:
            info = node.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
            lines = self._nodes_lines(node)
            replicas = sorted(
                (line.split()[0], line.split()[3])
                for line in lines
                if "slave" in line.split()[2].split(",") and "fail" not in line.split()[2]
            )
            views.add((tuple(sorted(line.split()[0] for line in _masters(lines))), tuple(replicas)))
            replication = node.info("replication")
            if replication.get("role") == "slave" and (
                replication.get("master_link_status") != "up"
                or replication.get("master_sync_in_progress")
            ):
                return False
        # Every node sees the same masters, and every running replica with its master.
        return len(views) == 1 and len(next(iter(views))[1]) == len(nodes) - len(
            next(iter(views))[0]
        )

    def master_ports(self) -> list[int]:
        """The ports of the nodes that are masters now (they change on failover)."""
        for server in self.servers:
            if not _runs(server):
                continue
            node = self.node(server.port)
            try:
                lines = self._nodes_lines(node)
            finally:
                node.close()
            return sorted(
                int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in _masters(lines)
            )
        return []

    def stop(self) -> None:
        """Stop every process."""
        for server in self.servers:
            server.stop()


@contextlib.contextmanager
def redis_cluster(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    masters: int = 3,
    replicas: int = 1,
    appendfsync: str = "everysec",
    binary: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[RedisClusterServers]:
    """Run a private Redis Cluster for the ``with`` block and yield it.

    ``masters`` masters (default 3) with ``replicas`` replicas each (default 1),
    on free loopback ports, each in its own directory under ``data_dir`` (a
    temporary directory, removed afterwards, without one), AOF on.
    """
    if masters < 1 or replicas < 0:
        raise ValueError(f"need at least one master, got masters={masters}, replicas={replicas}")
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            directory = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="streamsub-cluster-"))
            )
        else:
            directory = Path(data_dir)
        servers: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            node_dir = directory / f"node{i}"
            servers.append(
                RedisServer(
                    node_dir,
                    # Two nodes on one port: the second's PING is answered by
                    # the first, and the cluster is built of one node twice.
                    port=_free_port_pair({s.port for s in servers}),
                    appendfsync=appendfsync,
                    binary=binary,
                    extra_args=(*_CLUSTER_ARGS, str(node_dir / "nodes.conf"), *extra_args),
                )
            )
        cluster = RedisClusterServers(servers, masters)
        stack.callback(cluster.stop)
        cluster.start()
        yield cluster

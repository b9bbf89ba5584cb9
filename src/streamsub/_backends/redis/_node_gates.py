"""A cap on each cluster node's connections at which commands wait, not fail.

redis-py's asyncio ``RedisCluster`` caps each node's pool at
``max_connections`` and raises ``MaxConnectionsError`` ("Too many
connections") as soon as every connection of a node is busy, which many
subscribers of one client (each polling, acking, extending leases) make
common. Worse, its pipelines (redis-py 6+) take that error for a broken
connection: they close the whole client, every node's connections with it,
and try again, so one busy node fails commands on all of them. Its
``ClusterNode`` takes a free connection synchronously and cannot wait.

So the pool of each node stays unbounded in redis-py, and the cap is kept
here instead: every command and pipeline sent to a node first takes one of
``limit`` places of that node, waiting up to ``timeout`` seconds for one (as
the standalone backend's :class:`~._pool.WaitingConnectionPool` waits for a
connection); a node never has more connections than places, since each
command holds its place while it holds its connection. redis-py makes its
node objects itself (on discovery, on ``MOVED``), with no hook to make them
another class, so :func:`gate_nodes` gives the client's ``NodesManager`` a
subclass that turns each node it hands out into a gated one (same slots, so
only the class changes). Checked on redis-py 5.0.1 and 7.x.

A wait that runs out says whether the node answered any of the client's
commands meanwhile: if not, it is the node that stalls (hung, cut off, failing
over), not the client that is too busy. The same ``NodesManager`` subclass
also keeps redis-py's default node (asked ``COMMAND`` at every topology
refresh) one that answers, so that a client can start while a master is down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import redis.exceptions as rexc
from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster

__all__ = ["NoFreeConnectionError", "NodeGates", "gate_nodes"]


class NoFreeConnectionError(rexc.RedisError):
    """Every connection to a node stayed busy for the whole wait. Not a
    ``ConnectionError``: redis-py would close the whole client for one.
    ``stalled``: the node answered none of this client's commands during the
    wait (every connection waits on one it has not answered), rather than
    each connection freed being taken by another command."""

    def __init__(self, message: str, *, stalled: bool) -> None:
        super().__init__(message)
        self.stalled = stalled


class NodeGates:
    """Per node name, ``limit`` places; a command waits up to ``timeout``
    seconds for one."""

    def __init__(self, *, limit: int, timeout: float) -> None:
        self.limit = limit
        self.timeout = timeout
        self._places: dict[str, asyncio.Semaphore] = {}
        self._answered: dict[str, int] = {}
        """Per node, how many commands it answered so far (a reply or an error reply)."""

    @contextlib.asynccontextmanager
    async def place(self, node: str) -> AsyncIterator[None]:
        """Hold one of ``node``'s places for the ``async with`` block."""
        places = self._places.get(node)
        if places is None:
            places = self._places[node] = asyncio.Semaphore(self.limit)
        answered = self._answered.get(node, 0)
        try:
            async with asyncio.timeout(self.timeout):
                await places.acquire()
        except TimeoutError:
            if self._answered.get(node, 0) == answered:
                raise NoFreeConnectionError(
                    f"no free connection to node {node} within {self.timeout:g} s (the socket "
                    "timeout), and the node answered none of this client's commands meanwhile: "
                    f"its {self.limit} connections wait on commands it has not answered",
                    stalled=True,
                ) from None
            raise NoFreeConnectionError(
                f"no free connection to node {node} within {self.timeout:g} s: each of this "
                f"client's {self.limit} connections to it freed was taken by another command",
                stalled=False,
            ) from None
        try:
            yield
        except rexc.ResponseError:
            self._answered[node] = self._answered.get(node, 0) + 1
            raise
        else:
            self._answered[node] = self._answered.get(node, 0) + 1
        finally:
            places.release()


_closing: set[asyncio.Future[Any]] = set()
"""Disconnects of replaced startup nodes under way (a reference keeps each alive)."""


def _closed(closing: asyncio.Future[Any]) -> None:
    _closing.discard(closing)
    if not closing.cancelled():
        closing.exception()  # a connection that fails to close is gone all the same


def gate_nodes(client: RedisCluster, gates: NodeGates) -> None:
    """Make every node ``client`` sends commands to take a place of ``gates`` first."""

    class GatedNode(ClusterNode):
        __slots__ = ()

        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            async with gates.place(self.name):
                return await super().execute_command(*args, **kwargs)

        async def execute_pipeline(self, commands: Any) -> bool:
            async with gates.place(self.name):
                return await super().execute_pipeline(commands)

    def gated(node: Any) -> Any:
        if type(node) is ClusterNode:
            node.__class__ = GatedNode
        return node

    class GatingNodesManager(NodesManager):
        """Hands out gated nodes; gates every node it knows after a refresh."""

        __slots__ = ()

        def gate_all(self) -> None:
            known = [*self.startup_nodes.values(), *self.nodes_cache.values(), self.default_node]
            known += {id(n): n for nodes in self.slots_cache.values() for n in nodes}.values()
            for node in known:
                gated(node)

        async def initialize(self) -> None:
            try:
                await super().initialize()
            finally:
                self.share_startup_nodes()
                self.gate_all()
            await self.answering_default()

        async def answering_default(self) -> None:
            """Make the default node a master that answers PING. redis-py makes
            it the first master, and asks it ``COMMAND`` right after this, so
            a client made while that master is down (SIGKILLed, its replica not
            yet promoted) could not start at all. Left as is if none answers."""
            primaries = self.get_nodes_by_server_type("primary")
            if self.default_node in primaries:  # try it first: no change when it answers
                primaries.remove(self.default_node)
                primaries.insert(0, self.default_node)
            for node in primaries:
                try:
                    await node.execute_command("PING")
                except (rexc.ConnectionError, rexc.TimeoutError, OSError):
                    continue
                self.default_node = node
                return

        def share_startup_nodes(self) -> None:
            """Let a startup node be the node the cache has by that name, as
            redis-py 5.0 does (6+ keeps both, each with a pool of its own, so a
            node would have more connections than its places)."""
            for name, node in self.nodes_cache.items():
                old = self.startup_nodes.get(name)
                if old is not None and old is not node:
                    self.startup_nodes[name] = node
                    closing = asyncio.ensure_future(old.disconnect())
                    _closing.add(closing)
                    closing.add_done_callback(_closed)

        def get_node(self, *args: Any, **kwargs: Any) -> Any:
            return gated(super().get_node(*args, **kwargs))

        def get_node_from_slot(self, *args: Any, **kwargs: Any) -> Any:
            return gated(super().get_node_from_slot(*args, **kwargs))

        def get_nodes_by_server_type(self, *args: Any, **kwargs: Any) -> Any:
            return [gated(node) for node in super().get_nodes_by_server_type(*args, **kwargs)]

    manager: Any = client.nodes_manager
    manager.__class__ = GatingNodesManager
    manager.gate_all()

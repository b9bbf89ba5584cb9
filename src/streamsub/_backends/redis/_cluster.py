"""RedisClusterBackend: the backend protocol on Redis Cluster (6.2 or newer).

Everything the standalone backend does runs here unchanged where it touches one
slot at a time: every Lua step names only keys of one partition (which share
the partition's hash tag) or one record, and a pipeline of such steps is split by
node (see Lua calls below). What differs:

- **Layout**: a topic created here gets layout ``v2``: per-partition salts
  (``_slots.py``) chosen so its partitions spread evenly over the masters that
  serve slots at creation; topics created before keep their keys.
- **Reading**: ``XREADGROUP`` may name keys of one slot only, and each
  partition has its own slot, so one read cannot cover a subscriber's
  partitions. A read sends one non-blocking ``XREADGROUP`` per partition,
  pipelined per node (the nodes in parallel, one round trip); when all come
  back empty it polls again once an append to one of those partitions
  announced itself (a wake-up, below), or after an idle wait that doubles
  from :data:`IDLE_POLL_FIRST` to :data:`IDLE_POLL_MAX`, whichever comes
  first, until the read's block time is over (and the wait stays long while
  the subscriber stays idle). **Wake-ups** (every master 7.0+, which
  :meth:`RedisClusterBackend._wakes` asks once): the append's script, after
  its ``XADD``, ``SPUBLISH``es an empty message to the partition's shard
  channel (``_keys.wake_channel``, in the stream's slot), and each client
  listens on the channels its readers poll (``_wakeups.py``: one pub/sub
  connection per master, a counter per channel). A read takes the counters
  before each poll, so an append its poll did not see ends the wait at once.
  The idle poll stays the safety net: a publisher that does not notify (Redis
  6.2, an older streamsub), a channel being subscribed again after a
  failover or a slot's move, a user not allowed the channels.
  Measured (``benchmarks/cluster.py``, 3 masters on 2 cores, 48,000 stored
  messages, 16 partitions): the read path alone takes 192,000 msgs/s with
  these pipelined polls against 99,000 with one blocking ``XREADGROUP`` per
  partition, each on its own connection (16 connections per reader); end to
  end with two subscribers 26,000 msgs/s on the cluster against 33,000 on one
  server. Polls also keep the cluster client's traps away from reading: a
  blocked read holds its connection, cannot be taken back when another
  partition answers first without ``CLIENT UNBLOCK`` from yet another
  connection, and is what a failover answers ``UNBLOCKED``, a moved slot
  ``MOVED``, and redis-py 8's socket timeout re-sends; a poll is short, and a
  redirection or reset fails one poll, which the reader retries. The cost:
  without wake-ups a message arriving after an idle spell waits for the next
  poll, up to about :data:`IDLE_POLL_MAX`; with them, a round trip more than
  a blocked read (end to end at 100 msg/s, ``benchmarks/latency.py
  --cluster``: p99 2.9 to 3.3 ms against 7.1 to 7.7 ms polling; an ordered
  subscription, whose four subscribers each see a message every 40 ms, 1.9
  to 2.3 ms against 86 to 88 ms). An idle subscriber of a 16-partition topic
  still sends about 190 ``XREADGROUP`` per second (the safety net), and each append one
  ``SPUBLISH``, which every client reading the partition receives.
  redis-py would also ask the server for each ``XREADGROUP``'s keys
  (``COMMAND GETKEYS``) before sending it; routing by the key's slot here
  skips that.
- **Appending**: batches go through one in-order connection per node (as on
  one server, several in flight), routed by a slot map of the appender's own
  that changes only under its send lock, so that a batch redirected by
  ``MOVED`` or ``ASK`` is sent again (``ASKING`` on the same connection, in
  the same write) before any later batch of its partition: order is kept
  across a slot's move. A write, new or sent again, that could reach a node
  before an earlier write of its partition waits for that one (an earlier
  write on its way back ``MOVED`` from the old master while the map names the
  new one, or one waiting to be sent again): ``_write_order``. A write is
  answered ``TRYAGAIN`` by the importing node when the publisher's link key on
  the partition (its first write there in a minute) exists on neither node: it
  is sent there again at once with that key undeclared, as
  ``_routing.SlotRouter`` does for steps. A node that refuses a new connection
  (a killed master not yet replaced) got nothing, so its batches are routed
  afresh and retried until the socket timeout: a publish stalls through the
  failover. ``CLUSTERDOWN``, any other ``TRYAGAIN`` and a connection lost with
  batches in flight fail the publish (it may or may not be stored after a lost
  connection; it is not after the others). The appender's connections are its
  own, not the node pools': redis-py closes every pooled connection on some
  errors.
- **Lua calls and reads**: acks, lease extensions, nacks, reclaims and the
  other Lua steps, and the reading polls, are routed by their first key's slot
  here (``_routing.SlotRouter``), each node's calls in one write on one of its
  pooled connections, not by redis-py's cluster client. Its redirection
  handling has two traps: on ``ASK`` it sends ``ASKING`` and the command on
  two pooled connections, so with more than one free the importing node
  redirects again and the call fails "TTL exhausted" for as long as the slot
  migrates; and every fifth ``MOVED`` it closes every node's connections,
  cutting calls in flight elsewhere. So a call answered ``MOVED`` goes to the
  new master (its slot patched into redis-py's map, ``reinitialize_steps=0``:
  no rebuild), one answered ``ASK`` goes to the importing node behind
  ``ASKING`` in the same write, and ``TRYAGAIN`` (a step on several keys, some
  not on the importing node) is tried there again after growing pauses. Past
  :data:`~._routing.MAX_REDIRECTS` redirections or the pauses, the call fails
  with UnavailableError saying the slot is migrating. Redis cannot tell a key
  still to come from one that does not exist, so a step naming a key that
  does not exist yet (a partition's delay set before any delayed nack) waits
  for the slot's handover: a resharding tool makes that milliseconds after the
  last keys move; a migration held longer fails the step, which the engine
  retries.
- **Dead letters**: the dead-letter stream is in another slot, so the move is
  append first, then an owner-checked acknowledgement: a crash between the two
  can duplicate a dead letter, never lose one.
- **Records while a master is down**: a master that is killed or stalls is
  replaced by its replica only after about twice ``cluster-node-timeout``.
  Meanwhile reads of topic, subscription and snapshot records and of their
  lists (what get, list, ``topic describe`` and ``locate_partitions`` read)
  also ask one of the slot's replicas, after ``READONLY`` on a connection of
  the client's own to it, once the master refused the connection or has not
  answered within :data:`NEXT_NODE_AFTER`; the first answer counts. A
  replica's copy lags its master by the replication delay (the time to ship
  a write on a healthy link; more under load, and a stalled master's replica
  has what reached it before the stall), so a record changed or created just
  before may be read as it was. Writes never go to replicas,
  and the pooled connections never get ``READONLY`` (which would let other
  reads of a stale view of the cluster be answered by a replica). The slot map
  (``CLUSTER SLOTS``) is asked of the next node the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import redis.exceptions as rexc
from redis.asyncio.cluster import ClusterNode, RedisCluster

from ..._errors import InvalidArgumentError, StreamsubError, UnavailableError
from ..._settings import Durability
from ..base import Entry, OwnedRead, PartitionNode, ServerInfo, TopicRecord
from . import _keys
from ._backend import (
    HEALTH_CHECK_INTERVAL,
    SOCKET_CONNECT_TIMEOUT,
    SOCKET_TIMEOUT,
    RedisBackend,
    _group_checked,
    _raw,
    _raw_pending,
    _Script,
    _script,
    redact,
)
from ._in_order import ConnectionClosed, InOrderConnection, NotReady
from ._node_gates import NodeGates, NoFreeConnectionError, gate_nodes
from ._routing import MAX_REDIRECTS, SlotMigratingError, SlotRouter
from ._slots import balanced_salts, key_slot
from ._wakeups import Wakeups
from ._write_order import Flight, WriteOrder

log = logging.getLogger("streamsub")

__all__ = [
    "CLUSTER_SCHEMES",
    "IDLE_POLL_FIRST",
    "IDLE_POLL_MAX",
    "NEXT_NODE_AFTER",
    "RedisClusterBackend",
]

T = TypeVar("T")

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
IDLE_POLL_FIRST = 0.002
"""Seconds a read waits after the first empty poll; doubled after each."""
IDLE_POLL_MAX = 0.1
"""The longest wait between polls of an idle reader: the most a message that
arrives after an idle spell waits for its poll."""
NEXT_NODE_AFTER = 1.0
"""Seconds a read of records (or of the slot map) waits for a node's answer
before it asks the next node too (a replica of the slot's master; another node
for the map). A one-key read that a master has not answered in a second means
a master that stalls (hung, cut off): its replica takes over only after about
twice cluster-node-timeout."""

_TRANSIENT = (
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.AskError,  # MovedError too
    rexc.SlotNotCoveredError,
    rexc.RedisClusterException,
)
"""The cluster is moving or failing over: retry after a topology refresh."""


def _nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The (host, port) list and the client options of a ``redis+cluster://`` URL.

    The nodes end at the first ``/``, ``?`` or ``#``; the path (only ``/`` or
    ``/0``) at the ``?``, so a query value may hold ``/`` (a CA file's path)."""
    parts = urllib.parse.urlsplit(url)
    scheme, netloc, path, query = parts.scheme, parts.netloc, parts.path, parts.query
    options: dict[str, Any] = {}
    at = netloc.rfind("@")
    if at >= 0:
        user, colon, password = netloc[:at].partition(":")
        if user:
            options["username"] = urllib.parse.unquote(user)
        if colon:
            options["password"] = urllib.parse.unquote(password)
        netloc = netloc[at + 1 :]
    for name, value in urllib.parse.parse_qsl(query):
        if name == "password":
            options["password"] = value
        elif name.startswith("ssl_"):
            options[name] = value
        else:
            raise ValueError(f"unknown option {name!r}")
    if path.strip("/") not in ("", "0"):
        raise ValueError("Redis Cluster has only database 0")
    nodes = []
    for node in netloc.split(","):
        host, colon, port = node.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{node!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    if scheme == "rediss+cluster":
        options["ssl"] = True
    return nodes, options


_REDIS_PY_TRIPS = (AttributeError, KeyError, IndexError, TypeError, RuntimeError)
"""What redis-py 5.0 raises from inside itself while a cluster changes (a None
writer of a dropped connection, two topology refreshes clashing)."""


def _no_answer(exc: BaseException) -> bool:
    """Whether ``exc`` says a node gave no answer (down, unreachable, stalled),
    rather than an answer (an error reply, refused credentials)."""
    if isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
        return False
    if isinstance(exc, NoFreeConnectionError):
        return exc.stalled
    if isinstance(exc, _REDIS_PY_TRIPS):
        # redis-py 5.0 tripping over a connection its own reconnect dropped
        # (AttributeError on a None writer) while a master is down: that node
        # gave no answer; our own bugs still raise.
        return _raised_in_redis_py(exc)
    return isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | OSError)


async def _first_answer(attempts: Sequence[Callable[[], Awaitable[T]]], patience: float) -> T:
    """The result of the first of ``attempts`` (each asking one node) that
    answers. The first starts at once; the next one as soon as one running
    fails with no answer from its node (:func:`_no_answer`), or after
    ``patience`` seconds without a result. Any other error is raised at once;
    when every attempt failed, the first one's error. Attempts still running
    are cancelled."""
    waiting = list(attempts)
    started: list[asyncio.Future[T]] = []
    running: set[asyncio.Future[T]] = set()
    try:
        while waiting or running:
            if waiting:
                started.append(asyncio.ensure_future(waiting.pop(0)()))
                running.add(started[-1])
            done, running = await asyncio.wait(
                running, timeout=patience if waiting else None, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                exc = task.exception()
                if exc is None:
                    return task.result()
                if not _no_answer(exc):
                    raise exc
        failure = started[0].exception()
        assert failure is not None  # every attempt failed
        raise failure
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def _replicas_in(cluster_nodes: str, master: str) -> list[str]:
    """The ``host:port`` of each replica of ``master`` (``host:port``) that is not
    marked failing, in a ``CLUSTER NODES`` reply."""
    lines = [line.split() for line in cluster_nodes.splitlines() if line.strip()]
    ids = [fields[0] for fields in lines if fields[1].split("@")[0] == master]
    return [
        fields[1].split("@")[0]
        for fields in lines
        if ids
        and fields[3] == ids[0]
        and not {"fail", "fail?", "noaddr", "handshake"} & set(fields[2].split(","))
    ]


class _NotConnected(rexc.ConnectionError):
    """A node refused a new connection: nothing was sent on it."""


class _NodePool:
    """Connections to one cluster node of the appender's own, as InOrderConnection
    takes them from a pool. Not the node's pool: redis-py's cluster client
    closes every pooled connection of every node on some errors (CLUSTERDOWN,
    every fifth MOVED), which would fail the batches in flight on them."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    async def get_connection(self) -> Any:
        connection: Any = self.node.connection_class(**self.node.connection_kwargs)
        try:
            await connection.connect()
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            raise _NotConnected(f"cannot connect to {self.node.name}: {exc}") from exc
        return connection

    async def release(self, connection: Any) -> None:
        with contextlib.suppress(rexc.RedisError, OSError):
            await connection.disconnect()


class _NodeClient:
    """What InOrderConnection needs of a client: its pool."""

    def __init__(self, node: ClusterNode) -> None:
        self.connection_pool = _NodePool(node)


async def _first_set(events: set[asyncio.Event], timeout: float | None) -> None:
    """Return once one of ``events`` is set or ``timeout`` seconds passed."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        if waiters:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        elif timeout is not None:
            await asyncio.sleep(timeout)
    finally:
        for waiter in waiters:
            waiter.cancel()


class _ClusterAppender:
    """In-order connections per node for appends, routed by a slot map of its own.

    The map changes only under ``_lock``, which is held while batches are
    routed and sent (not while their replies are awaited, nor while a
    connection is made: :meth:`_connect_first`), so a batch sent again after
    a redirect leaves before any later batch of its slot.

    A write for a node that refuses connections (a master killed and not yet
    replaced) or does not answer (a stopped process) waits, and later writes
    for its slot wait behind it (``_tails``), so they do not overtake it;
    writes for other slots go on at once (the lock is not held while it
    waits).
    """

    def __init__(self, client: RedisCluster, *, timeout: float) -> None:
        self._client = client
        self._router = SlotRouter(client)
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._slot_node: dict[int, str] = {}
        self._key_slots: dict[Any, int] = {}
        self._connections: dict[str, InOrderConnection] = {}
        self._closed = False
        self._refresh = False
        self._tails: dict[int, asyncio.Event] = {}
        """Per slot, the event of the newest call with a write for it: set once
        that write left (or never will); the next call's write for the slot
        waits for it."""
        self._order = WriteOrder()
        """Each partition's writes in flight, in the order they first left:
        whether one may go to a node yet (see ``_write_order``)."""

    async def _connection(self, name: str) -> InOrderConnection:
        connection = self._connections.get(name)
        if connection is None:
            self._check_open()  # a write racing the close: no new connection
            node = self._client.get_node(node_name=name)
            if node is None:  # a node redis-py has not seen yet (say, added since)
                await self._client.nodes_manager.initialize()
                self._check_open()  # closed meanwhile
                node = self._client.get_node(node_name=name)
                made = self._connections.get(name)  # by another call meanwhile
                if made is not None:
                    return made
            if node is None:
                raise rexc.ConnectionError(f"the cluster has no node {name}")
            connection = self._connections[name] = InOrderConnection(
                _NodeClient(node),  # type: ignore[arg-type]
                timeout=self._timeout,
                health_check_interval=HEALTH_CHECK_INTERVAL,
            )
        return connection

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("the appender was closed: nothing was sent")

    def node_of(self, key: Any) -> str | None:
        """The node this appender last routed ``key``'s slot to, else the one
        redis-py's map names (no I/O); None when neither knows."""
        slot = self._slot(key)
        name = self._slot_node.get(slot)
        if name is None:
            try:
                name = self._client.nodes_manager.get_node_from_slot(slot).name
            except (rexc.RedisError, rexc.RedisClusterException, *_REDIS_PY_TRIPS):
                return None
        return name

    def _slot(self, key: Any) -> int:
        """``key``'s slot (a stream's key, or a command's key as sent), computed
        once per key: CRC16 in Python costs a lone publish more than a dict."""
        slot = self._key_slots.get(key)
        if slot is None:
            slot = self._key_slots[key] = key_slot(_keys_text(key))
        return slot

    async def _node_for(self, slot: int) -> str:
        name = self._slot_node.get(slot)
        if name is None:
            if self._refresh:
                self._refresh = False
                await self._refresh_map()
            node = self._client.nodes_manager.get_node_from_slot(slot)
            name = self._slot_node[slot] = node.name
        return name

    async def _refresh_map(self) -> None:
        """Ask the cluster for its slot map again.

        redis-py 5.0 trips when two refreshes run at once (its own, after another
        task's command failed on a dead master, and this one): the one that
        finishes first changes the dict of nodes the other iterates ("dictionary
        changed size during iteration"). Nothing was sent then: the call's writes
        go by the map redis-py has (a write to a node that moved on is redirected
        or waits, as any), and a later lookup refreshes again, rather than every
        write of this call failing, healthy partitions' included.
        """
        try:
            await self._client.nodes_manager.initialize()
        except _REDIS_PY_TRIPS as exc:
            if not _raised_in_redis_py(exc):
                raise
            self._refresh = True

    async def call_many(
        self, commands: list[tuple[Any, ...]], after: tuple[Any, ...] | None = None
    ) -> tuple[list[Any], list[tuple[Any, list[int]]]]:
        """Run one-key ``EVAL`` commands (the key is their 4th item), each
        partition's in the order given, and ``after`` (a WAIT or WAITAOF) behind each
        node's; return their replies in that order, and each of ``after``'s replies
        with the indexes of the commands it confirms (those its node stored)."""
        self._check_open()  # no routing either: it would ask the cluster for its map
        replies: list[Any] = [None] * len(commands)
        commands = list(commands)  # a write may be sent again with a key undeclared
        # A wait's reply counts only for a node that stored some of its batch,
        # and only for what that node stored.
        after_replies: list[tuple[asyncio.Future[Any], list[int]]] = []
        # (index, where a redirect sends it, whether that is an ASK)
        todo: list[tuple[int, str | None, bool]] = [(i, None, False) for i in range(len(commands))]
        # index -> its stream (the command's key as first sent), its flight
        flights: dict[int, tuple[Any, Flight]] = {}
        order = self._order
        try:
            for _ in range(MAX_REDIRECTS + 1):
                sent: list[tuple[int, str, bool, asyncio.Future[Any]]] = []
                waits: dict[str, asyncio.Future[Any]] = {}
                unsent: dict[int, Exception] = {}
                await self._send_all(commands, todo, after, sent, waits, unsent, flights)
                for i, exc in unsent.items():
                    replies[i] = exc  # its flight, if any, is done (_give_up)
                todo = []
                stored: dict[str, list[int]] = {}
                for i, name, asking, future in sent:
                    try:
                        replies[i] = await future
                        stored.setdefault(name, []).append(i)
                    except rexc.TryAgainError as exc:
                        # The importing node lacks a key the write names. A
                        # publisher's link key that exists on neither node (its
                        # first write to the partition in a minute) never comes:
                        # sent again at once with it undeclared (as SlotRouter's
                        # steps); anything else fails the write.
                        again = None
                        if asking:
                            # Pending from now: a later write of the partition
                            # answered meanwhile waits for this one's new try.
                            order.redirected(flights[i][1])
                            again = await self._router.undeclared(
                                self._slot(commands[i][3]), name, commands[i]
                            )
                        if again is None:
                            replies[i] = exc
                        else:
                            commands[i] = again
                            todo.append((i, name, True))
                            continue
                    except rexc.AskError as exc:  # MovedError is one too
                        # Not run. Sent again, under the lock, before any later
                        # batch of its slot: the map changes only there.
                        moved = isinstance(exc, rexc.MovedError)
                        todo.append((i, f"{exc.host}:{exc.port}", not moved))
                        order.redirected(flights[i][1])
                        continue
                    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                        self._forget(name)
                        replies[i] = exc
                    except rexc.ResponseError as exc:
                        replies[i] = exc
                    order.done(*flights.pop(i))
                for name, wait in waits.items():
                    if name in stored:
                        after_replies.append((wait, stored[name]))
                    else:  # every batch there was redirected (it may be a replica now)
                        wait.add_done_callback(lambda f: f.cancelled() or f.exception())
                if not todo:
                    waited = await asyncio.gather(
                        *(wait for wait, _ in after_replies), return_exceptions=True
                    )
                    return replies, [
                        (reply, indexes)
                        for reply, (_, indexes) in zip(waited, after_replies, strict=True)
                    ]
            raise rexc.ClusterDownError(
                f"a batch was redirected {MAX_REDIRECTS} times: the cluster keeps moving its slot"
            )
        finally:
            # Writes redirected and not sent again, or not answered (cancelled).
            for stream, flight in flights.values():
                order.done(stream, flight)

    def _give_up(
        self,
        i: int,
        exc: Exception,
        unsent: dict[int, Exception],
        flights: dict[int, tuple[Any, Flight]],
    ) -> None:
        """Write ``i`` will not be sent (again): ``exc`` is its reply, and the
        partition's later writes no longer wait for it."""
        unsent[i] = exc
        flight = flights.pop(i, None)
        if flight is not None:
            self._order.done(*flight)

    async def _send_all(
        self,
        commands: list[tuple[Any, ...]],
        todo: list[tuple[int, str | None, bool]],
        after: tuple[Any, ...] | None,
        sent: list[tuple[int, str, bool, asyncio.Future[Any]]],
        waits: dict[str, asyncio.Future[Any]],
        unsent: dict[int, Exception],
        flights: dict[int, tuple[Any, Flight]],
    ) -> None:
        """Route and send ``todo``, adding each command's reply future to
        ``sent``, each node's ``after`` to ``waits``, and the error of each
        command that could not be sent to ``unsent`` (the others' fates are
        their own: a node that fails fails only its commands), and each sent
        write's flight to ``flights`` (``_write_order``).

        Writes of one slot leave in the order of the calls: as a call begins it
        queues, per slot, behind the previous call with a write for that slot,
        and a write leaves once the one before it left. A write, new or sent
        again after a redirect, that could reach a node before an earlier write
        of its partition (one on its way back from the old master of a moved
        slot, or waiting to be sent again) is held back until that one went on
        (``_write_order``), up to the write's time. A node that refuses a new
        connection (a master killed and not yet replaced), or does not answer
        the try to reach it, got nothing: its commands are routed afresh from a
        new view of the cluster and sent again, with growing pauses, until the
        socket timeout; so a publish stalls through a failover instead of
        failing. Only the writes queued behind them in their slots wait (and
        those of this call's other nodes while the check waits for the silent
        one: README, Failover): the lock is let go between tries. A write whose
        connection the check made ready, and which found it idle again (or lost)
        under the lock, goes back to the check at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        pause = 0.05

        def slot_of(i: int) -> int:
            return self._slot(commands[i][3])

        # Queued before any await, so the order of entry is the order of the
        # calls. A redirected write (its target known) is a resend of one that
        # left in its turn: it waits for no tail (only, maybe, for an earlier
        # write of its partition: _write_order).
        behind: dict[int, asyncio.Event] = {}
        mine: dict[int, asyncio.Event] = {}
        for i, target, _ in todo:
            slot = slot_of(i)
            if target is None and slot not in mine:
                previous = self._tails.get(slot)
                if previous is not None and not previous.is_set():
                    behind[slot] = previous
                mine[slot] = self._tails[slot] = asyncio.Event()

        def unreached(items: list[tuple[int, str | None, bool]], why: str) -> None:
            for i, _, _ in items:
                error = _NotConnected(
                    f"no node took slot {slot_of(i)} within {self._timeout:g} s: {why}"
                )
                self._give_up(i, error, unsent, flights)

        def ready(item: tuple[int, str | None, bool]) -> bool:
            previous = behind.get(slot_of(item[0]))
            return item[1] is not None or previous is None or previous.is_set()

        # Writes whose node refused or could not be reached (or whose slot was
        # forgotten), each try's routed afresh once its pause is over; a write
        # whose connection was found not ready under the lock goes back to the
        # check at once (which connects or PINGs there, bounded by the write's
        # time: the pauses are for nodes that did not answer it).
        paused: list[tuple[float, list[tuple[int, str | None, bool]]]] = []
        try:
            while todo or paused:
                now = loop.time()
                while paused and paused[0][0] <= now:  # in the order of resuming
                    todo = todo + paused.pop(0)[1]
                go = [item for item in todo if ready(item)]
                waiting = [item for item in todo if not ready(item)]
                refused: list[tuple[int, str | None, bool]] = []
                again: list[tuple[int, str | None, bool]] = []
                held_back: list[tuple[tuple[int, str | None, bool], asyncio.Event]] = []
                # A redirected write is sent again as it comes back, unless an
                # earlier write of its partition has yet to go on (_send_routed
                # holds it back). It may connect under the lock, as every write
                # did before.
                redirected = any(target is not None for _, target, _ in go)
                if go and not redirected and self._needs_connecting(commands, go):
                    try:
                        async with asyncio.timeout_at(deadline):
                            go, refused = await self._connect_first(commands, go)
                    except TimeoutError:  # asyncio's: no try left in the write's time
                        go, refused = [], go
                if go:
                    async with self._lock:
                        again = await self._send_routed(
                            commands,
                            go,
                            after,
                            sent,
                            waits,
                            unsent,
                            refused,
                            held_back,
                            flights,
                            connect=redirected,
                        )
                held_items = [item for item, _ in held_back]
                held = {slot_of(i) for i, _, _ in refused + again + held_items}
                for i, _, _ in go:
                    if slot_of(i) not in held and slot_of(i) in mine:
                        mine[slot_of(i)].set()
                if refused and loop.time() + pause > deadline:
                    unreached(refused, "its master refuses connections, or does not answer")
                    refused = []
                if again and loop.time() >= deadline:
                    unreached(again, "its turn to be sent came too late")
                    again = []
                if held_back and loop.time() >= deadline:
                    unreached(
                        held_items,
                        "an earlier write of its partition, on its way back from the "
                        "slot's old master, was not sent on in time",
                    )
                    held_back, held_items = [], []
                if refused:
                    paused.append((loop.time() + pause, refused))
                    pause = min(pause * 2, 1.0)
                todo = waiting + again + held_items  # a slot's writes are all in one of these
                if again:
                    continue
                if todo or paused:
                    events = {behind[slot_of(i)] for i, _, _ in waiting}
                    resume = max(0.0, paused[0][0] - loop.time()) if paused else None
                    if held_back:
                        events |= {event for _, event in held_back}
                        until_deadline = max(0.0, deadline - loop.time())
                        resume = until_deadline if resume is None else min(resume, until_deadline)
                    await _first_set(events, resume)
        finally:
            for slot, event in mine.items():
                event.set()
                if self._tails.get(slot) is event:
                    del self._tails[slot]

    def _needs_connecting(
        self, commands: list[tuple[Any, ...]], todo: list[tuple[int, str | None, bool]]
    ) -> bool:
        """Whether a write of ``todo`` (none redirected) goes to a slot whose
        node the appender does not know, or to a node whose connection is not
        usable at once: the usual answer, no, costs a lone publish a few dict
        lookups."""
        slot_node, connections = self._slot_node, self._connections
        for i, _, _ in todo:
            name = slot_node.get(self._slot(commands[i][3]))
            if name is None:
                return True
            connection = connections.get(name)
            if connection is None or not connection.usable():
                return True
        return False

    async def _connect_first(
        self, commands: list[tuple[Any, ...]], todo: list[tuple[int, str | None, bool]]
    ) -> tuple[list[tuple[int, str | None, bool]], list[tuple[int, str | None, bool]]]:
        """Make the connections to the nodes ``todo`` (no redirected write)
        goes to usable (connect, or PING one idle long) before the routing lock
        is taken, each node's at once; return ``todo`` split into what may be
        sent and what goes to a node that could not be reached (routed afresh
        after a pause, as a refused connection is, while the write's time
        lasts). A master that is silent (SIGSTOPped, its host cut off without
        a reset) holds a try for up to the socket timeout (the kernel takes the
        connection; the handshake waits for an answer), usually the write's
        whole time: under the lock, every write to the other masters waited
        for it. Under the lock these writes are sent with ``connect=False``: a
        connection lost in between sends them back here.

        The node of a write is the one the lock's routing will pick (the map
        changes only under the lock). After a lost connection made the
        appender forget where that node's slots are, redis-py's map is asked
        again here, not under the lock (:meth:`_send_routed` sends such a
        write back), and only by a write whose slot is forgotten: redis-py
        may ask the silent node first."""
        if self._refresh and any(
            self._slot(commands[i][3]) not in self._slot_node for i, _, _ in todo
        ):
            self._refresh = False
            await self._refresh_map()
        nodes: dict[int, str] = {}
        for i, _, _ in todo:
            name = self.node_of(commands[i][3])
            if name is not None:  # else the routing under the lock finds out, and says why
                nodes[i] = name
        connections = self._connections
        names = [
            name
            for name in set(nodes.values())
            if name not in connections or not connections[name].usable()
        ]
        outcomes = await asyncio.gather(
            *(self._ready(name) for name in names), return_exceptions=True
        )
        unreached = set()
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                # Closed, or not a lost connection: not a node to wait for.
                if isinstance(outcome, ConnectionClosed) or not isinstance(
                    outcome, rexc.ConnectionError | rexc.TimeoutError | OSError
                ):
                    raise outcome
                unreached.add(name)
                self._forget(name)
        if not unreached:
            return todo, []
        go = [item for item in todo if nodes.get(item[0]) not in unreached]
        return go, [item for item in todo if nodes.get(item[0]) in unreached]

    async def _ready(self, name: str) -> None:
        await (await self._connection(name)).ready()

    async def _send_routed(
        self,
        commands: list[tuple[Any, ...]],
        todo: list[tuple[int, str | None, bool]],
        after: tuple[Any, ...] | None,
        sent: list[tuple[int, str, bool, asyncio.Future[Any]]],
        waits: dict[str, asyncio.Future[Any]],
        unsent: dict[int, Exception],
        refused: list[tuple[int, str | None, bool]],
        held_back: list[tuple[tuple[int, str | None, bool], asyncio.Event]],
        flights: dict[int, tuple[Any, Flight]],
        *,
        connect: bool,
    ) -> list[tuple[int, str | None, bool]]:
        """One try of :meth:`_send_all` (under the lock). The commands of nodes
        that refused a connection, and those whose slot was forgotten, go to
        ``refused``, to be routed afresh after a pause; those that must wait
        for an earlier write of their partition go to ``held_back``, with the
        event that says it changed; return those to be checked again at once:
        their connection was not ready (``connect=False``)."""
        by_node: dict[str, list[tuple[int, bool]]] = {}
        again: list[tuple[int, str | None, bool]] = []
        order = self._order
        for item in todo:
            i, target, asking = item
            slot = self._slot(commands[i][3])
            if target is None:
                if not connect and self._refresh and slot not in self._slot_node:
                    # The map is asked again outside the lock (_connect_first):
                    # redis-py may ask a silent node first. Paused: a refresh
                    # redis-py 5.0 trips over sets _refresh again.
                    refused.append((i, None, False))
                    continue
                target = await self._node_for(slot)
            own = flights.get(i)
            if own is None:
                wait = order.blocked(commands[i][3], target, None)
            else:
                wait = order.blocked(own[0], target, own[1])
            if wait is not None:  # behind an earlier write of its partition (_write_order)
                held_back.append((item, wait))
                continue
            if item[1] is not None and not asking:  # MOVED: the slot's new home, from now on
                self._slot_node[slot] = target
            by_node.setdefault(target, []).append((i, asking))
        for name, items in by_node.items():
            batch: list[tuple[Any, ...]] = []
            for i, asking in items:
                batch += [("ASKING",), commands[i]] if asking else [commands[i]]
            try:
                connection = await self._connection(name)
                futures = await connection.send_many(batch, after, connect=connect)
            except NotReady:  # nothing sent: made ready outside the lock next try
                again += [(i, None, False) for i, _ in items]
                continue
            except _NotConnected:
                self._forget(name)
                self._connections.pop(name, None)
                refused += [(i, None, False) for i, _ in items]
                continue
            except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                self._forget(name)
                for i, _ in items:
                    self._give_up(i, exc, unsent, flights)
                continue
            if after is not None:
                earlier = waits.get(name)
                if earlier is not None:  # the later wait covers its writes too
                    earlier.add_done_callback(lambda f: f.cancelled() or f.exception())
                waits[name] = futures.pop()
            futures = [f for f, c in zip(futures, batch, strict=True) if c[0] != "ASKING"]
            sent += [(i, name, a, f) for (i, a), f in zip(items, futures, strict=True)]
            for i, asking in items:
                own = flights.get(i)
                if own is None:  # its first send: the command's key is its stream's
                    stream = commands[i][3]
                    flights[i] = (stream, order.sent(stream, name, asking, None))
                else:
                    order.sent(own[0], name, asking, own[1])
        return again

    def _forget(self, name: str) -> None:
        """A node's connection broke: route its slots afresh next time (it may be
        gone, or a replica now)."""
        self._slot_node = {s: n for s, n in self._slot_node.items() if n != name}
        self._refresh = True

    async def close(self) -> None:
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            await connection.close()


_REDIS_PY = os.path.dirname(rexc.__file__) + os.sep


def _raised_in_redis_py(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside the redis package."""
    traceback = exc.__traceback__
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback.tb_frame.f_code.co_filename.startswith(_REDIS_PY)


def _refused_login(exc: BaseException) -> BaseException | None:
    """The AuthenticationError or NOPERM behind ``exc``: redis-py's cluster client
    reports a node that refused the user only as "cannot be connected"."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(
            seen, rexc.AuthenticationError | rexc.AuthorizationError | rexc.NoPermissionError
        ):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _keys_text(key: Any) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


class RedisClusterBackend(RedisBackend):
    """The backend on Redis Cluster, reached by a ``redis+cluster://`` URL.

    ``redis+cluster://[user:password@]host:port[,host:port...]`` names one or
    more nodes to discover the cluster from; ``rediss+cluster://`` for TLS
    (``ssl_ca_certs`` as for :class:`RedisBackend`). ``max_connections``
    (default 64) caps the client's pooled connections per node; a command
    beyond it waits, up to ``socket_timeout``, for one to be free (see
    ``_node_gates``). Publishing keeps one more connection per node of its own,
    and reading (on Redis 7.0+) one pub/sub connection per master for wake-ups.
    """

    def _open(
        self, url: str, options: dict[str, Any], socket_timeout: float, max_connections: int
    ) -> Any:
        try:
            nodes, url_options = _nodes(url)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"cannot use Redis Cluster URL {redact(url)!r}: {exc}; use "
                "redis+cluster://[user:password@]host:port[,host:port...] or rediss+cluster://"
            ) from None
        # No max_connections for redis-py: the cap is kept by the gates, at
        # which a command waits instead of failing (see _node_gates).
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            decode_responses=False,
            socket_timeout=socket_timeout,
            socket_connect_timeout=min(SOCKET_CONNECT_TIMEOUT, socket_timeout),
            health_check_interval=HEALTH_CHECK_INTERVAL,
            # Never rebuild the whole view (closing every node's connections)
            # after some MOVED replies: 0 turns that off (redis-py 5.0.1 to 7.x);
            # each MOVED patches its slot.
            reinitialize_steps=0,
            **{**url_options, **options},
        )
        client.set_response_callback("XREADGROUP", _raw)
        _raw_pending(client)
        gate_nodes(client, NodeGates(limit=max_connections, timeout=socket_timeout))
        return client

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 64,
        socket_timeout: float = SOCKET_TIMEOUT,
        ssl_ca_certs: str | None = None,
        durability: Durability | None = None,
    ) -> None:
        self._idle: dict[tuple[str, str, str], float] = {}
        # A read whose poll failed on some partitions and read entries from
        # others returns the entries; the error is raised by the next read of
        # that consumer (any of its readers), so it is logged and retried, not
        # hidden by a busy partition.
        self._deferred: dict[tuple[str, str, str], Exception] = {}
        """Per subscriber (topic, group, consumer): its wait after the next empty poll."""
        self._wake: bool | None = None
        """Whether appends notify idle readers (see :meth:`_wakes`); None: not
        known yet."""
        self._wake_off = False
        """An append's ``SPUBLISH`` was refused: appends no longer notify."""
        self._deciding: asyncio.Future[bool] | None = None
        """The background ask of the masters' versions for :meth:`_wakes`."""
        self._wakeups: Wakeups | None = None
        """The wake-up listener of this client's readers, once one read."""
        self._closing = False
        self._replicas: dict[str, InOrderConnection] = {}
        """Per replica (``host:port``) asked for records while its master was
        down: a connection of this client's own, each read sent behind ``READONLY``."""
        self._dead_letter_steps = _Script(
            _script("dead_letter_steps.lua", "_dead_letter_append.lua")
        )
        super().__init__(
            url,
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            ssl_ca_certs=ssl_ca_certs,
            durability=durability,
        )
        self._router = SlotRouter(self._redis)

    async def _routed(self, key: str | None, *command: Any, resend: bool = True) -> Any:
        if key is None:  # no slot to route by: redis-py picks a node
            return await super()._routed(key, *command)
        (reply,) = await self._router.run([(key, command)], resend=resend)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _pipelined(
        self, calls: Sequence[tuple[str | None, tuple[Any, ...]]], *, resend: bool = True
    ) -> list[Any]:
        keyed = [(key, command) for key, command in calls if key is not None]
        if len(keyed) < len(calls):
            return await super()._pipelined(calls)
        return await self._router.run(keyed, resend=resend)

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        """By the master the appender last routed each partition's slot to
        (None: none yet, or its node's connection broke)."""
        keys = self._keys(topic)
        node_of = self._appender.node_of
        groups: dict[str | None, list[int]] = {}
        for partition in partitions:
            groups.setdefault(node_of(keys[partition]), []).append(partition)
        return groups

    async def _append_many(
        self, commands: list[tuple[Any, ...]], after: tuple[Any, ...] | None
    ) -> tuple[list[Any], list[tuple[Any, list[int]]]]:
        appender: _ClusterAppender = self._appender
        return await appender.call_many(commands, after)

    def _in_order(self, socket_timeout: float) -> Any:
        return _ClusterAppender(self._redis, timeout=socket_timeout)

    def _raise_lost(self, replies: Sequence[Any]) -> None:
        """A node's lost connection fails only the writes that were on it (each
        reply its error): the other masters' partitions keep their results."""

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        with super()._errors():
            try:
                yield
            except SlotMigratingError as exc:
                raise UnavailableError(
                    f"slot {exc.slot} of the Redis Cluster at {self.url} is migrating to "
                    f"another master ({exc}); try again once the migration is over"
                ) from exc
            except NoFreeConnectionError as exc:
                if exc.stalled:
                    raise UnavailableError(
                        f"a node of the Redis Cluster at {self.url} does not answer: {exc}. "
                        "The node may be stalled or failing over (its replica takes over "
                        "after about twice cluster-node-timeout): try again. Less likely, "
                        "this client runs more slow commands at once than max_connections "
                        "allows: lower its concurrency (subscribers, publishes) or raise "
                        "max_connections"
                    ) from exc
                raise UnavailableError(
                    f"the Redis Cluster at {self.url} is too busy for this client: {exc}; "
                    "give the client fewer concurrent subscribers and publishes, or a "
                    "higher max_connections"
                ) from exc
            except _TRANSIENT as exc:
                refused = _refused_login(exc)
                if refused is not None:  # bad credentials or rights: not transient
                    raise refused from None
                raise UnavailableError(
                    f"the Redis Cluster at {self.url} is reconfiguring ({type(exc).__name__}: "
                    f"{exc}); try again"
                ) from exc
            except _REDIS_PY_TRIPS as exc:
                # redis-py 5.0's cluster pipeline trips over a node it has just
                # dropped from its view (AttributeError on None) while the
                # cluster fails over, and two of its topology refreshes at once
                # clash ("dictionary changed size during iteration"): transient.
                # Our own bugs still raise.
                if not _raised_in_redis_py(exc):
                    raise
                raise UnavailableError(
                    f"redis-py's cluster client failed while the Redis Cluster at {self.url} "
                    f"changes ({type(exc).__name__}: {exc}); try again"
                ) from exc

    def _unreachable(self, exc: Exception) -> str:
        return (
            f"cannot reach a node of the Redis Cluster at {self.url}: {exc}; a master that "
            "is down is replaced by its replica after about twice cluster-node-timeout, so "
            "try again; if no node answers, check that the cluster runs and that "
            "STREAMSUB_URL or the URL is right"
        )

    async def _slot_map(self) -> list[tuple[int, int, str, str | None]]:
        """The cluster's slot ranges as it says now (``CLUSTER SLOTS``, not
        redis-py's cached view): (first, last, master's host:port, its node id).
        Asked of one node after another (in random order) until one answers: a
        node may be down."""
        with self._errors():
            await self._redis.initialize()
            nodes = self._redis.get_nodes()
            random.shuffle(nodes)
            ask = self._redis.execute_command
            raw = await _first_answer(
                [functools.partial(ask, "CLUSTER", "SLOTS", target_nodes=node) for node in nodes],
                NEXT_NODE_AFTER,
            )
        return [
            (
                int(first),
                int(last),
                f"{_keys_text(host)}:{port}",
                _keys_text(rest[0]) if rest else None,
            )
            for first, last, (host, port, *rest), *_ in raw
        ]

    async def _layout(self, record: TopicRecord) -> TopicRecord:
        ranges: dict[str, list[tuple[int, int]]] = {}
        for first, last, address, _ in await self._slot_map():  # the masters of now
            ranges.setdefault(address, []).append((first, last))
        salts = balanced_salts(record.name, record.partitions, list(ranges.values()))
        return TopicRecord(
            record.name,
            record.partitions,
            _keys.CLUSTER_LAYOUT,
            record.created,
            record.retention,
            salts,
        )

    async def _on_masters(self, *command: Any) -> dict[str, Any]:
        """``command``'s reply (or the error it answered) from every master that
        answers: one that does not (down, or failing over) is left out, with a
        warning naming it; UnavailableError when none answers."""
        with self._errors():
            await self._redis.initialize()  # the masters of now
            answered: dict[str, Any] = {}
            silent: list[tuple[str, BaseException]] = []
            # One master after the other, not at once: redis-py 5.0 closes the
            # whole client when a node refuses a connection, which cut the other
            # masters' calls in flight (none answered with one master down).
            for node in self._redis.get_primaries():
                try:
                    answered[node.name] = await self._redis.execute_command(
                        *command, target_nodes=node
                    )
                except rexc.ResponseError as refusal:
                    answered[node.name] = refusal
                except Exception as error:
                    if not _no_answer(error):
                        raise
                    silent.append((node.name, error))
            if silent and not answered:
                raise silent[0][1]
        for name, exc in silent:
            log.warning(
                "streamsub: master %s of the Redis Cluster at %s did not answer %s (%s): "
                "left out of the server checks (version, maxmemory-policy, fsync); it may "
                "be down or failing over",
                name,
                self.url,
                command[0],
                exc,
            )
        return answered

    async def partition_nodes(self, topic: TopicRecord) -> list[str]:
        """Per partition, the ``host:port`` of the master that holds it now."""
        with self._errors():
            await self._redis.initialize()
            return [self._redis.get_node_from_key(key).name for key in self._keys(topic)]

    async def locate_partitions(self, topic: TopicRecord) -> list[PartitionNode]:
        """Per partition, the master that serves its slot now, and its node id."""
        slots = await self._slot_map()
        located = []
        for partition, key in enumerate(self._keys(topic)):
            slot = key_slot(key)
            found = [
                (address, node) for first, last, address, node in slots if first <= slot <= last
            ]
            if not found:
                raise UnavailableError(
                    f"no master of the Redis Cluster at {self.url} serves slot {slot} "
                    f"(partition {partition} of topic {topic.name!r}): the cluster is "
                    "reconfiguring or lost that master; try again"
                )
            located.append(PartitionNode(partition, found[0][0], found[0][1]))
        return located

    async def _read(self, *commands: tuple[Any, ...]) -> list[Any]:
        """The replies to read-only record commands (``HGETALL``, ``SMEMBERS``;
        the key second), in order: per master, pipelined to it and, once it
        refused the connection or has not answered within
        :data:`NEXT_NODE_AFTER`, to a replica of it (see the module docstring,
        Records while a master is down). A replica's answer may lag the
        master's by the replication delay."""
        await self._redis.initialize()
        slots = self._redis.nodes_manager.slots_cache
        groups: dict[str, list[int]] = {}
        for i, command in enumerate(commands):
            holders = slots.get(key_slot(_keys_text(command[1])))
            groups.setdefault(holders[0].name if holders else "", []).append(i)
        on_master = super()._read
        replies: list[Any] = [None] * len(commands)

        async def read(master: str, indexes: list[int]) -> None:
            batch = [commands[i] for i in indexes]
            answers = await _first_answer(
                [
                    functools.partial(on_master, *batch),
                    functools.partial(self._on_replicas, master, batch),
                ],
                NEXT_NODE_AFTER,
            )
            for i, answer in zip(indexes, answers, strict=True):
                replies[i] = answer

        reads = [asyncio.ensure_future(read(*group)) for group in groups.items()]
        try:
            await asyncio.gather(*reads)
        finally:
            for pending in reads:
                pending.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
        return replies

    async def _on_replicas(self, master: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        """``commands``' replies from a replica of ``master`` (``host:port``),
        as the other nodes list them now (``CLUSTER NODES``: ``CLUSTER SLOTS``,
        and so redis-py, leaves out a replica until gossip brought its
        replication offset), asked one after another as :func:`_first_answer` does."""
        others = [node for node in self._redis.get_nodes() if node.name != master]
        random.shuffle(others)
        ask = self._redis.execute_command
        listing = await _first_answer(
            [functools.partial(ask, "CLUSTER", "NODES", target_nodes=node) for node in others],
            NEXT_NODE_AFTER,
        )
        replicas = _replicas_in(_keys_text(listing), master)
        if not replicas:
            raise rexc.ConnectionError(f"{master} does not answer and has no replica to ask")
        return await _first_answer(
            [functools.partial(self._on_replica, address, commands) for address in replicas],
            NEXT_NODE_AFTER,
        )

    async def _on_replica(self, address: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        """``commands``' replies from the replica at ``address``, sent behind
        ``READONLY`` on this client's own connection to it (never a pooled
        one: see the module docstring)."""
        connection = self._replicas.get(address)
        if connection is None:
            if self._closing:
                raise ConnectionClosed("the client was closed: nothing was sent")
            host, _, port = address.rpartition(":")
            node = ClusterNode(host, int(port), "replica", **self._redis.connection_kwargs)
            connection = self._replicas[address] = InOrderConnection(
                _NodeClient(node),  # type: ignore[arg-type]
                timeout=self._socket_timeout,
                health_check_interval=HEALTH_CHECK_INTERVAL,
            )
        replies = await connection.call_many([("READONLY",), *commands])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        callbacks = self._redis.response_callbacks
        return [
            callbacks[command[0]](reply) if command[0] in callbacks else reply
            for command, reply in zip(commands, replies[1:], strict=True)
        ]

    async def close(self) -> None:
        self._closing = True
        if self._deciding is not None:
            self._deciding.cancel()
            await asyncio.gather(self._deciding, return_exceptions=True)
        if self._wakeups is not None:
            await self._wakeups.close()
            self._wakeups = None
        await self._appender.close()
        replicas = list(self._replicas.values())
        self._replicas.clear()
        for connection in replicas:
            await connection.close()
        await self._redis.aclose()

    async def server_info(self) -> ServerInfo:
        """The lowest version over the masters that answer: what every partition's
        server has; and an evicting maxmemory-policy if any master has one (its
        partitions may vanish), else the masters' common policy."""
        infos = list((await self._on_masters("INFO")).values())
        if any(isinstance(info, Exception) for info in infos):
            self._wake = False
            return ServerInfo((0, 0, 0), None)  # INFO refused (an ACL): nothing assumed
        versions, policies = [], set()
        for info in infos:
            raw = str(info.get("redis_version", "0.0.0"))
            parts = [int(p) if p.isdigit() else 0 for p in raw.split(".")[:3]]
            versions.append(tuple([*parts, 0, 0, 0][:3]))
            policies.add(info.get("maxmemory_policy"))
        self._wake = min(versions) >= (7, 0, 0)  # see _wakes
        evicting = sorted(str(p) for p in policies if p not in (None, "noeviction"))
        policy = evicting[0] if evicting else policies.pop() if len(policies) == 1 else None
        return ServerInfo(min(versions), None if policy is None else str(policy))  # type: ignore[arg-type]

    @_group_checked
    async def read(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partitions: Sequence[int],
        count: int,
        block_ms: int | None,
    ) -> list[Entry]:
        keys = self._keys(topic)

        async def poll() -> OwnedRead:
            # Routed by the key's slot here, not by redis-py (which would ask
            # the server for XREADGROUP's keys, COMMAND GETKEYS, before each).
            replies = await self._pipelined(
                [
                    (keys[p], ("XREADGROUP", "GROUP", group, consumer, "COUNT", count,
                               "STREAMS", keys[p], ">"))
                    for p in partitions
                ]
            )  # fmt: skip
            # Each partition's XREADGROUP ran on its own: one that failed must
            # not lose what the others delivered (they would wait out their
            # ack deadline and come back as a second attempt).
            failed = next((r for r in replies if isinstance(r, Exception)), None)
            entries = [
                Entry(p, entry_id.decode(), fields, 1)
                for p, reply in zip(partitions, replies, strict=True)
                if reply and not isinstance(reply, Exception)
                for _, items in reply
                for entry_id, fields in items
            ]
            if failed is not None:
                if not entries:
                    raise failed
                self._deferred[idle_key] = failed
            return OwnedRead(entries)

        idle_key = (topic.name, group, consumer)
        if (failed := self._deferred.pop(idle_key, None)) is not None:
            with self._errors():
                raise failed
        channels = [_keys.wake_channel(keys[p]) for p in partitions]
        return (await self._polled(idle_key, block_ms, poll, channels)).entries

    @_group_checked
    async def read_owned(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        tokens: Mapping[int, int],
        count: int,
        block_ms: int | None,
    ) -> OwnedRead:
        calls = [
            (p, self._read_owned_call(topic, group, [p]), [group, consumer, count, token])
            for p, token in tokens.items()
        ]

        async def poll() -> OwnedRead:
            entries: list[Entry] = []
            fenced: set[int] = set()
            # Not sent again after a broken connection: the server may have run
            # it, and the reader takes back what it left pending (reader.py).
            replies = await self._evalsha_many(self._read_owned, calls, resend=False)
            for (p, _, _), reply in zip(calls, replies, strict=True):
                read, fenced_here, _ = self._owned_entries([p], reply)
                entries.extend(read)
                fenced |= fenced_here
            return OwnedRead(entries, frozenset(fenced))

        keys = self._keys(topic)
        channels = [_keys.wake_channel(keys[p]) for p in tokens]
        return await self._polled((topic.name, group, consumer), block_ms, poll, channels)

    async def _polled(
        self,
        idle_key: tuple[str, str, str],
        block_ms: int | None,
        poll: Callable[[], Awaitable[OwnedRead]],
        channels: Sequence[str],
    ) -> OwnedRead:
        """``poll()`` until it brings entries or reports fenced partitions, or the
        block time is over (see the module docstring, Reading). ``channels``:
        the polled partitions' wake-up channels."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (block_ms or 0) / 1000
        wakeups = await self._wakeups_for_reads() if block_ms else None
        while True:
            # Taken before the poll: an append the poll misses notifies after it.
            seen = wakeups.counts(channels, idle_key) if wakeups is not None else ()
            with self._errors():
                await self._redis.initialize()  # at once when it is
                result = await poll()
            left = deadline - loop.time()
            if result.entries or result.fenced:
                self._idle.pop(idle_key, None)
                return result
            if left <= 0:
                return result
            # Idle: wait longer after each empty poll, also across reads; an
            # append to a polled partition ends the wait (at once if it came
            # during the poll).
            wait = self._idle.get(idle_key, IDLE_POLL_FIRST)
            self._idle[idle_key] = min(wait * 2, IDLE_POLL_MAX)
            if wakeups is None:
                await asyncio.sleep(min(wait, left))
            else:
                await wakeups.wait(channels, seen, min(wait, left))

    def _wakes(self) -> bool:
        """Whether appends notify (``SPUBLISH``): when every master runs 7.0+
        (Redis 6.2 has no sharded pub/sub), as :meth:`server_info` last found.
        Not known yet: no, and the masters are asked in the background (an
        append must not wait: calls reach the appender in the order made)."""
        if self._wake is None and (self._deciding is None or self._deciding.done()):
            self._deciding = asyncio.ensure_future(self._decide_wakes())
        return bool(self._wake) and not self._wake_off

    def _wake_refused(self) -> None:
        # Once: every refused SPUBLISH is an entry in the server's ACL LOG.
        if not self._wake_off:
            self._wake_off = True
            log.warning(
                "streamsub: the Redis Cluster refused this user SPUBLISH to the wake-up "
                "channels: appends stop announcing themselves, and idle subscribers poll "
                "(a message can wait up to about 0.1 s); to wake them, grant the user the "
                "channels ss:* and +spublish +ssubscribe +sunsubscribe (README, ACL users)"
            )

    async def _decide_wakes(self) -> bool:
        if self._wake is None:
            with contextlib.suppress(StreamsubError):  # not known: asked again later
                await self.server_info()
        return bool(self._wake)

    async def _wakeups_for_reads(self) -> Wakeups | None:
        # Checked again after the wait for the servers' version: a close, or
        # another reader's first read, may have come meanwhile (a listener
        # made twice, or after the close, would never be closed).
        if self._wakeups is None:
            wakes = await self._decide_wakes()
            if wakes and self._wakeups is None and not self._closing:
                self._wakeups = Wakeups(self._redis, timeout=self._socket_timeout)
        return self._wakeups

    @_group_checked
    async def dead_letter(
        self,
        topic: TopicRecord,
        group: str,
        consumer: str,
        partition: int,
        entry_id: str,
        target: TopicRecord,
        target_partition: int,
        packed: bytes,
        first_delivery_ms: int | None,
        last_delivery_ms: int | None,
    ) -> str | None:
        # The two streams are in different slots: append, then acknowledge.
        stream, delays, times = self._companions(topic, partition, group)
        target_key = self._keys(target)[target_partition]
        step = self._dead_letter_steps
        wake = [_keys.wake_channel(target_key)] if self._wakes() else []
        with self._errors():
            held = await self._evalsha(step, [stream, times], ["check", group, consumer, entry_id])
            if not held:
                return None
            first = held[0] if first_delivery_ms is None else first_delivery_ms
            last = held[1] if last_delivery_ms is None else last_delivery_ms
            new_id = await self._evalsha(step, [target_key], ["append", first, last, packed, *wake])
            await self._evalsha(step, [stream, times, delays], ["ack", group, consumer, entry_id])
        return f"{target_partition}-{_keys_text(new_id)}"

"""Wake-ups: an idle cluster reader polls as soon as one of its partitions gets an append.

On Redis Cluster a reader polls its partitions, waiting longer after each empty
poll (``_cluster.py``, Reading). On Redis 7.0+ the appends (``append.lua``, the
dead-letter append) also ``SPUBLISH`` an empty message to their partition's
wake-up channel (``_keys.wake_channel``: it shares the stream's hash tag, so it
is in the script's slot). This module listens: one pub/sub connection of its
own per master (the client's connection settings: TLS, user, password), one
``SSUBSCRIBE`` per channel a reader asked about (channels of different slots
cannot share one), and a counter per channel bumped by each ``smessage``.

A reader takes the counters of its partitions before a poll (:meth:`Wakeups.counts`)
and after an empty poll waits for one of them to move, or for its idle wait,
whichever comes first (:meth:`Wakeups.wait`). The notification is sent after
the entries are added, in the same script: if the poll did not see them, the
bump comes after the snapshot.

A notification is a hint, never needed for correctness: the readers' idle poll
stays the safety net (an older publisher, Redis 6.2, a subscription being
re-made). A connection that breaks, an error reply (``MOVED``: the map was
stale) or a ``sunsubscribe`` the server sends (a slot moved away) leaves those
channels unwatched; they are subscribed again where the slot map says, after
a pause that grows while that keeps failing (:data:`RETRY_FIRST` to
:data:`RETRY_MAX`). Errors here are logged (debug), never raised to readers. A
channel no reader asked about for :data:`WATCH_FOR` seconds is unsubscribed,
and :data:`LET_GO` seconds after the one reader that asked for it stopped
(an ordered subscriber that handed its partition over): a notification is read by every
client subscribed to it.
redis-py's asyncio ``PubSub`` has no sharded pub/sub in 5.0, so the commands
are spoken on a plain connection (RESP2: pushes are arrays).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Sequence
from typing import Any

import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from ..._cancel import raise_if_cancelled
from ._in_order import send_packed
from ._slots import key_slot

log = logging.getLogger("streamsub")

__all__ = ["LET_GO", "QUIET_PING", "RETRY_FIRST", "RETRY_MAX", "WATCH_FOR", "Wakeups"]

WATCH_FOR = 60.0
"""Seconds a channel stays subscribed after a reader last asked for it."""
LET_GO = 1.0
"""Seconds a channel stays subscribed after the one reader that asked for it
asked without it (an ordered subscriber that handed its partition over)."""
RETRY_FIRST = 0.05
"""Seconds before channels left unwatched are subscribed again; doubled while
that fails."""
RETRY_MAX = 2.0
"""The longest pause before subscribing again."""
QUIET_PING = 5.0
"""Seconds without a push before a PING checks the connection; no PONG within as
long again and the connection counts as dead."""


class Wakeups:
    """Per wake-up channel, a counter of notifications, and waits on them."""

    def __init__(self, client: RedisCluster, *, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        self._counts: dict[str, int] = {}
        self._asked: dict[str, float] = {}
        """Per watched channel, when a reader last asked for it (loop time)."""
        self._readers: dict[Hashable, tuple[frozenset[str], float]] = {}
        """Per reader, the channels of its last ask and when it was."""
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._home: dict[str, _NodeWatch] = {}
        """Per channel, the watch of the node it is (to be) subscribed on."""
        self._nodes: dict[str, _NodeWatch] = {}
        self._changed = asyncio.Event()
        self._stale = False
        """The slot map may be wrong: refresh it before placing channels."""
        self._pause = RETRY_FIRST
        self._retry_at = 0.0
        """When channels left unwatched by a failure may be placed again (loop time)."""
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._refused = False
        """The user may not subscribe (an ACL without the channels): off for good."""

    def counts(self, channels: Sequence[str], reader: Hashable = None) -> tuple[int, ...]:
        """The counters of ``channels`` now; they are watched from now on (for
        :data:`WATCH_FOR` seconds after the last ask). A ``reader`` that asks
        for fewer channels than last time (an ordered subscriber that handed a
        partition over) lets go of the others after :data:`LET_GO` seconds,
        unless it or another reader asks for them again."""
        if not (self._closed or self._refused):
            now = asyncio.get_running_loop().time()
            for channel in channels:
                if channel not in self._asked:
                    self._changed.set()
                self._asked[channel] = now
            if reader is not None:
                self._reader_asked(reader, frozenset(channels), now)
            if self._task is None:
                self._task = asyncio.ensure_future(self._run())
        return tuple(self._counts.get(channel, 0) for channel in channels)

    def _reader_asked(self, reader: Hashable, channels: frozenset[str], now: float) -> None:
        before = self._readers.get(reader)
        self._readers[reader] = (channels, now)
        if before is None or not (left := before[0] - channels):
            return
        for _, (theirs, _) in self._readers.items():
            left -= theirs
        if not left:
            return
        # Not at once: a reader that reads its partitions a few at a time (the
        # gateway's puller) names each again within moments.
        for channel in left:
            if (asked := self._asked.get(channel)) is not None:
                self._asked[channel] = min(asked, now - WATCH_FOR + LET_GO)
        asyncio.get_running_loop().call_later(LET_GO * 1.05, self._changed.set)

    async def wait(self, channels: Sequence[str], seen: tuple[int, ...], timeout: float) -> None:
        """Return once a counter of ``channels`` differs from ``seen`` (what
        :meth:`counts` gave), or after ``timeout`` seconds."""
        if self.counts(channels) != seen:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for channel in channels:
            self._waiters.setdefault(channel, set()).add(future)
        try:
            await asyncio.wait([future], timeout=timeout)
        finally:
            future.cancel()
            for channel in channels:
                waiting = self._waiters.get(channel)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[channel]

    def watched(self) -> dict[str, str]:
        """The channels subscribed now (the server confirmed it), each with its
        node's ``host:port``."""
        return {c: name for name, w in self._nodes.items() for c in w.subscribed()}

    def _bump(self, channel: str) -> None:
        if channel not in self._asked:
            return  # dropped; its unsubscribe is not confirmed yet
        self._counts[channel] = self._counts.get(channel, 0) + 1
        for future in self._waiters.get(channel, ()):
            if not future.done():
                future.set_result(None)

    def _unwatched(self, watch: _NodeWatch, channels: Sequence[str], failed: bool) -> None:
        """``watch`` lost ``channels``: place them again (after a pause if
        ``failed``), from a refreshed slot map."""
        for channel in channels:
            if self._home.get(channel) is watch:
                del self._home[channel]
        self._stale = True
        if failed:
            self._failed()
        self._changed.set()

    def _refuse(self, exc: Exception) -> None:
        """The server refused this user the wake-up channels: stop asking."""
        if not self._refused:
            self._refused = True
            log.warning(
                "streamsub: the Redis Cluster refused this user SSUBSCRIBE to the wake-up "
                "channels (%s): idle subscribers poll instead of waking at once (a message "
                "can wait up to about 0.1 s); to wake them, grant the user the channels "
                "ss:* and +ssubscribe +sunsubscribe +spublish (README, ACL users)",
                exc,
            )
        for watch in self._nodes.values():
            watch.task.cancel()
        if self._task is not None:
            self._task.cancel()

    def _failed(self) -> None:
        self._retry_at = asyncio.get_running_loop().time() + self._pause
        self._pause = min(self._pause * 2, RETRY_MAX)

    def _subscribed(self) -> None:
        self._pause = RETRY_FIRST

    async def _run(self) -> None:
        """Place channels on nodes, and drop the ones no reader asks for."""
        loop = asyncio.get_running_loop()
        # Not ``while True``: Python 3.11's wait_for can swallow a cancel.
        while not self._closed:
            raise_if_cancelled()  # stopped by _refuse, the cancel lost in a call
            if any(c not in self._home for c in self._asked):
                # Channels to place: after the pause that follows a failure.
                await asyncio.sleep(max(0.0, self._retry_at - loop.time()))
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), WATCH_FOR / 4)
            self._changed.clear()
            old = loop.time() - WATCH_FOR
            for gone in [r for r, (_, t) in self._readers.items() if t < old]:
                del self._readers[gone]
            for channel in [c for c, t in self._asked.items() if t < old]:
                del self._asked[channel]
                self._counts.pop(channel, None)
                watch = self._home.pop(channel, None)
                if watch is not None:
                    watch.drop(channel)
            for name in [n for n, w in self._nodes.items() if w.done]:
                del self._nodes[name]
            homeless = [c for c in self._asked if c not in self._home]
            if homeless:
                try:
                    await self._place(homeless)
                except Exception as exc:  # never raised to readers: they poll meanwhile
                    log.debug("streamsub: cannot place wake-up channels: %r", exc)
                    self._stale = True
                    self._failed()

    async def _place(self, channels: list[str]) -> None:
        if self._stale:
            self._stale = False
            await self._client.nodes_manager.initialize()
        if self._closed:
            return
        for channel in channels:
            node = self._client.nodes_manager.get_node_from_slot(key_slot(channel))
            watch = self._nodes.get(node.name)
            if watch is None or watch.done:
                watch = self._nodes[node.name] = _NodeWatch(self, node, self._timeout)
            self._home[channel] = watch
            watch.add(channel)

    async def close(self) -> None:
        """Stop listening; close every connection.

        Each watch is also woken, so that one whose cancel was lost (see
        :func:`~streamsub._cancel.raise_if_cancelled`) ends its session at
        ``_closed`` instead of listening for ever.
        """
        self._closed = True
        tasks = [w.stop() for w in self._nodes.values()]
        if self._task is not None:
            self._task.cancel()
            tasks.append(self._task)
        await asyncio.gather(*tasks, return_exceptions=True)
        # A watch started meanwhile (a cancel that came too late) stops at
        # _closed; one more round closes it.
        late = [w.stop() for w in self._nodes.values() if w.task not in tasks]
        await asyncio.gather(*late, return_exceptions=True)
        self._nodes.clear()
        self._home.clear()
        for waiting in self._waiters.values():
            for future in waiting:
                future.cancel()


class _NodeWatch:
    """One master's pub/sub connection and the channels subscribed on it."""

    def __init__(self, owner: Wakeups, node: Any, timeout: float) -> None:
        self._owner = owner
        self._node = node
        self._timeout = timeout
        self.channels: set[str] = set()
        """The channels to be subscribed here."""
        self._subscribed: set[str] = set()
        self._sent: set[str] = set()
        """SSUBSCRIBE sent, not confirmed yet."""
        self._leaving: set[str] = set()
        """SUNSUBSCRIBE sent, not confirmed yet."""
        self._changed = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    @property
    def done(self) -> bool:
        return self.task.done()

    def subscribed(self) -> frozenset[str]:
        return frozenset(self._subscribed & self.channels)

    def add(self, channel: str) -> None:
        self.channels.add(channel)
        self._changed.set()

    def drop(self, channel: str) -> None:
        self.channels.discard(channel)
        self._changed.set()

    def stop(self) -> asyncio.Task[None]:
        """Cancel the watch, and wake its session, which ends once the owner is
        closed even if the cancel was lost; return its task."""
        self.task.cancel()
        self._changed.set()
        return self.task

    async def _run(self) -> None:
        try:
            await self._session()
            failed = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never raised to readers: they poll meanwhile
            if isinstance(exc, rexc.NoPermissionError):
                self._owner._refuse(exc)
                return
            log.debug("streamsub: wake-ups from %s stopped: %r", self._node.name, exc)
            failed = True
        lost = list(self.channels)
        self.channels.clear()
        self._owner._unwatched(self, lost, failed)

    async def _session(self) -> None:
        """Connect, keep the subscriptions as ``channels`` says, until the
        connection fails or nothing is left to watch."""
        connection: Any = self._node.connection_class(
            **{**self._node.connection_kwargs, "health_check_interval": 0}
        )
        reader: asyncio.Future[None] | None = None
        try:
            await connection.connect()
            raise_if_cancelled()  # lost in the handshake's sends
            reader = asyncio.ensure_future(self._read(connection))
            while self.channels and not self._owner._closed:
                self._changed.clear()
                add = self.channels - self._subscribed - self._sent
                remove = (self._subscribed | self._sent) - self.channels
                commands = [("SSUBSCRIBE", c) for c in add] + [("SUNSUBSCRIBE", c) for c in remove]
                if commands:
                    await send_packed(connection, connection.pack_commands(commands))
                    self._sent |= add
                    self._subscribed -= remove
                    self._sent -= remove
                    self._leaving |= remove
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait([reader, changed], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if reader.done() and not self._owner._closed:
                    reader.result()  # its error
                    raise ConnectionError(f"{self._node.name} closed the connection")
        finally:
            if reader is not None:
                reader.cancel()
            # Closed first: a reader that lost its cancel ends on the closed socket.
            with contextlib.suppress(Exception):
                await connection.disconnect()
            if reader is not None:
                await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, connection: Any) -> None:
        """Read pushes until the connection fails (raises)."""
        pinged = False
        while True:  # until the connection fails: closed, it does
            # A read with its own timeout answers None when it is over and can
            # be tried again (redis-py's PubSub.get_message reads so).
            reply = await connection.read_response(timeout=QUIET_PING)
            if reply is None:
                if pinged:
                    raise TimeoutError(f"{self._node.name} did not answer PING")
                await send_packed(connection, connection.pack_command("PING"))
                pinged = True
                continue
            if not isinstance(reply, list) or len(reply) < 2:
                pinged = False  # PONG, outside subscribed mode
                continue
            kind = bytes(reply[0]).lower()
            if kind == b"pong":
                pinged = False
                continue
            channel = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            if kind == b"smessage":
                self._owner._bump(channel)
            elif kind == b"ssubscribe":
                self._sent.discard(channel)
                if channel in self.channels:
                    self._subscribed.add(channel)
                    self._owner._subscribed()
            elif kind == b"sunsubscribe":
                self._subscribed.discard(channel)
                self._sent.discard(channel)
                if channel in self._leaving:
                    self._leaving.discard(channel)
                elif channel in self.channels:
                    # The server dropped it: its slot moved away. With no
                    # channel left here, the session ends (see _session).
                    self.channels.discard(channel)
                    self._owner._unwatched(self, [channel], False)
                    self._changed.set()

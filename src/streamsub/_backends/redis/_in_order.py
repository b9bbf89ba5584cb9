"""Commands sent one after another on one connection, without waiting for replies.

Redis runs a connection's commands in the order they arrive, so a publisher can
have several batches in flight and still keep every ordering key in publish
order: while Redis appends one batch, the next is already on its way, and the
client encodes a third. A reply error (a ``ResponseError``) answers only its own
command; a broken connection fails every command in flight (each "may or may
not" have run) and the next call opens a new connection.

A call may ask for a confirmation behind its commands (``WAIT`` or ``WAITAOF``,
which covers every write the connection sent before it). Such a command
blocks the connection at the server until it answers, so one per call would
queue the calls behind each other, each waiting its full time (about a second
for ``WAITAOF`` with replicas). Instead at most one is outstanding per
connection: a call sent while one is outstanding waits for the next one, which
is sent as soon as the outstanding one answers and covers every call sent
meanwhile (a group commit). Its time limit (the confirmation's last argument,
in milliseconds) is what remains of the earliest call it covers, so that no
call waits longer than that limit from when it was sent, though a later call
of the group may get less (a call sent behind an outstanding confirmation
first waits for it: the connection is blocked at the server). A call's
confirmation is never taken from another connection: when the connection
breaks, every call not yet confirmed fails.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc

__all__ = ["ConnectionClosed", "InOrderConnection", "pack_commands", "send_packed"]


def _needs_command_name(pool: Any) -> bool:
    """redis-py before 5.3 requires a command name (unused) to take a pooled
    connection; 5.3 made it optional and later versions warn when it is given."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


async def take_connection(pool: Any) -> Any:
    """A connection of ``pool`` (give it back with ``pool.release``)."""
    if _needs_command_name(pool):
        return await pool.get_connection("EVAL")
    return await pool.get_connection()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


_OWN_BUFFER = 6000
"""An argument longer than this is a buffer of its own in what :func:`pack_commands`
returns, as redis-py's packer does: the socket's ``writelines`` sends it as it is."""


def pack_commands(connection: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """``commands`` in RESP: the bytes ``connection.pack_commands`` packs.

    Arguments of ``bytes``, ``str`` (UTF-8) and ``int``, the types appends and
    confirmations are made of, are packed here, without redis-py's encoder
    call per argument, the largest part of a lone publish's own Python
    (benchmarks/README.md, "A lone publish, counted"); a command with any
    other is left to redis-py."""
    packed: list[bytes] = []
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is bytes:
                data = arg
            elif kind is str:
                data = arg.encode()
            elif kind is int:
                data = b"%d" % arg
            else:
                return list(connection.pack_commands(commands))
            if len(data) > _OWN_BUFFER:  # a batch: not copied into a joined buffer
                parts.append(b"$%d\r\n" % len(data))
                packed += (b"".join(parts), data)
                parts = [b"\r\n"]
            else:
                parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    packed.append(b"".join(parts))
    return packed


async def send_packed(connection: Any, packed: list[bytes]) -> None:
    """Write ``packed`` to ``connection``'s socket.

    Straight to its stream writer when it has one: redis-py's
    ``send_packed_command`` runs the write under ``asyncio.wait_for``, which
    on Python 3.11 wraps it in a task of its own, two more trips through the
    event loop for every write, and drops a cancel that lands as the write
    ends (see ``streamsub._cancel``); the caller's deadline already bounds it.
    """
    writer = getattr(connection, "_writer", None)
    if writer is None:  # not connected, or a redis-py without one
        await connection.send_packed_command(packed, check_health=False)
        return
    try:
        writer.writelines(packed)
        await writer.drain()
    except OSError as exc:
        raise rexc.ConnectionError(f"Error while writing to socket: {exc}") from exc


class ConnectionClosed(rexc.ConnectionError):
    """A call on an :class:`InOrderConnection` that was closed: one sent after
    the close, or waiting to be sent as it closed (nothing was sent), or in
    flight as it closed (it may have run)."""


class NotReady(rexc.ConnectionError):
    """A send asked not to wait for a connection to be made (or PINGed) found
    it so: nothing was sent."""


class InOrderConnection:
    """One connection of ``client``'s pool, dedicated to in-order pipelining.

    It bypasses redis-py's command path, so it keeps its own time limits: a
    call fails with ``redis.exceptions.TimeoutError`` when its replies have not
    all come ``timeout`` seconds after it started (connecting, a health check
    and waiting behind earlier calls included), and the connection is dropped,
    failing every call in flight on it. A connection idle for more than
    ``health_check_interval`` seconds is PINGed before use, and replaced at
    once when that finds it reset.
    """

    def __init__(
        self, client: aioredis.Redis, *, timeout: float, health_check_interval: float
    ) -> None:
        self._pool: Any = client.connection_pool
        self._timeout = timeout
        self._health_check_interval = health_check_interval
        self._connection: Any = None
        # Each reply's future, and the loop time by which it must have come.
        self._waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._send_lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._reading = False  # the reader waits for a reply (not in _broken)
        self._last_used = 0.0
        # The confirmation outstanding on the connection (its reply's future
        # and the calls it covers), and the calls sent after it that wait for
        # the next one.
        self._confirming: tuple[asyncio.Future[Any], list[asyncio.Future[Any]]] | None = None
        # With the loop time each was sent at.
        self._unconfirmed: list[tuple[asyncio.Future[Any], float]] = []
        self._confirm_command: tuple[Any, ...] | None = None
        self._confirm_tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def _timed_out(self) -> rexc.TimeoutError:
        return rexc.TimeoutError(
            f"no reply from Redis within {self._timeout:g} s (the socket timeout)"
        )

    async def call_many(
        self, commands: list[tuple[Any, ...]], confirm: tuple[Any, ...] | None = None
    ) -> list[Any]:
        """Send commands behind those already sent, in one write; return their
        replies (an error reply as the exception, in its place), and with
        ``confirm`` the reply of the confirmation that covers them, last."""
        futures = await self.send_many(commands, confirm)
        # Awaited in turn, not gathered: the replies come in this order, and a
        # gather would cost the caller another trip through the event loop.
        replies: list[Any] = []
        for index, future in enumerate(futures):
            try:
                replies.append(await future)
            except Exception as exc:
                replies.append(exc)
            except BaseException:  # cancelled: nobody will read the others' errors
                for rest in futures[index + 1 :]:
                    rest.add_done_callback(_retrieved)
                raise
        return replies

    async def send_many(
        self,
        commands: list[tuple[Any, ...]],
        confirm: tuple[Any, ...] | None = None,
        *,
        connect: bool = True,
    ) -> list[asyncio.Future[Any]]:
        """Send commands behind those already sent, in one write; return the
        futures of their replies (set to the exception for an error reply),
        and with ``confirm`` (a ``WAIT`` or ``WAITAOF`` command, the same on
        every call, its time limit in milliseconds last) the future of the
        reply of the confirmation that covers them, last: sent behind them
        now, or shared (see the module docstring).
        Once this returns the commands are on their way: a caller that sends
        under a lock of its own orders them against other connections' too.
        With ``connect=False`` it raises :class:`NotReady`, sending nothing,
        where it would first connect or PING an idle connection (or wait for
        a :meth:`ready` doing so): such a caller makes the connection ready
        outside its lock."""
        self._check_open()
        if not connect and not self.usable():
            raise NotReady("the connection is not ready: nothing was sent")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        futures = [loop.create_future() for _ in commands]
        confirmed = loop.create_future() if confirm is not None else None
        if confirm is not None:
            if self._confirm_command not in (None, confirm):
                raise ValueError(f"one confirmation command per connection, not {confirm!r}")
            self._confirm_command = confirm
        try:
            async with asyncio.timeout_at(deadline), self._send_lock:
                self._check_open()  # closed while waiting for the lock
                if not connect and not self.usable():  # lost while waiting for the lock
                    raise NotReady("the connection was lost: nothing was sent")
                connection = await self._usable_connection(loop)
                sent = list(commands)
                replies = list(futures)
                confirmation = None
                if confirmed is not None and confirm is not None:
                    if self._confirming is None:  # none outstanding: send one behind these
                        confirmation = loop.create_future()
                        sent.append(confirm)
                        replies.append(confirmation)
                    else:  # the next one, sent once the outstanding one answers
                        self._unconfirmed.append((confirmed, loop.time()))
                self._waiting.extend((future, deadline) for future in replies)
                if confirmation is not None and confirmed is not None:
                    self._confirm_with(confirmation, [confirmed])
                try:
                    await send_packed(connection, pack_commands(connection, sent))
                except BaseException as exc:
                    await self._broken(connection, exc)
                    raise
                self._last_used = loop.time()
                if self._reader is None or self._reader.done():
                    self._reader = loop.create_task(self._read(connection))
        except TimeoutError:  # asyncio's, from timeout_at: connecting or sending stalled
            raise self._timed_out() from None
        except Exception as exc:
            if self._closed and not isinstance(exc, ConnectionClosed):  # close broke it
                raise ConnectionClosed(
                    f"the connection was closed as the call was sent ({exc!r}): it may have run"
                ) from exc
            raise
        finally:
            for future in [*futures, *([confirmed] if confirmed is not None else [])]:
                if future.done() and not future.cancelled():
                    future.exception()  # failed by _broken before anyone awaits them
        return futures if confirmed is None else [*futures, confirmed]

    def _confirm_with(
        self, confirmation: asyncio.Future[Any], group: list[asyncio.Future[Any]]
    ) -> None:
        """``confirmation`` (a sent command's reply) is outstanding; it confirms ``group``."""
        self._confirming = (confirmation, group)

        def answered(done: asyncio.Future[Any]) -> None:
            for confirmed in group:
                if confirmed.done():
                    continue
                if done.cancelled():
                    confirmed.set_exception(rexc.ConnectionError("the connection was closed"))
                elif done.exception() is not None:
                    confirmed.set_exception(done.exception())  # type: ignore[arg-type]
                else:
                    confirmed.set_result(done.result())
            if self._confirming is not None and self._confirming[0] is done:
                self._confirming = None
                if self._unconfirmed:
                    task = asyncio.get_running_loop().create_task(self._confirm_unconfirmed())
                    self._confirm_tasks.add(task)
                    task.add_done_callback(self._confirm_tasks.discard)

        confirmation.add_done_callback(answered)

    async def _confirm_unconfirmed(self) -> None:
        """Send one confirmation for every call that waits for one."""
        loop = asyncio.get_running_loop()
        async with self._send_lock:
            sent, self._unconfirmed = self._unconfirmed, []
            if not sent:
                return
            group = [confirmed for confirmed, _ in sent]
            if self._confirming is not None:  # sent meanwhile, behind these calls: it covers them
                self._confirming[1].extend(group)
                return
            connection, command = self._connection, self._confirm_command
            if connection is None or command is None:  # pragma: no cover (_broken failed them)
                for confirmed in group:
                    if not confirmed.done():
                        confirmed.set_exception(rexc.ConnectionError("the connection was lost"))
                return
            # What remains of the earliest call's limit (at least 1 ms: 0 waits forever).
            waited_ms = (loop.time() - min(at for _, at in sent)) * 1000
            command = (*command[:-1], max(1, int(command[-1] - waited_ms)))
            confirmation = loop.create_future()
            self._waiting.append((confirmation, loop.time() + self._timeout))
            self._confirm_with(confirmation, group)
            try:
                await send_packed(connection, pack_commands(connection, [command]))
            except BaseException as exc:
                await self._broken(connection, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            self._last_used = loop.time()
            if self._reader is None or self._reader.done():
                self._reader = loop.create_task(self._read(connection))

    def usable(self) -> bool:
        """Whether a send now would go at once: connected, and not idle long
        enough to be PINGed first (see :meth:`ready`)."""
        return self._connection is not None and (
            bool(self._waiting)
            or asyncio.get_running_loop().time() - self._last_used <= self._health_check_interval
        )

    async def ready(self) -> None:
        """Connect (or, idle long, PING) now, sending nothing: a caller that
        sends under a lock of its own waits here for a slow or silent server,
        not under that lock. Raises as :meth:`send_many` would have; the
        connection's own lock and time limit apply. While it connects or
        PINGs, the connection is not :meth:`usable`: a ``send_many(...,
        connect=False)`` meanwhile raises :class:`NotReady` rather than wait
        for it."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout), self._send_lock:
                await self._usable_connection(loop)
        except TimeoutError:  # asyncio's: connecting stalled
            raise self._timed_out() from None
        except Exception as exc:
            if self._closed and not isinstance(exc, ConnectionClosed):  # close broke it
                raise ConnectionClosed(f"the connection was closed ({exc!r})") from exc
            raise

    async def _usable_connection(self, loop: asyncio.AbstractEventLoop) -> Any:
        connection = self._connection
        if connection is None:
            connection = await self._take()
        elif not self._waiting and loop.time() - self._last_used > self._health_check_interval:
            # Idle long enough to have died unseen (a NAT, a failover). Nothing
            # is in flight, so PING's reply is the next one on the connection.
            try:
                await connection.send_command("PING", check_health=False)
                await connection.read_response()
            except rexc.ConnectionError as exc:  # reset while idle: take a fresh one
                await self._broken(connection, exc)
                connection = await self._take()
            except BaseException as exc:
                await self._broken(connection, exc)
                raise
            # Closed while the PING was out: the connection went back to the
            # pool, and may be another command's now.
            self._check_open()
        self._last_used = loop.time()
        return connection

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("the connection was closed: nothing was sent")

    async def _take(self) -> Any:
        """A new connection, once the reader of the last one has ended: a
        send starts a reader only while none runs, so one still giving the
        broken connection back would leave the new one's replies unread.
        Raises, giving it back, if :meth:`close` ran meanwhile: it would be
        kept by a closed object, never given back."""
        await self._end_reader()
        self._check_open()
        connection = await take_connection(self._pool)
        if self._closed:
            await self._pool.release(connection)
            self._check_open()
        self._connection = connection
        return connection

    async def _end_reader(self) -> None:
        """Wait until the reader has ended, cancelling it if it waits for a
        reply (its connection is gone: broken or closed). Called before a
        connection goes back to the pool: redis-py's pool hands the same
        ``Connection`` object out again (to another command of the client,
        or to this connection), and a reader still waiting on the old socket
        would, as its read failed, disconnect that object on its new socket.
        A reader giving its own connection back ends by itself, at once."""
        reader = self._reader
        if reader is None or reader.done() or reader is asyncio.current_task():
            return
        if self._reading:
            reader.cancel()
        await asyncio.wait([reader])

    async def _read(self, connection: Any) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and connection is self._connection:
            try:
                self._reading = True
                try:
                    async with asyncio.timeout_at(self._waiting[0][1]):
                        reply = await connection.read_response()
                finally:
                    self._reading = False
            except rexc.ResponseError as exc:
                if connection is not self._connection:  # closed meanwhile: its calls failed
                    return
                future, _ = self._waiting.popleft()
                if not future.done():
                    future.set_exception(exc)
            except TimeoutError:  # asyncio's: the oldest reply is overdue
                await self._broken(connection, self._timed_out())
                return
            except BaseException as exc:
                await self._broken(connection, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            else:
                if connection is not self._connection:  # closed meanwhile: its calls failed
                    return
                future, _ = self._waiting.popleft()
                if not future.done():
                    future.set_result(reply)
            self._last_used = loop.time()

    async def _broken(self, connection: Any, exc: BaseException) -> None:
        if connection is not self._connection:
            return
        self._connection = None
        # What waits for a confirmation was sent on this connection: another
        # connection's cannot cover it.
        self._fail_due(exc if isinstance(exc, Exception) else rexc.ConnectionError(str(exc)))
        try:
            await self._end_reader()
        finally:
            await self._give_back(connection)

    def _fail_due(self, exc: Exception) -> None:
        """Fail every call whose reply or confirmation is still due: nothing
        will read them on this connection."""
        self._confirming = None
        unconfirmed, self._unconfirmed = self._unconfirmed, []
        waiting, self._waiting = self._waiting, collections.deque()
        for future in [f for f, _ in unconfirmed] + [f for f, _ in waiting]:
            if not future.done():
                future.set_exception(exc)

    async def _give_back(self, connection: Any) -> None:
        """Close ``connection`` without waiting on its peer, and return it to the pool.

        Not waiting matters: on a silent connection redis-py (5.0) waits up to
        its connect timeout for the close, then raises, and the connection never
        went back to the pool.
        """
        try:
            await connection.disconnect(nowait=True)
        except (rexc.RedisError, OSError):
            pass
        finally:
            await self._pool.release(connection)

    async def close(self) -> None:
        """Give the connection back to the pool; later sends raise
        :class:`ConnectionClosed`, and so do those waiting for it.

        The socket closes at once, so a send that holds the connection (a PING
        before use, a write) fails at once, with :class:`ConnectionClosed`;
        the connection goes back to the pool only once that send has let go
        of it (even if this close is cancelled meanwhile), so that no other
        command of the client takes it while the send still uses it."""
        self._closed = True
        connection, self._connection = self._connection, None
        for task in list(self._confirm_tasks):
            task.cancel()
        # Replies still due (a write in flight as its client closes) are not
        # read any more: their calls fail, rather than wait for ever.
        self._fail_due(
            ConnectionClosed("the connection was closed with the call in flight: it may have run")
        )
        handing_back = asyncio.ensure_future(self._hand_back(connection))
        handing_back.add_done_callback(_retrieved)
        await asyncio.shield(handing_back)

    async def _hand_back(self, connection: Any) -> None:
        """Close ``connection``, and give it back to the pool once the reader
        and the send holding it (if any) have let go of it."""
        try:
            if connection is not None:
                with contextlib.suppress(rexc.RedisError, OSError):
                    await connection.disconnect(nowait=True)
            await self._end_reader()
            async with self._send_lock:
                pass
        finally:
            if connection is not None:
                await self._give_back(connection)

"""Commands sent one after another on one connection, without waiting for replies.

Redis runs a connection's commands in the order they arrive, so a publisher can
have several batches in flight and still keep every ordering key in publish
order: while Redis appends one batch, the next is already on its way, and the
client encodes a third. A reply error (a ``ResponseError``) answers only its own
command; a broken connection fails every command in flight (each "may or may
not" have run) and the next call opens a new connection.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc

__all__ = ["InOrderConnection"]


def _needs_command_name(pool: Any) -> bool:
    """redis-py before 5.3 requires a command name (unused) to take a pooled
    connection; 5.3 made it optional and later versions warn when it is given."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


async def _take(pool: Any) -> Any:
    if _needs_command_name(pool):
        return await pool.get_connection("EVAL")
    return await pool.get_connection()


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
        self._last_used = 0.0

    def _timed_out(self) -> rexc.TimeoutError:
        return rexc.TimeoutError(
            f"no reply from Redis within {self._timeout:g} s (the socket timeout)"
        )

    async def call_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send commands behind those already sent, in one write; return their
        replies (an error reply as the exception, in its place)."""
        futures = await self.send_many(commands)
        return await asyncio.gather(*futures, return_exceptions=True)

    async def send_many(self, commands: list[tuple[Any, ...]]) -> list[asyncio.Future[Any]]:
        """Send commands behind those already sent, in one write; return the
        futures of their replies (set to the exception for an error reply).
        Once this returns the commands are on their way: a caller that sends
        under a lock of its own orders them against other connections' too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        futures = [loop.create_future() for _ in commands]
        try:
            async with asyncio.timeout_at(deadline), self._send_lock:
                connection = await self._usable_connection(loop)
                self._waiting.extend((future, deadline) for future in futures)
                try:
                    await connection.send_packed_command(
                        connection.pack_commands(commands), check_health=False
                    )
                except BaseException as exc:
                    await self._broken(connection, exc)
                    raise
                self._last_used = loop.time()
                if self._reader is None or self._reader.done():
                    self._reader = loop.create_task(self._read(connection))
        except TimeoutError:  # asyncio's, from timeout_at: connecting or sending stalled
            raise self._timed_out() from None
        finally:
            for future in futures:  # failed by _broken before anyone awaits them
                if future.done() and not future.cancelled():
                    future.exception()
        return futures

    async def _usable_connection(self, loop: asyncio.AbstractEventLoop) -> Any:
        connection = self._connection
        if connection is None:
            connection = self._connection = await _take(self._pool)
        elif not self._waiting and loop.time() - self._last_used > self._health_check_interval:
            # Idle long enough to have died unseen (a NAT, a failover). Nothing
            # is in flight, so PING's reply is the next one on the connection.
            try:
                await connection.send_command("PING", check_health=False)
                await connection.read_response()
            except rexc.ConnectionError as exc:  # reset while idle: take a fresh one
                await self._broken(connection, exc)
                connection = self._connection = await _take(self._pool)
            except BaseException as exc:
                await self._broken(connection, exc)
                raise
        self._last_used = loop.time()
        return connection

    async def _read(self, connection: Any) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and connection is self._connection:
            try:
                async with asyncio.timeout_at(self._waiting[0][1]):
                    reply = await connection.read_response()
            except rexc.ResponseError as exc:
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
                future, _ = self._waiting.popleft()
                if not future.done():
                    future.set_result(reply)
            self._last_used = loop.time()

    async def _broken(self, connection: Any, exc: BaseException) -> None:
        if connection is not self._connection:
            return
        self._connection = None
        waiting, self._waiting = self._waiting, collections.deque()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(
                    exc if isinstance(exc, Exception) else rexc.ConnectionError(str(exc))
                )
        await self._give_back(connection)

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
        """Give the connection back to the pool."""
        connection, self._connection = self._connection, None
        if self._reader is not None:
            self._reader.cancel()
        if connection is not None:
            await self._give_back(connection)

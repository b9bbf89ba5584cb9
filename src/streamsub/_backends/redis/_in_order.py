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

_COMMAND_NAME = inspect.signature(aioredis.ConnectionPool.get_connection).parameters.get(
    "command_name"
)
_POOL_NEEDS_COMMAND_NAME = (
    _COMMAND_NAME is not None and _COMMAND_NAME.default is inspect.Parameter.empty
)
"""redis-py before 5.3 requires a command name (unused) to take a pooled
connection; 5.3 made it optional and later versions warn when it is given."""


async def _take(pool: Any) -> Any:
    if _POOL_NEEDS_COMMAND_NAME:
        return await pool.get_connection("EVAL")
    return await pool.get_connection()


class InOrderConnection:
    """One connection of ``client``'s pool, dedicated to in-order pipelining."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._pool: Any = client.connection_pool
        self._connection: Any = None
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._send_lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None

    async def call_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send commands behind those already sent, in one write; return their
        replies (an error reply as the exception, in its place)."""
        loop = asyncio.get_running_loop()
        async with self._send_lock:
            if self._connection is None:
                self._connection = await _take(self._pool)
            connection = self._connection
            futures = [loop.create_future() for _ in commands]
            self._waiting.extend(futures)
            try:
                await connection.send_packed_command(
                    connection.pack_commands(commands), check_health=False
                )
            except BaseException as exc:
                await self._broken(connection, exc)
                raise
            if self._reader is None or self._reader.done():
                self._reader = loop.create_task(self._read(connection))
        return await asyncio.gather(*futures, return_exceptions=True)

    async def _read(self, connection: Any) -> None:
        while self._waiting and connection is self._connection:
            try:
                reply = await connection.read_response()
            except rexc.ResponseError as exc:
                future = self._waiting.popleft()
                if not future.done():
                    future.set_exception(exc)
            except BaseException as exc:
                await self._broken(connection, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            else:
                future = self._waiting.popleft()
                if not future.done():
                    future.set_result(reply)

    async def _broken(self, connection: Any, exc: BaseException) -> None:
        if connection is not self._connection:
            return
        self._connection = None
        waiting, self._waiting = self._waiting, collections.deque()
        for future in waiting:
            if not future.done():
                future.set_exception(
                    exc if isinstance(exc, Exception) else rexc.ConnectionError(str(exc))
                )
        await connection.disconnect()
        await self._pool.release(connection)

    async def close(self) -> None:
        """Give the connection back to the pool."""
        connection, self._connection = self._connection, None
        if self._reader is not None:
            self._reader.cancel()
        if connection is not None:
            await connection.disconnect()
            await self._pool.release(connection)

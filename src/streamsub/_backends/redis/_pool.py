"""A connection pool whose commands wait for a free connection instead of failing.

redis-py's default pool raises "Too many connections" as soon as every
connection is busy, which subscribers' blocking reads (each holds one for a read
block) make common. Its ``BlockingConnectionPool`` waits, but up to redis-py
5.0.x it deadlocks when a new connection fails to connect (a wrong password, a
refused TLS handshake, a server that is down): it gives the connection back
under the lock it already holds, and every caller then waits out the timeout.
So this pool waits outside redis-py's own locking.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc

__all__ = ["WaitingConnectionPool"]

_BASE_PARAMETER = inspect.signature(aioredis.ConnectionPool.get_connection).parameters.get(
    "command_name"
)
_BASE_NEEDS_COMMAND_NAME = (
    _BASE_PARAMETER is not None and _BASE_PARAMETER.default is inspect.Parameter.empty
)
"""redis-py before 5.3 requires a command name (unused) to take a pooled
connection; 5.3 made it optional and later versions warn when it is given."""


class WaitingConnectionPool(aioredis.ConnectionPool):
    """A ``ConnectionPool`` whose ``get_connection`` waits up to ``wait_timeout``
    seconds for a connection to be given back when all ``max_connections`` are busy."""

    def __init__(self, *, wait_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._wait_timeout = wait_timeout
        self._given_back: asyncio.Condition | None = None

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection; wait for one while all are busy."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_timeout
        take: Any = super().get_connection  # untyped in redis-py
        while True:
            if self.can_get_connection():
                try:
                    if _BASE_NEEDS_COMMAND_NAME:
                        return await take(command_name or "_", *keys, **options)
                    return await take()
                except rexc.ConnectionError as exc:
                    # Another caller took the last free one meanwhile: wait again.
                    if "Too many connections" not in str(exc):
                        raise
            if self._given_back is None:
                self._given_back = asyncio.Condition()
            try:
                async with asyncio.timeout_at(deadline), self._given_back:
                    await self._given_back.wait_for(self.can_get_connection)
            except TimeoutError:
                raise rexc.ConnectionError(
                    f"no free connection within {self._wait_timeout:g} s: all "
                    f"{self.max_connections} are busy"
                ) from None

    async def release(self, connection: Any) -> None:
        """Give ``connection`` back and wake one caller waiting for a connection."""
        await super().release(connection)
        if self._given_back is not None:
            async with self._given_back:
                self._given_back.notify()

"""A loopback TCP proxy that delays what clients send, as a network does.

``tests/_proxy.py`` ends a proxied connection as soon as the client closes it,
dropping what it held; a real network keeps the client's bytes (its kernel
retransmits them after ``close()``) and delivers them once it heals. Here,
``hold()`` keeps every byte clients send, ``release()`` delivers them to the
server, even from clients that have closed since. Replies flow throughout.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["DelayingProxy"]


class DelayingProxy:
    """Forwards loopback connections to one target; requests can be held."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._target = ("127.0.0.1", 0)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self, port: int) -> int:
        self._target = ("127.0.0.1", port)
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def hold(self) -> None:
        """Keep what clients send from now on (and what they sent and is not yet out)."""
        self._flowing.clear()

    def release(self) -> None:
        """Deliver what was held, then forward as usual."""
        self._flowing.set()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers += [writer, up_writer]
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        for coroutine in (
            self._take(reader, chunks),
            self._deliver(chunks, up_writer),
            self._replies(up_reader, writer),
        ):
            task = loop.create_task(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _take(
        self, reader: asyncio.StreamReader, chunks: asyncio.Queue[bytes | None]
    ) -> None:
        """Read the client eagerly: its bytes are ours to deliver, whatever it does next."""
        try:
            while data := await reader.read(65536):
                chunks.put_nowait(data)
        except OSError:
            pass
        chunks.put_nowait(None)

    async def _deliver(self, chunks: asyncio.Queue[bytes | None], up: asyncio.StreamWriter) -> None:
        while True:
            data = await chunks.get()
            await self._flowing.wait()
            if data is None:
                await asyncio.sleep(0.5)  # let the server answer what it was sent
                up.close()
                return
            with contextlib.suppress(OSError):
                up.write(data)
                await up.drain()

    async def _replies(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        writer.transport.abort()

"""A TCP proxy on loopback that a test can silence, resume or reset.

Network faults for tests, without touching the real network::

    async with Proxy() as proxy:
        port = await proxy.start("127.0.0.1", server.port)
        url = f"redis://127.0.0.1:{port}/0"    # clients connect through it
        proxy.silence()   # sockets stay open, nothing is forwarded either way
        proxy.silence_replies()  # requests reach the server, its replies are held
        proxy.resume()    # forwarding goes on, held bytes included
        proxy.reset()     # every open connection is closed with RST
        proxy.drop()      # open connections go dead without a word; new ones work

Or take the ``proxy`` fixture (in ``tests/conftest.py``): an unstarted
``Proxy`` that is closed when the test ends. A silenced proxy still accepts
new connections and silences them too, as a black-holed network would after
the TCP handshake. It listens on 127.0.0.1 only and forwards only to the
target it was started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType
from typing import Self

__all__ = ["Proxy"]

_CHUNK = 65536


class _Pair:
    """One proxied connection: the client's side and the server's side."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.writers = (client, server)
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self, *, rst: bool) -> None:
        for writer in self.writers:
            sock = writer.get_extra_info("socket")
            if rst and sock is not None:
                with contextlib.suppress(OSError):  # linger 0: close sends RST, not FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class Proxy:
    """Forwards TCP connections from a loopback port to one target."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._target: tuple[str, int] = ("127.0.0.1", 0)
        self._to_server = asyncio.Event()
        self._to_server.set()
        self._to_client = asyncio.Event()
        self._to_client.set()
        self._pairs: set[_Pair] = set()
        self._dropped: list[_Pair] = []
        self.accepted = 0
        """Connections accepted since start (a reconnect shows as one more)."""

    async def start(self, target_host: str, target_port: int) -> int:
        """Listen on a free port of 127.0.0.1, forward to the target; return the port."""
        if target_host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the test proxy forwards to loopback only, not {target_host!r}")
        self._target = (target_host, target_port)
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._pairs)

    def silence(self) -> None:
        """Keep every socket open but forward nothing, in both directions."""
        self._to_server.clear()
        self._to_client.clear()

    def silence_replies(self) -> None:
        """Forward what clients send, but hold what the server answers (a reply
        delayed on its way back, while the client sends on)."""
        self._to_client.clear()

    def resume(self) -> None:
        """Forward again both ways, including what arrived while silent."""
        self._to_server.set()
        self._to_client.set()

    def drop(self) -> None:
        """Forget every open connection without a word to either side: their sockets
        stay open and nothing more is forwarded on them, ever (a NAT entry or a
        failed-over load balancer). New connections are forwarded as usual."""
        for pair in list(self._pairs):
            for task in pair.tasks:
                task.cancel()
            self._dropped.append(pair)
        self._pairs.clear()

    def reset(self) -> None:
        """Close every open connection, both sides, with a TCP RST."""
        for pair in list(self._pairs):
            pair.abort(rst=True)
        self._pairs.clear()

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        if self._server is not None:
            self._server.close()
        self.reset()
        for pair in self._dropped:
            pair.abort(rst=True)
        self._dropped.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        loop = asyncio.get_running_loop()
        pair.tasks = [
            loop.create_task(self._pump(reader, up_writer, pair, self._to_server)),
            loop.create_task(self._pump(up_reader, writer, pair, self._to_client)),
        ]

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: _Pair,
        flowing: asyncio.Event,
    ) -> None:
        try:
            while True:
                await flowing.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await flowing.wait()  # bytes read just before silence() wait too
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        # One side closed: close the other, as a real connection would.
        if pair in self._pairs:
            self._pairs.discard(pair)
            pair.abort(rst=False)

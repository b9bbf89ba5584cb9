"""The test proxy (tests/_proxy.py) does what other tests rely on it for."""

from __future__ import annotations

import asyncio

import pytest

from streamsub.testing import RedisServer
from tests._proxy import Proxy

# Standalone: the TCP proxy of the standalone-server tests, in front of the one server.
pytestmark = pytest.mark.standalone


async def test_the_proxy_forwards_silences_resumes_and_resets(
    server: RedisServer, proxy: Proxy
) -> None:
    """Through the proxy a command is answered; silenced, the connection stays open
    and nothing comes back; resumed, the held command's reply arrives; reset, the
    client's connection is closed (RST) and the proxy holds none."""
    port = await proxy.start("127.0.0.1", server.port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"PING\r\n")
        assert await asyncio.wait_for(reader.readline(), 5) == b"+PONG\r\n"
        assert proxy.connections == 1

        proxy.silence()
        writer.write(b"ECHO held\r\n")
        with pytest.raises(TimeoutError):  # no reply while silent
            await asyncio.wait_for(reader.readline(), 0.5)
        assert proxy.connections == 1, "silence closed the connection"

        proxy.resume()
        assert await asyncio.wait_for(reader.readexactly(10), 5) == b"$4\r\nheld\r\n"

        proxy.reset()
        assert proxy.connections == 0
        try:
            closed = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            closed = b""
        assert closed == b""
    finally:
        writer.close()


async def test_the_proxy_forwards_to_loopback_only(proxy: Proxy) -> None:
    """A target that is not loopback is refused: tests never send traffic elsewhere."""
    with pytest.raises(ValueError, match="loopback"):
        await proxy.start("192.0.2.1", 6379)

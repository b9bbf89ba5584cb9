"""The gateway process: one service, its gRPC server and its HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from types import TracebackType
from typing import Self

import grpc

from .._backends.base import Backend
from ._grpc import grpc_server
from ._service import PubSubService, StreamSettings

__all__ = ["DEFAULT_GRPC_ADDRESS", "DEFAULT_HTTP_ADDRESS", "Gateway", "GatewayStatistics"]

log = logging.getLogger("streamsub.gateway")

DEFAULT_GRPC_ADDRESS = "127.0.0.1:8085"
"""The Pub/Sub emulator's usual port, on loopback unless told otherwise."""
DEFAULT_HTTP_ADDRESS = "127.0.0.1:8086"
"""REST and gRPC-Web."""
DEFAULT_PARTITIONS = 16
"""Partitions of topics created through the gateway."""


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayStatistics:
    """A snapshot of a gateway's counters."""

    streams_open: int
    """StreamingPull calls being served now."""
    streams_opened: int
    """StreamingPull calls served since start."""


class Gateway:
    """Serves google.pubsub.v1 for the streamsub server at ``url``.

    ``grpc_address`` (default ``127.0.0.1:8085``; port 0 picks a free one);
    topics created through the gateway get ``partitions`` partitions (default
    16); a streaming pull ends after ``stream_lifetime`` seconds (default 1800,
    as Pub/Sub) and clients open another. ``stop()`` ends every stream with
    UNAVAILABLE, gives every lease back so that other gateways deliver those
    messages at once, and waits up to ``grace`` seconds for calls in flight.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        backend: Backend | None = None,
        grpc_address: str = DEFAULT_GRPC_ADDRESS,
        partitions: int = DEFAULT_PARTITIONS,
        stream_lifetime: float = 1800.0,
        grace: float = 5.0,
    ) -> None:
        if backend is None:
            from .._backends.redis import RedisBackend
            from .._client import DEFAULT_URL

            backend = RedisBackend(url or os.environ.get("STREAMSUB_URL") or DEFAULT_URL)
        self._backend = backend
        self._grpc_address = grpc_address
        self._partitions = partitions
        self._grace = grace
        self._stream_settings = StreamSettings(lifetime=stream_lifetime)
        self._service: PubSubService | None = None
        self._grpc: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self.grpc_port = 0
        self._streams_opened = 0

    @property
    def url(self) -> str:
        """The streamsub server's URL, without password."""
        return self._backend.url

    async def start(self) -> None:
        """Check that Redis answers, then listen."""
        await self._backend.ping()
        self._service = PubSubService(
            self._backend, partitions=self._partitions, stream_settings=self._stream_settings
        )
        self._grpc, self.grpc_port = grpc_server(self._service, self._grpc_address)
        await self._grpc.start()
        host = self._grpc_address.rsplit(":", 1)[0]
        log.info(
            "streamsub gateway: gRPC on %s:%d, for %s",
            host,
            self.grpc_port,
            self._backend.url,
        )

    async def stop(self) -> None:
        """End streams, give leases back, stop listening, close connections."""
        service, self._service = self._service, None
        if service is None:
            return
        service.closing.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(service.no_streams.wait(), self._grace)
        if self._grpc is not None:
            await self._grpc.stop(self._grace)
        await service.close()
        self._streams_opened = service.streams_opened
        self._stopped.set()
        log.info("streamsub gateway: stopped")

    def statistics(self) -> GatewayStatistics:
        """A snapshot of this gateway's counters."""
        service = self._service
        if service is None:
            return GatewayStatistics(streams_open=0, streams_opened=self._streams_opened)
        return GatewayStatistics(
            streams_open=service.streams, streams_opened=service.streams_opened
        )

    async def wait_closed(self) -> None:
        """Return once ``stop()`` has finished."""
        await self._stopped.wait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

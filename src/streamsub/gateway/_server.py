"""The gateway process: one service, its gRPC server and its HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from types import TracebackType
from typing import Self

import grpc

from .._backends.base import Backend
from ._grpc import grpc_server
from ._http import HttpApp
from ._service import PubSubService, StreamSettings

__all__ = ["DEFAULT_GRPC_ADDRESS", "DEFAULT_HTTP_ADDRESS", "Gateway", "GatewayStatistics"]

log = logging.getLogger("streamsub.gateway")

DEFAULT_GRPC_ADDRESS = "127.0.0.1:8085"
"""The Pub/Sub emulator's usual port, on loopback unless told otherwise."""
DEFAULT_HTTP_ADDRESS = "127.0.0.1:8086"
"""REST and gRPC-Web."""
DEFAULT_PARTITIONS = 16
"""Partitions of topics created through the gateway."""
_GRPC_STOP_MARGIN = 5.0
"""Seconds gRPC's stop may take past the grace: it cancels the calls still
running then and waits for their handlers, which give their leases back."""


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayStatistics:
    """A snapshot of a gateway's counters."""

    streams_open: int
    """StreamingPull calls being served now."""
    streams_opened: int
    """StreamingPull calls served since start."""


class Gateway:
    """Serves google.pubsub.v1 for the streamsub server at ``url``.

    ``grpc_address`` (default ``127.0.0.1:8085``; port 0 picks a free one) and
    ``http_address`` (REST and gRPC-Web; default ``127.0.0.1:8086``, None: off);
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
        http_address: str | None = DEFAULT_HTTP_ADDRESS,
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
        self._http_address = http_address
        self._http: _HttpServer | None = None
        self.http_port = 0
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
        http = "off"
        if self._http_address is not None:
            self._http = _HttpServer(HttpApp(self._service), self._http_address, self._grace)
            self.http_port = await self._http.start()
            http = f"{_host(self._http_address)}:{self.http_port}"
        log.info(
            "streamsub gateway: gRPC on %s:%d, REST and gRPC-Web on %s, for %s",
            _host(self._grpc_address),
            self.grpc_port,
            http,
            self._backend.url,
        )

    async def stop(self) -> None:
        """End streams, give leases back, stop listening, close connections."""
        service, self._service = self._service, None
        if service is None:
            return
        # gRPC stops taking calls first (GOAWAY), then the streams end: a client
        # reopens its stream the moment it ends, and a call that reaches a gRPC
        # server as it shuts down is CANCELLED, which clients take as final.
        loop = asyncio.get_running_loop()
        grpc_deadline = loop.time() + self._grace + _GRPC_STOP_MARGIN
        stopping = None
        if self._grpc is not None:
            stopping = asyncio.ensure_future(self._grpc.stop(self._grace))
            await asyncio.sleep(0)  # its first step: no new calls from here on
        service.closing.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(service.no_streams.wait(), self._grace)
        if stopping is not None:
            _, late = await asyncio.wait({stopping}, timeout=max(0, grpc_deadline - loop.time()))
            if late:
                log.error(
                    "streamsub gateway: gRPC calls did not end within %g s of the stop; "
                    "closing without them",
                    self._grace + _GRPC_STOP_MARGIN,
                )
        if self._http is not None:
            await self._http.stop()
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


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0]


class _HttpServer:
    """uvicorn serving the HTTP app, driven step by step so that it installs no
    signal handlers of its own (the gateway's owner handles SIGTERM)."""

    def __init__(self, app: HttpApp, address: str, grace: float) -> None:
        import uvicorn

        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]") or "127.0.0.1", int(port)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=max(1, int(grace)),
        )
        config.load()
        self._server = uvicorn.Server(config)
        self._server.lifespan = config.lifespan_class(config)
        self._socket: socket.socket | None = None
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.set_inheritable(True)
        self._socket = sock
        await self._server.startup(sockets=[sock])
        self._loop_task = asyncio.get_running_loop().create_task(self._server.main_loop())
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._loop_task is not None:
            await self._loop_task
        await self._server.shutdown(sockets=[self._socket] if self._socket else None)

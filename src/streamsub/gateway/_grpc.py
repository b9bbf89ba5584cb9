"""The gRPC face: google.pubsub.v1 on grpcio's asyncio server.

Every method of :class:`PubSubService` is registered by name with the
package's own message classes; an :class:`RpcError` becomes a gRPC status with
a ``google.rpc.Status`` in ``grpc-status-details-bin`` (carrying the
``ErrorInfo`` of exactly-once ack failures, as Pub/Sub sends it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from .._errors import StreamsubError
from ._proto import METHODS, pb
from ._service import PubSubService
from ._status import Code, RpcError, from_streamsub, status_message

__all__ = ["grpc_server"]

log = logging.getLogger("streamsub.gateway")

_OPTIONS = [
    ("grpc.max_receive_message_length", 20 * 2**20),  # a publish of 10 MB and more
    ("grpc.max_send_message_length", 20 * 2**20),
    # Clients ping every 30 s or so; the default minimum (5 min) would make the
    # server close their connections with "too many pings".
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: RpcError) -> NoReturn:
    # Details only where there are some: clients check that the Status in the
    # trailer matches the call's code, and a call cancelled while it ends (the
    # server stopping) would then fail that check in the client's callback.
    trailer: tuple[tuple[str, bytes], ...] = ()
    if exc.ack_errors:
        trailer = (("grpc-status-details-bin", status_message(exc).SerializeToString()),)
    await context.abort(grpc.StatusCode[exc.code.name], exc.message, trailing_metadata=trailer)
    raise AssertionError("abort returns by raising")  # pragma: no cover


def _unary(method: Callable[[Any], Awaitable[Any]], request: Any, response: Any) -> Any:
    async def handle(message: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(message)
        except RpcError as exc:
            await _abort(context, exc)
        except StreamsubError as exc:  # Redis went away, say: UNAVAILABLE, not UNKNOWN
            await _abort(context, from_streamsub(exc))

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=request.FromString,
        response_serializer=response.SerializeToString,
    )


def _streaming_pull(service: PubSubService) -> Any:
    async def handle(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            async for response in service.streaming_pull(requests):
                yield response
        except RpcError as exc:
            await _abort(context, exc)
        except StreamsubError as exc:
            await _abort(context, from_streamsub(exc))

    return grpc.stream_stream_rpc_method_handler(
        handle,
        request_deserializer=pb.StreamingPullRequest.FromString,
        response_serializer=pb.StreamingPullResponse.SerializeToString,
    )


def _unimplemented(name: str) -> Any:
    async def handle(message: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _abort(
            context,
            RpcError(Code.UNIMPLEMENTED, f"{name} is not implemented by the streamsub gateway."),
        )

    return grpc.unary_unary_rpc_method_handler(handle)


def grpc_server(service: PubSubService, address: str) -> tuple[grpc.aio.Server, int]:
    """A gRPC server for ``service`` bound to ``address`` (not started) and its port."""
    server = grpc.aio.server(options=_OPTIONS)
    for service_name, methods in METHODS.items():
        handlers = {
            name: _unary(getattr(service, name), request, response)
            for name, (request, response) in methods.items()
        }
        if service_name.endswith("Subscriber"):
            handlers["StreamingPull"] = _streaming_pull(service)
            handlers["ModifyPushConfig"] = _unimplemented("ModifyPushConfig")
        else:
            handlers["DetachSubscription"] = _unimplemented("DetachSubscription")
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service_name, handlers),)
        )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    return server, port

"""The Pub/Sub API on streamsub: a gateway the Google Cloud Pub/Sub clients use unchanged.

Point ``PUBSUB_EMULATOR_HOST`` at its gRPC address and the official clients
(Python, Go, Java, Node, ...) create topics and subscriptions, publish,
pull and stream-pull on streamsub's Redis::

    async with Gateway("redis://localhost:6379/0") as gateway:
        print(gateway.grpc_port)
        await gateway.wait_closed()

Pub/Sub names ``projects/P/topics/T`` are streamsub names ``P~T``. Needs the
``gateway`` extra (``pip install 'streamsub[gateway]'``).
"""

from ._metrics import serve_metrics
from ._server import DEFAULT_GRPC_ADDRESS, DEFAULT_HTTP_ADDRESS, Gateway, GatewayStatistics

__all__ = [
    "DEFAULT_GRPC_ADDRESS",
    "DEFAULT_HTTP_ADDRESS",
    "Gateway",
    "GatewayStatistics",
    "serve_metrics",
]

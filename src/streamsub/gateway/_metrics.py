"""The gateway's metrics, served next to the library's.

The adapter reports deliveries, acks, nacks, dead letters, lost entries and the
messages it holds to :mod:`streamsub.metrics` as a subscriber does; this module
adds the gateway's own figures and serves both on one ``/metrics`` endpoint:

===============================================  ==============================
``streamsub_gateway_streams_open``               StreamingPull calls served now
``streamsub_gateway_streams_opened_total``       StreamingPull calls since start
===============================================  ==============================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import metrics
from ._server import Gateway

__all__ = ["GatewayCollector", "serve_metrics"]


class GatewayCollector:
    """A prometheus-client collector of one gateway's statistics."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Any]:
        """The metric families, as prometheus-client asks for them."""
        from prometheus_client import core

        statistics = self._gateway.statistics()
        yield core.GaugeMetricFamily(
            "streamsub_gateway_streams_open",
            "StreamingPull calls this gateway serves now.",
            value=statistics.streams_open,
        )
        yield core.CounterMetricFamily(
            "streamsub_gateway_streams_opened",
            "StreamingPull calls this gateway served since it started.",
            value=statistics.streams_opened,
        )


def serve_metrics(gateway: Gateway, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve the library's and ``gateway``'s metrics at ``http://addr:port/metrics``
    from a background thread (default address: loopback only); return the server
    (``.shutdown()`` stops it). Needs ``prometheus-client`` (extra ``metrics``)."""
    registry = metrics.registry()
    registry.register(GatewayCollector(gateway))
    import prometheus_client

    server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    return server

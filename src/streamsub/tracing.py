"""OpenTelemetry tracing: trace context carried in message attributes.

When ``opentelemetry-api`` is installed (``pip install 'streamsub[tracing]'``)
and an SDK is configured, ``publish`` runs in a ``<topic> publish`` span
(kind PRODUCER) and adds that span's W3C ``traceparent`` (and ``tracestate``)
to each message's attributes, as Pub/Sub's clients do. Handling then runs in a
``<subscription> process`` span (kind CONSUMER) whose parent is the publish
span, so one trace spans publish and handling, across processes. A message
that already carries a ``traceparent`` keeps it.

Without opentelemetry every function here does nothing and costs a check.
Subscribers wrap their handler with :func:`traced` themselves.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from ._core.codec import MAX_ATTRIBUTES

__all__ = [
    "active",
    "ENABLED",
    "TRACEPARENT",
    "can_carry",
    "handling_span",
    "inject",
    "publish_span",
    "refresh",
    "traced",
]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


ENABLED = _importable("opentelemetry")
"""True when opentelemetry-api can be imported."""
_ROOM = MAX_ATTRIBUTES - 2
"""Messages with more attributes get no trace context (it needs two)."""
TRACEPARENT = "traceparent"
"""The attribute that carries the W3C trace context (and ``tracestate`` beside it)."""
_SYSTEM = "streamsub"

H = TypeVar("H", bound=Callable[..., Any])


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()
RECHECK = 1.0
"""Seconds streamsub keeps its answer to "is an SDK set up?": a tracer provider
set later is used from at most this long after (``refresh()`` at once)."""
_cached: tuple[float, Any] | None = None
"""(when checked, the tracer or None)."""
_known_until = float("-inf")
"""Until when :func:`active` may answer :data:`_known` without asking
:func:`_tracer` (the monotonic clock)."""
_known = False


def refresh() -> None:
    """Look for the tracer provider again on the next publish or handling."""
    global _cached, _known_until
    _cached = None
    _known_until = float("-inf")


def _tracer() -> Any | None:
    """streamsub's tracer, or None while no SDK is set up (then spans would be
    no-ops, and skipping them keeps a plain publish as fast as without tracing)."""
    global _cached, _known, _known_until
    if not ENABLED:
        _known, _known_until = False, float("inf")
        return None
    now = time.monotonic()
    if _cached is not None and now - _cached[0] < RECHECK:
        return _cached[1]
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    tracer = None
    if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        tracer = provider.get_tracer("streamsub")
    _cached = (now, tracer)
    _known, _known_until = tracer is not None, now + RECHECK
    return tracer


def active() -> bool:
    """Whether handling and publishing are traced now (an SDK is set up)."""
    if time.monotonic() < _known_until:  # _tracer()'s answer, without its call: every publish asks
        return _known
    return _tracer() is not None


def publish_span(topic: str, count: int) -> contextlib.AbstractContextManager[Any]:
    """A PRODUCER span for a publish of ``count`` messages to ``topic`` (a no-op
    without an OpenTelemetry SDK)."""
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN
    from opentelemetry.trace import SpanKind

    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        f"{topic} publish",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
            "messaging.batch.message_count": count,
        },
    )


def can_carry(attributes: Mapping[str, str] | None) -> bool:
    """Whether trace context may be added to ``attributes``: not when they carry
    one already or have no room left for it."""
    return not attributes or (TRACEPARENT not in attributes and len(attributes) <= _ROOM)


def inject(attributes: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``attributes`` plus the current span's ``traceparent`` (when there is a
    recording span and no ``traceparent`` yet); unchanged otherwise."""
    if _tracer() is None or not can_carry(attributes):
        return attributes
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return attributes
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if TRACEPARENT not in carrier:
        return attributes
    return {**(attributes or {}), **carrier}


@contextlib.contextmanager
def handling_span(message: Any, subscription: str) -> Iterator[Any]:
    """Run the handling of ``message`` in a CONSUMER span, the child of the span
    that published it (when its attributes carry a ``traceparent``)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(dict(message.attributes))
    with tracer.start_as_current_span(
        f"{subscription} process",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.subscription.name": subscription,
            "messaging.message.id": message.message_id,
            "messaging.message.delivery_attempt": message.delivery_attempt,
        },
    ) as span:
        yield span


def traced(handler: H, subscription: str) -> H:
    """``handler`` run in :func:`handling_span` (async or plain ``def`` alike)."""
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def run_async(message: Any) -> Any:
            with handling_span(message, subscription):
                return await handler(message)

        return run_async  # type: ignore[return-value]

    @functools.wraps(handler)
    def run(message: Any) -> Any:
        with handling_span(message, subscription):
            return handler(message)

    return run  # type: ignore[return-value]

"""OpenTelemetry tracing: trace context carried in message attributes.

When ``opentelemetry-api`` is installed (``pip install 'streamsub[tracing]'``)
and an SDK is configured, ``publish`` runs in a ``<topic> publish`` span
(kind PRODUCER) and adds that span's W3C ``traceparent`` (and ``tracestate``)
to each message's attributes, as Pub/Sub's clients do. Handling then runs in a
``<subscription> process`` span (kind CONSUMER) whose parent is the publish
span, so one trace spans publish and handling, across processes. A message
that already carries a ``traceparent`` keeps it.

Without opentelemetry every function here does nothing and costs a check.
Wrap a handler with :func:`traced` to run it in the handling span::

    async with client.subscribe("billing", streamsub.tracing.traced(handle, "billing")):
        ...
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from ._core.codec import MAX_ATTRIBUTES

__all__ = [
    "ENABLED",
    "TRACEPARENT",
    "can_carry",
    "handling_span",
    "inject",
    "publish_span",
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


def _tracer() -> Any:
    from opentelemetry import trace

    return trace.get_tracer("streamsub")


@contextlib.contextmanager
def publish_span(topic: str, count: int) -> Iterator[None]:
    """Run a publish of ``count`` messages to ``topic`` in a PRODUCER span."""
    if not ENABLED:
        yield
        return
    from opentelemetry.trace import SpanKind

    with _tracer().start_as_current_span(
        f"{topic} publish",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
            "messaging.batch.message_count": count,
        },
    ):
        yield


def can_carry(attributes: Mapping[str, str] | None) -> bool:
    """Whether trace context may be added to ``attributes``: not when they carry
    one already or have no room left for it."""
    return not attributes or (TRACEPARENT not in attributes and len(attributes) <= _ROOM)


def inject(attributes: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``attributes`` plus the current span's ``traceparent`` (when there is a
    recording span and no ``traceparent`` yet); unchanged otherwise."""
    if not ENABLED or not can_carry(attributes):
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
    if not ENABLED:
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(dict(message.attributes))
    with _tracer().start_as_current_span(
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

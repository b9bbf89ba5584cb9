"""The benchmarked implementations, imported lazily so one that fails to import is skipped."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .base import Implementation

REGISTRY: dict[str, str] = {
    "handwritten": "impls.handwritten:Handwritten",
    "faststream": "impls.faststream_impl:FastStream",
    "nats": "impls.nats_impl:Nats",
    "streamsub": "impls.streamsub_impl:Streamsub",
    "streamsub-1s": "impls.streamsub_impl:StreamsubBusyLeases",
    "streamsub-def": "impls.streamsub_impl:StreamsubDef",
    "streamsub-0.1": "impls.streamsub_prev:StreamsubPrevious",
    "streamsub-fixed": "impls.streamsub_prev:StreamsubBeforeAdaptive",
    "streamsub-adaptive": "impls.streamsub_prev:StreamsubAdaptive",
    "streamsub-pre-recv": "impls.streamsub_prev:StreamsubBeforeReceivePath",
    "streamsub-4sub": "impls.streamsub_impl:StreamsubKeyed",
    "streamsub-ordered": "impls.streamsub_impl:StreamsubOrdered",
}
BASELINE = "handwritten"


def load(name: str) -> type[Implementation]:
    """Import and return the implementation class registered as ``name``."""
    module_name, _, attr = REGISTRY[name].partition(":")
    cls: type[Implementation] = getattr(importlib.import_module(module_name), attr)
    return cls


def load_available(
    names: list[str], reason: Callable[[type[Implementation]], str | None] | None = None
) -> tuple[dict[str, type[Implementation]], dict[str, str]]:
    """Import each implementation; one that fails to import, is unavailable here
    (:meth:`Implementation.unavailable`) or that ``reason`` refuses is skipped
    with why."""
    loaded: dict[str, type[Implementation]] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            cls = load(name)
        except Exception as exc:  # an impl under construction may fail in any way
            skipped[name] = f"import failed: {type(exc).__name__}: {exc}"
            continue
        why = cls.unavailable() or (reason(cls) if reason else None)
        if why is None:
            loaded[name] = cls
        else:
            skipped[name] = why
    return loaded, skipped

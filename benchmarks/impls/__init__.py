"""The benchmarked implementations, imported lazily so one that fails to import is skipped."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .base import Env, Implementation

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
    "streamsub-pre-runs": "impls.streamsub_prev:StreamsubBeforeDataRuns",
    "streamsub-pre-lone": "impls.streamsub_prev:StreamsubBeforeLonePublish",
    "streamsub-tasks": "impls.streamsub_prev:StreamsubTaskPerHandler",
    "streamsub-pre-split": "impls.streamsub_prev:StreamsubBeforeSplit",
    "streamsub-pre-inline": "impls.streamsub_prev:StreamsubBeforeInlineRead",
    "streamsub-pre-lane": "impls.streamsub_prev:StreamsubBeforeLane",
    "streamsub-4sub": "impls.streamsub_impl:StreamsubKeyed",
    "streamsub-ordered": "impls.streamsub_impl:StreamsubOrdered",
}
BASELINE = "handwritten"
CLUSTER = "@cluster"
"""The suffix of a row run on the private Redis Cluster (``--cluster``)."""


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


def instantiate(
    classes: dict[str, type[Implementation]], env: Env, cluster_env: Env | None = None
) -> dict[str, Implementation]:
    """Each implementation on ``env``, the run's one server; with ``cluster_env``
    then each one that has a cluster variant on the cluster, as ``name@cluster``."""
    impls = {name: cls(env) for name, cls in classes.items()}
    if cluster_env is not None:
        for name, cls in classes.items():
            variant = cls.cluster_variant()
            if variant is not None:
                impls[name + CLUSTER] = variant(cluster_env)
    return impls


def baseline_of(row: str) -> str:
    """The row a row's ratios are taken against: the hand-written loop on the
    same server(s) -- ``handwritten``, or ``handwritten@cluster`` for a cluster row."""
    return BASELINE + CLUSTER if row.endswith(CLUSTER) else BASELINE

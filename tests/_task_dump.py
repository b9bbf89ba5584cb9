"""When a test phase hangs, print what every asyncio task awaits.

pytest-timeout (120 s, pyproject.toml) prints the threads' stacks, and the
main thread's shows only the event loop waiting in ``select``. A phase still
running :data:`DUMP_BEFORE` seconds before its timeout gets, on its stderr
(shown with the failure), each task of the running loop and the chain of
coroutines it awaits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Generator, Iterator
from types import FrameType
from typing import Any

import pytest

DUMP_BEFORE = 20.0
"""Seconds before a test phase's timeout that its tasks are printed."""


def install() -> None:
    """Print the tasks on SIGUSR1 (the handler runs on the main thread, where
    the loop runs)."""
    signal.signal(signal.SIGUSR1, _dump)


def watched(item: pytest.Item) -> Generator[None, Any, Any]:
    """The body of a hook wrapper around a test phase of ``item``: SIGUSR1 is
    sent :data:`DUMP_BEFORE` seconds before its timeout, unless it ended."""
    marker = item.get_closest_marker("timeout")
    timeout = float(marker.args[0] if marker and marker.args else item.config.getini("timeout"))
    after = max(1.0, timeout - DUMP_BEFORE)
    timer = threading.Timer(after, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()


def _dump(signum: int, frame: FrameType | None) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        print("== task dump: no event loop running", file=sys.stderr)
        return
    tasks = asyncio.all_tasks(loop)
    print(f"== task dump: {len(tasks)} tasks, {DUMP_BEFORE:g} s to the timeout", file=sys.stderr)
    for task in tasks:
        print(f"-- {task!r}", file=sys.stderr)
        for where in _awaiting(task.get_coro()):
            print(f"     {where}", file=sys.stderr)
    sys.stderr.flush()


def _awaiting(coro: Any) -> Iterator[str]:
    """Where ``coro`` is suspended, and the coroutines it awaits, outermost first."""
    for _ in range(64):
        if coro is None:
            return
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            yield f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)

"""Run a coroutine eagerly: its first step now, a task only if it has to wait.

Most handlers finish without waiting on I/O, and an asyncio task costs more
than such a handler (two loop callbacks and a Task object each). Python 3.12's
``asyncio.eager_task_factory`` does the same; streamsub supports 3.11, so it
does it here: the first step runs at once in a copy of the current context,
and a coroutine that suspends goes on in a task that re-yields what it was
waiting for, exactly where it stopped.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any

__all__ = ["resume", "start_eager"]


class _Resume:
    """Continues an already started coroutine inside a task."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting_on = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield waiting_on
            except BaseException as exc:  # cancellation and thrown errors reach the handler
                try:
                    waiting_on = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting_on = coro.send(sent)
                except StopIteration:
                    return


def resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> Awaitable[None]:
    """Await the rest of ``coro``, started elsewhere and now ``waiting_on`` something."""
    return _Resume(coro, waiting_on)


async def _continue(rest: Awaitable[None]) -> None:
    await rest


def start_eager(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` until it first waits; return the task that finishes it, or None
    when it already finished."""
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(
        _continue(resume(coro, waiting_on)), context=context
    )

"""The dispatcher: runs each message's handler in an asyncio task of its own.

Each handler is a real task, so ``asyncio.timeout``, ``TaskGroup``, anyio
cancel scopes (httpx) and context variables behave inside it exactly as in any
task. A plain ``def`` handler runs in a thread pool (its context copied in);
whatever it returns that is awaitable (``lambda m: work(m)`` over an
``async def work``, a decorator returning a plain function) is awaited on the
loop, never dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import metrics, tracing
from .._message import Message

__all__ = ["DEFAULT_HANDLER_THREADS", "Dispatcher", "Handler", "is_async_handler"]

Handler = Callable[[Message], Awaitable[None]] | Callable[[Message], None]

DEFAULT_HANDLER_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Threads for plain ``def`` handlers: the standard library's default pool size."""


def is_async_handler(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine (``async def``, a partial of
    one, or an object with an ``async def __call__``)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
    )


class Dispatcher:
    """Starts handlers and reports each outcome to ``done(message, error)``."""

    def __init__(
        self,
        handler: Handler,
        *,
        done: Callable[[Message, BaseException | None], None],
        subscription: str,
        threads: int = DEFAULT_HANDLER_THREADS,
    ) -> None:
        self._subscription = subscription
        self._tracing = tracing.ENABLED
        """Each handling in a span, the child of its publish span, while an
        OpenTelemetry SDK is set up."""
        self._handler = handler
        self._done = done
        self._is_async = is_async_handler(handler)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._threads = threads
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._tasks)

    def start(self, messages: list[Message]) -> None:
        """Start a handler task for each message."""
        create_task = asyncio.get_running_loop().create_task
        run = self._run_async if self._is_async else self._run_sync
        add = self._tasks.add
        for message in messages:
            message._started = True
            add(create_task(run(message)))

    async def _run_async(self, message: Message) -> None:
        # The task takes itself out of the set as it ends: cheaper than a done
        # callback, which costs one more turn of the loop per message.
        started = time.perf_counter()
        try:
            if self._tracing and tracing.active():
                with tracing.handling_span(message, self._subscription):
                    await self._handler(message)  # type: ignore[misc]
            else:
                await self._handler(message)  # type: ignore[misc]
        except asyncio.CancelledError as exc:
            if _cancelled_by_owner():
                self._tasks.discard(asyncio.current_task())
                raise
            self._done(message, exc)
        except Exception as exc:
            self._done(message, exc)
        else:
            self._done(message, None)
        metrics.observe_handler_latency(self._subscription, time.perf_counter() - started)
        self._tasks.discard(asyncio.current_task())

    async def _run_sync(self, message: Message) -> None:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="streamsub-handler"
            )
        started = time.perf_counter()
        try:
            if self._tracing and tracing.active():
                with tracing.handling_span(message, self._subscription):
                    result = await self._in_thread(message)
                    if inspect.isawaitable(result):
                        await result
            else:
                result = await self._in_thread(message)
                if inspect.isawaitable(result):
                    await result
        except asyncio.CancelledError as exc:
            if _cancelled_by_owner():
                self._tasks.discard(asyncio.current_task())
                raise
            self._done(message, exc)
        except Exception as exc:
            self._done(message, exc)
        else:
            self._done(message, None)
        metrics.observe_handler_latency(self._subscription, time.perf_counter() - started)
        self._tasks.discard(asyncio.current_task())

    async def _in_thread(self, message: Message) -> object:
        """Call the handler in the pool, in a copy of the current context (its span)."""
        call = functools.partial(contextvars.copy_context().run, self._handler, message)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for running handlers; cancel the rest."""
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=max(0.0, timeout))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    def close(self) -> None:
        """Let go of the thread pool (threads still in a handler finish on their own)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _cancelled_by_owner() -> bool:
    """Whether the running task was cancelled from outside (shutdown), rather than
    a handler raising CancelledError of its own."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

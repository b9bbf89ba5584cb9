"""The dispatcher: runs each message's handler in an asyncio task, one at a time.

A handler runs in a runner task (``runners.py``) that runs no other handler
until it ends, in a context of its own, so ``asyncio.timeout``, ``TaskGroup``,
anyio cancel scopes (httpx) and context variables behave inside it as in any
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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .. import metrics, tracing
from .._message import Message
from .runners import Runners

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
    """Starts handlers and reports each outcome.

    A handler that raised (or was cancelled by its own code) is reported at once
    to ``done(message, error)``; those that returned are reported together to
    ``handled(messages)`` once per turn of the event loop: the handlers of one
    read end in the same turn, so their messages settle (and their acks queue)
    as one batch, with one call per layer rather than one per message.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        done: Callable[[Message, BaseException | None], None],
        handled: Callable[[list[Message]], None],
        subscription: str,
        threads: int = DEFAULT_HANDLER_THREADS,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        self._subscription = subscription
        self._tracing = tracing.ENABLED
        """Each handling in a span, the child of its publish span, while an
        OpenTelemetry SDK is set up."""
        self._handler = handler
        self._done = done
        self._handled = handled
        self._is_async = is_async_handler(handler)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._threads = threads
        self._alive = alive
        """Whether the subscriber runs (not stopping, not cancelled with every
        task): a cancellation that reaches a handler then is the handler's."""
        self._runners: Runners[Message] = Runners(self._run, contextvars.copy_context(), alive)
        self._returned: list[Message] = []
        """Handlers that returned this turn, reported at its end."""
        self._seconds: list[float] = []
        """Their run times, for the handler-latency histogram."""

    @property
    def running(self) -> int:
        """Handlers running or about to."""
        return self._runners.outstanding

    def start(self, messages: list[Message]) -> None:
        """Start a handler for each message (none once closed)."""
        if self._runners.closed:
            return
        for message in messages:
            message._started = True
        self._runners.submit(messages)

    def _run(self, message: Message) -> Coroutine[Any, Any, None]:
        if not self._is_async:
            return self._run_sync(message)
        if self._tracing and tracing.active():
            return self._run_traced(message)
        return self._run_async(message)

    def report(self) -> None:
        """Report the handlers that returned and are not reported yet."""
        returned, self._returned = self._returned, []
        seconds, self._seconds = self._seconds, []
        if returned:
            self._handled(returned)
            metrics.observe_handler_latencies(self._subscription, seconds)

    def _returned_one(self, message: Message, started: float) -> None:
        """A handler returned: report it with the others that return in this turn."""
        seconds = time.perf_counter() - started
        if not self._returned:  # the first of this turn: report at its end
            asyncio.get_running_loop().call_soon(self.report)
        self._returned.append(message)
        self._seconds.append(seconds)

    def _raised(self, message: Message, exc: BaseException, started: float) -> bool:
        """A handler raised: report it now. Return True when its runner must raise
        it on: a cancellation while the subscriber stops (the drain's, or code
        cancelling every task: its message goes back unsettled), or a
        BaseException that is not an Exception. A cancellation while it runs
        (code that kept a runner's task and cancelled it) is the handler's
        error, as a raise is."""
        seconds = time.perf_counter() - started
        if isinstance(exc, asyncio.CancelledError):
            if not self._alive():
                return True
        elif not isinstance(exc, Exception):
            return True
        self._done(message, exc)
        metrics.observe_handler_latency(self._subscription, seconds)
        return False

    async def _run_async(self, message: Message) -> None:
        started = time.perf_counter()
        try:
            await self._handler(message)  # type: ignore[misc]
        except BaseException as exc:
            if self._raised(message, exc, started):
                raise
        else:
            self._returned_one(message, started)

    async def _run_traced(self, message: Message) -> None:
        started = time.perf_counter()
        try:
            with tracing.handling_span(message, self._subscription):
                await self._handler(message)  # type: ignore[misc]
        except BaseException as exc:
            if self._raised(message, exc, started):
                raise
        else:
            self._returned_one(message, started)

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
        except BaseException as exc:
            if self._raised(message, exc, started):
                raise
        else:
            self._returned_one(message, started)

    async def _in_thread(self, message: Message) -> object:
        """Call the handler in the pool, in a copy of the current context (its span)."""
        call = functools.partial(contextvars.copy_context().run, self._handler, message)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for running handlers; cancel the rest
        (those that have not started never do)."""
        if not await self._runners.join(timeout):
            await self._runners.cancel()
        self.report()  # before what is still held is given back

    def close(self) -> None:
        """End the runners; let go of the thread pool (threads still in a
        handler finish on their own)."""
        self._runners.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

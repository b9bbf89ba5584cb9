"""The event-loop thread behind ``streamsub.blocking``: one loop, one thread, and
a safe way for any other thread to run a coroutine on it.

Kept apart from ``blocking.py`` so that the public module holds only the thin
methods users read. Everything here is about threads: submitting in call order,
refusing calls from the loop thread itself (they would deadlock), and never
leaving a caller waiting on a loop that has stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from ._errors import ClosedError, FailedPreconditionError

__all__ = ["LoopThread"]

log = logging.getLogger("streamsub")

P = ParamSpec("P")
T = TypeVar("T")

_numbers = itertools.count(1)


class LoopThread:
    """An asyncio event loop running in a daemon thread of its own.

    ``submit`` may be called from any thread. Coroutines submitted from one
    thread start on the loop in the order they were submitted (the loop's ready
    queue is first in, first out), which keeps one thread's publishes in call
    order.
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._open = True
        self._thread = threading.Thread(
            target=self._run, name=f"streamsub-blocking-{next(_numbers)}", daemon=True
        )
        self._thread.start()

    @property
    def name(self) -> str:
        """The thread's name (``streamsub-blocking-n``)."""
        return self._thread.name

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.get_ident() == self._thread.ident

    def check_caller(self) -> None:
        """Raise :class:`FailedPreconditionError` when called from the loop thread,
        where waiting on the loop would wait for ever."""
        if self.in_loop_thread():
            raise FailedPreconditionError(
                f"{self._what} was called from its own event-loop thread (an async callback, "
                "or a done callback of one of its futures); blocking there would deadlock. "
                "Use a plain `def` callback (it runs in a handler thread), or the async "
                "streamsub.Client in async code"
            )

    def submit(
        self,
        function: Callable[P, Coroutine[Any, Any, T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> concurrent.futures.Future[T]:
        """Run ``function(*args, **kwargs)`` on the loop; return its future at once.

        Raises :class:`ClosedError` once :meth:`stop` has begun: whatever was
        submitted before is on the loop ahead of the stop, so nothing submitted
        is left waiting on a stopped loop. Raises
        :class:`FailedPreconditionError` on the loop thread (see :meth:`check_caller`).
        """
        self.check_caller()
        with self._lock:
            if not self._open:
                raise ClosedError(
                    f"{self._what} is closed; create a new one with streamsub.blocking.connect()"
                )
            return asyncio.run_coroutine_threadsafe(function(*args, **kwargs), self.loop)

    def call(
        self,
        function: Callable[P, Coroutine[Any, Any, T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``function(*args, **kwargs)`` on the loop and return (or raise) its
        outcome: the very exception object the coroutine raised."""
        return self.submit(function, *args, **kwargs).result()

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop soon, from any thread; nothing if it stopped."""
        with contextlib.suppress(RuntimeError):  # closed: what it would stop has stopped
            self.loop.call_soon_threadsafe(callback)

    def stop(self, last: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Refuse new work, run ``last()`` on the loop after everything submitted
        so far, then stop the loop and wait for its thread. Idempotent: a second
        call returns at once."""
        self.check_caller()
        with self._lock:
            if not self._open:
                return
            self._open = False
            closing = asyncio.run_coroutine_threadsafe(last(), self.loop)
        try:
            closing.result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                _cancel_all_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


def _cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on a stopping loop, so no caller waits on it for ever
    (its future ends cancelled), as ``asyncio.run`` does."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "streamsub: a task ended with an error as the blocking client closed: %r",
                task.exception(),
            )

"""The event-loop thread behind ``streamsub.blocking``: one loop, one thread, and
a safe way for any other thread to run a coroutine on it.

Kept apart from ``blocking.py`` so that the public module holds only the thin
methods users read. Everything here is about threads: submitting in call order,
refusing calls from the loop thread itself (they would deadlock), and never
leaving a caller waiting on a loop that has stopped.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from ._core.publish_flow import PublishBudget
from ._errors import ClosedError, FailedPreconditionError
from ._settings import LimitExceededBehavior, PublishFlowControl

__all__ = ["LoopThread", "PublishRoom"]

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


class PublishRoom:
    """A client's ``PublishFlowControl`` as its calling threads see it, for ``BLOCK``.

    The async client's gate waits on the event loop, which the blocking
    ``publish`` never waits for: without this, a thread publishing in a loop
    would queue work without end. Here the calling thread itself waits, in call
    order, until its call fits the same :class:`PublishBudget`; the call's share
    is given back once its future is done. A call larger than a whole limit goes
    once nothing else is outstanding, as on the async side.
    """

    def __init__(self, settings: PublishFlowControl) -> None:
        self._budget = PublishBudget(settings)
        self._blocks = settings.limit_exceeded_behavior is LimitExceededBehavior.BLOCK
        self._condition = threading.Condition()
        self._line: collections.deque[object] = collections.deque()

    @property
    def outstanding(self) -> tuple[int, int]:
        """Messages and bytes of calls entered whose future is not yet done."""
        with self._condition:
            return self._budget.messages, self._budget.bytes

    def enter(
        self,
        messages: int,
        size: int,
        paused: Callable[[], BaseException | None] = lambda: None,
    ) -> bool:
        """Under ``BLOCK``, wait until a call of ``messages`` and ``size`` bytes fits,
        count it and return True (hand its future to :meth:`leave_when_done`).
        Otherwise return False at once: ``ERROR`` and ``IGNORE`` are the gate's.

        ``paused`` says whether one of the call's ordering keys is paused (the
        error to raise): checked before waiting and at every wake-up, so such a
        call fails at once instead of waiting for room and being stored after the
        key's republished messages."""
        if not self._blocks:
            return False
        budget = self._budget
        with self._condition:
            if (error := paused()) is not None:
                raise error
            if not self._line and budget.fits(messages, size):
                budget.take(messages, size)
                return True
            ticket = object()
            self._line.append(ticket)
            try:
                while self._line[0] is not ticket or not budget.fits(messages, size):
                    self._condition.wait()
                    if (error := paused()) is not None:
                        raise error
                budget.take(messages, size)
            finally:  # admitted, or interrupted (KeyboardInterrupt): make way
                self._line.remove(ticket)
                self._condition.notify_all()
            return True

    def wake(self) -> None:
        """Wake the threads waiting for room to look again (keys were paused)."""
        with self._condition:
            self._condition.notify_all()

    def leave(self, messages: int, size: int) -> None:
        """Give a call's share back and wake the threads waiting for room."""
        with self._condition:
            self._budget.release(messages, size)
            self._condition.notify_all()

    def leave_when_done(
        self, future: concurrent.futures.Future[Any], messages: int, size: int
    ) -> None:
        """Give a call's share back once ``future`` is done (stored, failed or cancelled)."""
        future.add_done_callback(lambda _: self.leave(messages, size))

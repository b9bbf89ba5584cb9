"""Handler runners: a pool of asyncio tasks, each running one handler at a time.

A task per handler costs more than most handlers do: on Python 3.11 making an
``asyncio.Task`` schedules its first step as a callback of its own and adds it to
asyncio's ``WeakSet`` of all tasks (Python code, undone by a weakref callback as
it dies). A runner is a long-lived task that takes queued work one item after
another, each coroutine in a fresh copy of the subscriber's context:

- a handler that returns without suspending costs a coroutine and a context copy,
  and the runner goes on to the next item in the same turn of the event loop;
- a handler that suspends keeps its runner (the runner task awaits what the
  handler awaits, so ``asyncio.timeout``, ``TaskGroup``, anyio cancel scopes and
  ``asyncio.current_task()`` find a task running that handler alone), and hands
  the queue over first: it wakes idle runners (or makes them) for the items
  queued, up to ``HANDOFF``, each of which does the same as its handler
  suspends.

So handlers run about as concurrently as with a task each: a queued item waits
while another handler runs without suspending, as it would for its task's first
step, and a few turns of the loop more behind handlers that suspend. A runner
runs handlers one after the other, never two at once, as a thread pool reuses
its threads; the pool keeps up to ``IDLE_KEEP`` idle runners. A handler that
swallows a cancellation of its runner ends that runner, so no later handler
inherits the request. A runner cancelled while its owner stops (code stopping
every task) starts nothing more, and none is made in its place.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["HANDOFF", "IDLE_KEEP", "Runners"]

HANDOFF = 8
"""Runners a suspending handler's runner wakes at most for the work queued behind
it; each of those that suspends in turn wakes as many again (1, 8, 64, 512: a
read of 1,000 handlers that all wait on I/O starts within five turns of the
loop), while a queue of handlers that mostly return at once wakes few for
nothing."""

IDLE_KEEP = 1_000
"""Idle runners kept for later work (about 1 KB each); one more that runs out of
work ends. As many as flow control's default ``max_messages``: a subscriber
whose handlers wait on I/O in bursts keeps its runners between bursts (with 64
kept, bursts of 500 such handlers cost 9.1 µs a handler against a task's 5.8:
``benchmarks/README.md``, "Handler runners")."""

T = TypeVar("T")

Run = Callable[[T], Coroutine[Any, Any, None]]


class Runners(Generic[T]):
    """Runs ``run(item)`` for each submitted item, in a pool of runner tasks.

    ``takers`` counts the runners taking work from the queue now or woken to
    take it; whenever the queue holds work, at least one is, and a handler that
    suspends wakes more (``HANDOFF``), so queued work never waits for a handler
    that suspended. A runner that ends (cancelled, or its handler swallowed a
    cancellation) is replaced while ``alive()`` says the pool's owner runs; not
    when it says it stops (code cancelling every task, a shutdown), so no
    handler starts behind a shutdown's back. A runner takes, in one step, at
    most what was queued when the step began: work queued meanwhile (a
    handler's ack letting the next message of its key start) waits for a later
    turn of the loop, or for a runner whose handler resumes.
    """

    def __init__(
        self, run: Run[T], context: contextvars.Context, alive: Callable[[], bool] = lambda: True
    ) -> None:
        self._run = run
        self._alive = alive
        self._context = context
        """Each item runs in a copy of this: the subscriber's, not whichever
        handler's context queued it."""
        self._queue: deque[T] = deque()
        self._idle: list[asyncio.Future[None]] = []
        self._takers = 0
        self._suspended: set[asyncio.Task[None]] = set()
        """Runners inside a handler that is suspended."""
        self._runners: set[asyncio.Task[None]] = set()
        self._unstarted: set[asyncio.Task[None]] = set()
        """Runners made and not yet run: counted as takers until they run."""
        self._outstanding = 0
        """Items submitted and not finished: queued or running."""
        self._joined: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def outstanding(self) -> int:
        """Items queued or running."""
        return self._outstanding

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called: nothing submitted runs any more."""
        return self._closed

    def submit(self, items: Iterable[T]) -> None:
        """Queue each item to run (nothing, once closed)."""
        if self._closed:
            return
        before = len(self._queue)
        self._queue.extend(items)
        self._outstanding += len(self._queue) - before
        if self._queue and not self._takers:
            self._wake()

    async def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every item to finish; True if they did."""
        if not self._outstanding:
            return True
        if self._joined is None or self._joined.done():
            self._joined = asyncio.get_running_loop().create_future()
        done, _ = await asyncio.wait({self._joined}, timeout=max(0.0, timeout))
        return bool(done)

    async def cancel(self) -> list[T]:
        """Drop the queued items (they never start) and cancel the handlers
        running; wait for their runners to end. Return the items dropped."""
        dropped = list(self._queue)
        self._queue.clear()
        for _ in dropped:
            self._finished()
        running = list(self._suspended)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        return dropped

    def close(self) -> None:
        """End every runner (idle ones wait for work for ever)."""
        self._closed = True
        for task in self._runners:
            task.cancel()

    def _wake(self) -> None:
        while self._idle:
            parked = self._idle.pop()
            if not parked.done():  # a cancelled runner leaves its own behind
                parked.set_result(None)
                self._takers += 1
                return
        # No context= keyword: a task factory of two arguments takes none. The
        # task copies the context it is made in.
        task: asyncio.Task[None] = self._context.copy().run(
            asyncio.get_running_loop().create_task,
            self._work(),
            name="streamsub-handler-runner",
        )
        self._takers += 1
        self._runners.add(task)
        self._unstarted.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._runners.discard(task)
        if task in self._unstarted:  # cancelled before its first step
            self._unstarted.discard(task)
            self._takers -= 1
            self._replace()

    def _replace(self) -> None:
        """A runner ended: wake another if it left queued work untaken, unless
        the owner is stopping (a shutdown must not see handlers start)."""
        if self._queue and not self._takers and not self._closed and self._alive():
            self._wake()

    def _finished(self) -> None:
        self._outstanding -= 1
        if not self._outstanding and self._joined is not None and not self._joined.done():
            self._joined.set_result(None)

    async def _work(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._unstarted.discard(task)
        loop = asyncio.get_running_loop()
        queue = self._queue
        taking = True  # _wake counted this runner
        try:
            while True:
                left = len(queue)  # what this step takes; the rest waits a turn
                while queue:
                    if not left:
                        await asyncio.sleep(0)  # still a taker: submit wakes nobody
                        left = len(queue)
                        continue
                    left -= 1
                    context = self._context.copy()
                    try:
                        coro = self._run(queue.popleft())
                        signal = context.run(coro.send, None)
                    except StopIteration:
                        pass
                    else:
                        # Suspended: the runner stays with this handler.
                        taking = False
                        self._takers -= 1
                        for _ in range(HANDOFF):
                            if len(queue) <= self._takers:
                                break
                            self._wake()
                        self._suspended.add(task)
                        await _Resume(coro, context, signal)
                        self._suspended.discard(task)
                        taking = True
                        self._takers += 1
                        left = len(queue)  # a new step
                    finally:
                        self._finished()
                    if task.cancelling():
                        return  # its cancel was swallowed: no later handler inherits it
                taking = False
                self._takers -= 1
                if len(self._idle) >= IDLE_KEEP:
                    return
                parked = loop.create_future()
                self._idle.append(parked)
                try:
                    await parked
                except asyncio.CancelledError:
                    # Woken before the cancel arrived: _wake counted it.
                    taking = parked.done() and not parked.cancelled()
                    if not taking and parked in self._idle:
                        self._idle.remove(parked)
                    raise
                taking = True
                if task.cancelling():
                    return
        except GeneratorExit:  # closed unfinished (its loop is gone): replace none
            self._closed = True
            raise
        finally:
            self._suspended.discard(task)
            if taking:
                self._takers -= 1
            self._replace()


class _Resume:
    """Awaits what a suspended coroutine awaits, then resumes it in its context,
    until it returns: the rest of a handler, run in its runner's task."""

    __slots__ = ("_context", "_coro", "_signal")

    def __init__(
        self, coro: Coroutine[Any, Any, None], context: contextvars.Context, signal: Any
    ) -> None:
        self._coro = coro
        self._context = context
        self._signal = signal

    def __await__(self) -> Generator[Any, None, None]:
        coro, run, signal = self._coro, self._context.run, self._signal
        try:
            while True:
                thrown: BaseException | None = None
                try:
                    yield signal
                except GeneratorExit:
                    run(coro.close)
                    raise
                except BaseException as exc:  # a cancellation: the handler's to handle
                    thrown = exc
                # Outside the except block, so the handler does not run with the
                # exception as the one being handled (sys.exc_info, __context__).
                signal = run(coro.send, None) if thrown is None else run(coro.throw, thrown)
        except StopIteration:
            return

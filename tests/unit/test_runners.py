"""The handler runners: a pool of tasks, each running one coroutine at a time."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from streamsub._engine import runners as runners_module
from streamsub._engine.runners import HANDOFF, Runners

Run = Callable[[int], Coroutine[Any, Any, None]]

who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def runners(run: Run, alive: Callable[[], bool] = lambda: True) -> Runners[int]:
    return Runners(run, contextvars.copy_context(), alive)


class Owner:
    """The pool's owner, running until ``stop``: what ``alive`` tells."""

    def __init__(self) -> None:
        self.running = True

    def alive(self) -> bool:
        return self.running

    def stop(self) -> None:
        self.running = False


class Stuck:
    """A handler that waits for ever on the items ``stuck`` picks (all by
    default), noting those that started and those that saw a cancellation."""

    def __init__(self, stuck: Callable[[int], bool] = lambda n: True) -> None:
        self._stuck = stuck
        self._never = asyncio.Event()
        self.started: list[int] = []
        self.cancelled: list[int] = []

    async def __call__(self, n: int) -> None:
        self.started.append(n)
        if self._stuck(n):
            try:
                await self._never.wait()
            except asyncio.CancelledError:
                self.cancelled.append(n)
                raise


async def test_handlers_that_never_suspend_run_in_order_in_one_runner_in_one_turn() -> None:
    ran: list[int] = []
    tasks: set[asyncio.Task[Any] | None] = set()

    async def run(n: int) -> None:
        ran.append(n)
        tasks.add(asyncio.current_task())

    pool = runners(run)
    pool.submit(range(300))
    pool.submit(range(300, 500))
    assert pool.outstanding == 500
    await asyncio.sleep(0)  # one turn: the runner's first step
    assert ran == list(range(500))
    assert len(tasks) == 1
    assert None not in tasks
    assert pool.outstanding == 0
    pool.close()


async def test_handlers_that_suspend_run_at_once_each_alone_in_a_runner() -> None:
    """200 handlers, each waiting until all 200 have started: only a pool that
    hands its queue over as a handler suspends lets them finish."""
    started = 0
    everyone = asyncio.Event()
    busy: set[asyncio.Task[Any]] = set()
    shared = 0
    finished: list[int] = []

    async def run(n: int) -> None:
        nonlocal started, shared
        task = asyncio.current_task()
        assert task is not None
        shared += task in busy
        busy.add(task)
        started += 1
        if started == 200:
            everyone.set()
        await everyone.wait()
        await asyncio.sleep(0)
        busy.discard(task)
        finished.append(n)

    pool = runners(run)
    for first in range(0, 200, 50):  # in several submissions, as reads come
        pool.submit(range(first, first + 50))
    for _ in range(5):  # 1, then 8, 64, 127 more a turn (HANDOFF)
        await asyncio.sleep(0)
    assert started == 200, f"{started} of 200 started after five turns of the loop"
    assert await pool.join(5.0)
    assert sorted(finished) == list(range(200))
    assert shared == 0
    pool.close()


async def test_idle_runners_past_idle_keep_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runners_module, "IDLE_KEEP", 10)
    never_before = asyncio.Event()

    async def run(n: int) -> None:
        await never_before.wait()

    pool = runners(run)
    pool.submit(range(50))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(pool._runners) == 50
    never_before.set()
    assert await pool.join(5.0)
    await asyncio.sleep(0)
    assert len(pool._idle) == 10
    assert len(pool._runners) == 10, "the idle runners past IDLE_KEEP did not end"
    pool.close()


async def test_one_suspension_among_many_quick_handlers_wakes_a_few_runners_not_one_each() -> None:
    ran: list[int] = []

    async def run(n: int) -> None:
        ran.append(n)
        if n == 0:
            await asyncio.sleep(0.01)

    pool = runners(run)
    pool.submit(range(1000))
    assert await pool.join(5.0)
    assert sorted(ran) == list(range(1000))
    assert len(pool._runners) <= 1 + HANDOFF
    pool.close()


async def test_a_timeout_inside_a_handler_touches_no_later_handler_of_its_runner() -> None:
    """One runner (each handler submitted once the one before ended): every
    other handler times out inside ``asyncio.timeout`` and handles it; the
    handler after it, on the same runner, starts uncancelled, outside any
    exception, and finishes."""
    outcomes: dict[int, str] = {}
    tasks: set[asyncio.Task[Any]] = set()
    dirty: list[tuple[int, int, object]] = []

    async def run(n: int) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        if task.cancelling() or sys.exc_info()[1] is not None:
            dirty.append((n, task.cancelling(), sys.exc_info()[1]))
        try:
            async with asyncio.timeout(0.001 if n % 2 else 1.0):
                await asyncio.sleep(0.05 if n % 2 else 0)
        except TimeoutError:
            outcomes[n] = "timed out"
        else:
            outcomes[n] = "done"
        if sys.exc_info()[1] is not None:  # the cancel it handled is not current
            dirty.append((n, task.cancelling(), sys.exc_info()[1]))

    pool = runners(run)
    for n in range(40):
        pool.submit([n])
        assert await pool.join(5.0)
    assert outcomes == {n: "timed out" if n % 2 else "done" for n in range(40)}
    assert len(tasks) == 1, "the handlers did not share a runner: nothing was tested"
    assert dirty == []
    pool.close()


async def test_an_exception_raised_after_a_handled_cancel_has_no_cancel_as_context() -> None:
    """A handler that handles its timeout and raises an error of its own: the
    error does not carry the runner's CancelledError as ``__context__``."""
    raised: list[BaseException] = []

    async def run(n: int) -> None:
        try:
            try:
                async with asyncio.timeout(0.001):
                    await asyncio.sleep(1)
            except TimeoutError:
                pass
            raise ValueError("retry later")
        except ValueError as exc:
            raised.append(exc)

    pool = runners(run)
    pool.submit([1])
    assert await pool.join(5.0)
    assert len(raised) == 1
    assert raised[0].__context__ is None
    pool.close()


async def test_work_queued_by_a_handler_waits_a_turn_so_a_chain_does_not_starve_the_loop() -> None:
    """Each handler queues the next (as an ack lets the next message of a key
    start) and returns without suspending: one handler a turn of the loop, so a
    timer set meanwhile fires within a few handlers, not after all 500."""
    pool: Runners[int]
    ran: list[int] = []
    ticks: list[int] = []

    async def run(n: int) -> None:
        ran.append(n)
        if n == 0:
            asyncio.get_running_loop().call_soon(lambda: ticks.append(len(ran)))
        if n < 500:
            pool.submit([n + 1])

    pool = runners(run)
    pool.submit([0])
    assert await pool.join(5.0)
    assert ran == list(range(501))
    assert ticks
    assert ticks[0] <= 3, f"the loop's callback waited for {ticks[0]} chained handlers"
    pool.close()


@pytest.mark.parametrize("stopping", [False, True])
async def test_a_runner_cancelled_before_its_first_step(stopping: bool) -> None:
    """While the owner runs, another runner takes the queue at once; once it
    stops (code cancelling every task), nothing starts behind its back."""
    ran: list[int] = []

    async def run(n: int) -> None:
        ran.append(n)

    owner = Owner()
    pool = runners(run, owner.alive)
    pool.submit([1, 2, 3])
    (first,) = pool._runners
    if stopping:
        owner.stop()
    first.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    if stopping:
        assert ran == []
        assert not pool._runners, "a runner was made in the cancelled one's place"
    else:
        assert ran == [1, 2, 3]
    pool.close()


async def test_cancelling_every_runner_starts_no_queued_work_and_makes_no_runner() -> None:
    """Handlers suspended and more queued behind them when every task is
    cancelled (asyncio.run's teardown, a SIGTERM handler): the suspended ones
    see the cancellation, nothing queued starts, no runner is made."""
    stuck = Stuck()
    started, cancelled = stuck.started, stuck.cancelled
    owner = Owner()
    pool = runners(stuck, owner.alive)
    pool.submit(range(100))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # 1, then 8 started
    everyone = set(pool._runners)
    assert started
    assert len(started) < 100, "nothing was left queued: nothing was tested"
    owner.stop()
    for task in everyone:
        task.cancel()
    await asyncio.gather(*everyone, return_exceptions=True)
    for _ in range(3):
        await asyncio.sleep(0)
    assert sorted(cancelled) == sorted(started)
    assert not pool._runners
    assert len(started) == len(cancelled)
    pool.close()


async def test_runners_start_under_a_task_factory_of_two_arguments() -> None:
    loop = asyncio.get_running_loop()
    made: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop)
        made.append(task)
        return task

    ran: list[int] = []

    async def run(n: int) -> None:
        ran.append(n)
        await asyncio.sleep(0)

    loop.set_task_factory(factory)
    try:
        pool = runners(run)
        pool.submit(range(5))
        assert await pool.join(5.0)
    finally:
        loop.set_task_factory(None)
    assert sorted(ran) == list(range(5))
    assert made
    pool.close()


async def test_a_runner_whose_cancel_a_handler_swallowed_ends_and_the_rest_run() -> None:
    cancelled_at: list[int] = []
    inherited: list[int] = []
    runner_of: dict[int, asyncio.Task[Any]] = {}
    gate = asyncio.Event()

    async def run(n: int) -> None:
        task = asyncio.current_task()
        assert task is not None
        runner_of[n] = task
        if n == 0:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                cancelled_at.append(n)  # swallowed
        else:
            if task.cancelling():
                inherited.append(n)
            await asyncio.sleep(0)

    pool = runners(run)
    pool.submit([0])
    await asyncio.sleep(0)
    runner_of[0].cancel()
    pool.submit(range(1, 50))
    assert await pool.join(5.0)
    assert cancelled_at == [0]
    assert inherited == []
    await asyncio.sleep(0)
    assert runner_of[0].done()
    assert all(runner_of[n] is not runner_of[0] for n in range(1, 50))
    assert sorted(runner_of) == list(range(50))
    pool.close()


async def test_each_handler_runs_in_a_fresh_copy_of_the_pools_context() -> None:
    token = who.set("subscriber")
    try:
        pool: Runners[int] = Runners(_record_who, contextvars.copy_context())
    finally:
        who.reset(token)
    _seen.clear()
    pool.submit(range(50))  # never suspend: all in one runner
    pool.submit(range(50, 60))
    await asyncio.sleep(0)
    assert await pool.join(5.0)
    assert _seen == dict.fromkeys(range(60), "subscriber")
    pool.close()


_seen: dict[int, str] = {}


async def _record_who(n: int) -> None:
    _seen[n] = who.get()
    who.set(f"handler {n}")  # must not leak into the next handler
    if n >= 50:
        await asyncio.sleep(0)
        assert who.get() == f"handler {n}"


async def test_cancel_drops_queued_work_and_cancels_the_suspended_handlers() -> None:
    stuck = Stuck(lambda n: n < 5)
    started, cancelled = stuck.started, stuck.cancelled
    pool = runners(stuck)
    pool.submit(range(5))
    await asyncio.sleep(0)
    assert not await pool.join(0.05)
    assert pool.outstanding == 5
    pool.submit(range(5, 10))  # queued as the cancel comes: never start
    assert await pool.cancel() == [5, 6, 7, 8, 9]
    assert sorted(cancelled) == list(range(5))
    assert started == list(range(5))
    assert pool.outstanding == 0
    pool.close()


async def test_a_coroutine_that_raises_ends_its_runner_and_the_queue_goes_on() -> None:
    ran: list[int] = []
    broken: list[asyncio.Task[Any]] = []

    async def run(n: int) -> None:
        ran.append(n)
        if n == 3:
            task = asyncio.current_task()
            assert task is not None
            broken.append(task)
            raise RuntimeError("a bug in the runner's caller")

    pool = runners(run)
    pool.submit(range(10))
    assert await pool.join(5.0)
    assert ran == list(range(10))
    with pytest.raises(RuntimeError):
        await broken[0]
    pool.close()


@pytest.mark.parametrize("stopping", [False, True])
async def test_a_runner_cancelled_between_its_steps(stopping: bool) -> None:
    """A chain of handlers, each queueing the next: its runner, cancelled while
    it waits for its next step, is replaced while the owner runs (the chain
    goes on), and not once it stops (the chain ends there)."""
    ran: list[int] = []
    pool: Runners[int]

    async def run(n: int) -> None:
        ran.append(n)
        if n < 100:
            pool.submit([n + 1])

    owner = Owner()
    pool = runners(run, owner.alive)
    pool.submit([0])
    await asyncio.sleep(0)
    (runner,) = pool._runners
    if stopping:
        owner.stop()
    runner.cancel()
    if stopping:
        for _ in range(5):
            await asyncio.sleep(0)
        assert 0 < len(ran) < 5
        assert not pool._runners
        assert pool.outstanding == 1  # queued, for a drain
    else:
        assert await pool.join(5.0)
        assert ran == list(range(101))
    pool.close()


async def test_a_handler_cancelling_an_earlier_handlers_task_strands_nothing() -> None:
    """Each handler cancels the task the one before it ran in (a "supersede the
    previous handler" pattern): with quick handlers that is its own runner,
    which ends; another takes the queue, and every item runs."""
    ran: list[int] = []
    previous: list[asyncio.Task[Any]] = []

    async def run(n: int) -> None:
        ran.append(n)
        task = asyncio.current_task()
        assert task is not None
        if previous:
            previous.pop().cancel()
        previous.append(task)

    pool = runners(run)
    pool.submit(range(8))
    assert await pool.join(5.0)
    assert ran == list(range(8))
    pool.close()

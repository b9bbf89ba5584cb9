"""The dispatcher on its runners: what each handler's end reports."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from streamsub._engine.dispatcher import Dispatcher
from streamsub._message import Message


def message(n: int) -> Message:
    return Message(
        data=str(n).encode(),
        attributes={},
        ordering_key=None,
        partition=0,
        entry_id=f"1-{n}",
        delivery_attempt=1,
        subscription="sub",
        size=1,
        delivered_ms=0,
        settling=None,  # type: ignore[arg-type]  # never settled here
    )


class Reports:
    """What a dispatcher reports, and whether its subscriber is stopping."""

    def __init__(self) -> None:
        self.errors: list[tuple[bytes, BaseException | None]] = []
        self.returned: list[bytes] = []
        self.stopping = False

    def dispatcher(self, handler: Callable[[Message], Awaitable[None]]) -> Dispatcher:
        return Dispatcher(
            handler,
            done=self.done,
            handled=self.handled,
            subscription="sub",
            alive=lambda: not self.stopping,
        )

    def done(self, message: Message, error: BaseException | None) -> None:
        self.errors.append((message.data, error))

    def handled(self, messages: list[Message]) -> None:
        self.returned += [m.data for m in messages]


async def test_handlers_cancelled_with_every_task_are_not_reported_as_failures() -> None:
    """Code stopping every task (asyncio.run's teardown, a SIGTERM handler)
    cancels the runners: their handlers' messages are not failed (that would
    spend a delivery attempt and back off), and nothing queued starts."""
    forever = asyncio.Event()
    began: list[bytes] = []

    async def handler(m: Message) -> None:
        began.append(m.data)
        await forever.wait()

    reports = Reports()
    dispatcher = reports.dispatcher(handler)
    dispatcher.start([message(n) for n in range(50)])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    runners = set(dispatcher._runners._runners)
    reports.stopping = True  # as the receiver shows once its settler is cancelled with every task
    for task in runners:
        task.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    for _ in range(3):
        await asyncio.sleep(0)
    assert 0 < len(began) < 50
    assert reports.errors == []
    assert reports.returned == []
    assert not dispatcher._runners._runners
    dispatcher.close()


async def test_a_cancel_by_code_that_kept_an_earlier_handlers_task_is_the_handlers_error() -> None:
    """Handler 1 keeps its task (a forgotten watchdog); handler 2 runs next on
    the same runner and is cancelled through it while the subscriber runs: its
    message is reported as failed (so it is nacked and logged), not dropped as
    if the subscriber were stopping."""
    kept: list[asyncio.Task[Any]] = []
    forever = asyncio.Event()

    async def handler(m: Message) -> None:
        if m.data == b"1":
            task = asyncio.current_task()
            assert task is not None
            kept.append(task)
        else:
            await forever.wait()

    reports = Reports()
    dispatcher = Dispatcher(handler, done=reports.done, handled=reports.handled, subscription="sub")
    dispatcher.start([message(1)])
    await asyncio.sleep(0)
    dispatcher.start([message(2)])
    await asyncio.sleep(0)
    assert dispatcher.running == 1
    kept[0].cancel()
    await asyncio.sleep(0.01)
    assert dispatcher.running == 0
    assert [(data, type(error)) for data, error in reports.errors] == [
        (b"2", asyncio.CancelledError)
    ]
    assert reports.returned == [b"1"]
    dispatcher.close()


async def test_a_drain_that_times_out_cancels_the_handlers_without_reporting_them() -> None:
    """Handlers still running when the drain's time is up are cancelled as a
    shutdown: not reported (their messages go back with the rest of what is
    held), and those that returned are reported."""
    forever = asyncio.Event()
    cancelled: list[bytes] = []

    async def handler(m: Message) -> None:
        if int(m.data) % 2:
            try:
                await forever.wait()
            except asyncio.CancelledError:
                cancelled.append(m.data)
                raise

    reports = Reports()
    dispatcher = reports.dispatcher(handler)
    dispatcher.start([message(n) for n in range(20)])
    await asyncio.sleep(0)
    reports.stopping = True  # as the receiver's stop sets before its drain
    await dispatcher.drain(0.05)
    assert sorted(cancelled) == sorted(str(n).encode() for n in range(1, 20, 2))
    assert reports.errors == []
    assert sorted(reports.returned) == sorted(str(n).encode() for n in range(0, 20, 2))
    assert dispatcher.running == 0
    dispatcher.close()
    dispatcher.start([message(99)])  # after close: never starts
    await asyncio.sleep(0)
    assert dispatcher.running == 0

"""Ending the gateway's background tasks within a bound.

A cancellation that lands inside a Redis call can be swallowed there: on
Python 3.11 redis-py sends each command under ``asyncio.wait_for``, which
returns the result of a send that finished as the cancellation came and drops
the cancellation. A loop that then goes on to its next sleep runs for ever, and
whoever awaits it after cancelling it waits for ever (a gateway's ``stop()``
hung so on a lease table's task). So the gateway's loops check
``raise_if_cancelled()`` on every round, and their owners end them with
:func:`end_task`, which cancels again while the task runs on and gives up on
it after a bound.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["TASK_END_TIMEOUT", "end_task"]

log = logging.getLogger("streamsub.gateway")

TASK_END_TIMEOUT = 5.0
"""Seconds a cancelled background task has to end before its owner goes on
without it (each Redis call it may be in is bounded by the socket timeout, but
a stop must not wait for several)."""
_CANCEL_AGAIN_EVERY = 0.1
"""A task still running this long after a cancellation is cancelled again (at
its next await, if the last one was swallowed)."""


async def end_task(task: asyncio.Task[Any], what: str, timeout: float = TASK_END_TIMEOUT) -> None:
    """Cancel ``task`` and wait until it ends, at most ``timeout`` seconds.

    A task that ends with an error other than the cancellation has it logged,
    not raised: its owner is closing and goes on closing the rest."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.error(
                "streamsub gateway: %s did not end within %g s of being cancelled; "
                "going on without it",
                what,
                timeout,
            )
            return
        task.cancel()
        await asyncio.wait({task}, timeout=min(remaining, _CANCEL_AGAIN_EVERY))
    if not task.cancelled() and task.exception() is not None:
        log.error("streamsub gateway: %s failed", what, exc_info=task.exception())

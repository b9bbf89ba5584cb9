"""Keeping the receiver's tasks alive: back off while Redis fails, restart a
task that broke, and stop for good on an error no retry can mend."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .._cancel import raise_if_cancelled
from .._errors import NotFoundError

__all__ = ["Backoff", "raise_if_cancelled", "supervise"]

log = logging.getLogger("streamsub")

ERROR_BACKOFF = (0.05, 2.0)
"""Retry a failed Redis call after 50 ms, doubling up to 2 s."""


class Backoff:
    """Waits between retries of a failing Redis call, and says so in the log."""

    def __init__(self) -> None:
        self._delay = 0.0

    def reset(self) -> None:
        if self._delay:
            log.warning("streamsub: Redis answers again")
        self._delay = 0.0

    async def wait(self, what: str, exc: BaseException) -> None:
        raise_if_cancelled()
        low, high = ERROR_BACKOFF
        self._delay = min(high, self._delay * 2 or low)
        log.warning("streamsub: %s failed (%s); retrying in %.2f s", what, exc, self._delay)
        await asyncio.sleep(self._delay)


async def supervise(
    what: str,
    run: Callable[[], Coroutine[Any, Any, None]],
    *,
    fatal: Callable[[NotFoundError], None],
) -> None:
    """Run ``run`` until it returns. A :class:`NotFoundError` (the subscription or
    topic is gone) goes to ``fatal`` and ends the task; any other error is logged
    and the task restarted after a pause."""
    while True:
        try:
            await run()
        except NotFoundError as exc:
            fatal(exc)
            return
        except Exception:
            raise_if_cancelled()
            log.exception("streamsub: %s failed; restarting it", what)
            await asyncio.sleep(ERROR_BACKOFF[1])
        else:
            return

"""Cancellation that a library call may have swallowed."""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancelled"]


def raise_if_cancelled() -> None:
    """Raise CancelledError if the running task was asked to stop.

    A cancellation that lands inside a Redis call can come out of it as a
    connection error (redis-py closes the connection), or not at all: on
    Python 3.11 ``asyncio.wait_for``, under which redis-py sends every command
    when the connection has a socket timeout, returns the result of a send
    that finished as the cancel came and drops the cancel (CPython gh-86296,
    fixed in 3.12). A loop that retries on errors, or goes on after a send,
    would then run for ever. Every such loop calls this before it goes on.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError

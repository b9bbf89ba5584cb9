"""Every conformance check of ``streamsub.testing`` against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import streamsub
import streamsub.testing
from streamsub.testing import CONFORMANCE_CHECKS, RedisServer


@pytest.fixture(params=["redis"])
async def backend_client(
    request: pytest.FixtureRequest, server: RedisServer
) -> AsyncIterator[streamsub.Client]:
    """A client on each backend in turn (a cluster backend adds "redis-cluster")."""
    urls = {"redis": server.url}
    async with streamsub.connect(urls[request.param]) as connected:
        yield connected


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda check: check.__name__)
async def test_conformance(
    backend_client: streamsub.Client, check: Callable[[streamsub.Client], Awaitable[None]]
) -> None:
    """Every backend passes every conformance check."""
    await check(backend_client)


def test_every_check_is_listed() -> None:
    """CONFORMANCE_CHECKS holds every check_* function that streamsub.testing exports."""
    exported = {name for name in streamsub.testing.__all__ if name.startswith("check_")}
    assert {check.__name__ for check in CONFORMANCE_CHECKS} == exported
    assert len(CONFORMANCE_CHECKS) == len(set(CONFORMANCE_CHECKS))


def test_testing_all_is_sorted() -> None:
    """streamsub.testing's __all__ is sorted and names only what the module has."""
    names = streamsub.testing.__all__
    assert names == sorted(names)
    assert all(hasattr(streamsub.testing, name) for name in names)

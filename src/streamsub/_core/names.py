"""Names of topics and subscriptions, checked before anything is written.

The rules are Pub/Sub's, so a name valid there is valid here: 3 to 255
characters, starting with a letter, then letters, digits and ``-_.~+%``. None of
those can break the Redis key layout (no ``{``, ``}`` or ``:``).
"""

from __future__ import annotations

import re

from .._errors import InvalidArgumentError, InvalidTypeError

__all__ = ["check_name"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid ``kind`` name, else raise saying why."""
    if not isinstance(name, str):
        raise InvalidTypeError(f"{kind} name must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError(f"{kind} name must not be empty")
    if _NAME.fullmatch(name) is None:
        raise InvalidArgumentError(
            f"invalid {kind} name {name!r}: use 3 to 255 characters, start with a letter, "
            "then letters, digits or any of - _ . ~ + %"
        )
    if name.startswith("goog"):
        raise InvalidArgumentError(f"invalid {kind} name {name!r}: it must not start with 'goog'")
    return name

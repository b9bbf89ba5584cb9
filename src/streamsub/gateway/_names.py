"""Pub/Sub resource names to streamsub names and back.

``projects/P/topics/T`` becomes the streamsub topic ``P~T`` (likewise
subscriptions), so several projects live side by side on one Redis. The map is
reversible because a project id never holds ``~`` (it is 1 to 63 letters,
digits, ``-``, ``_`` or ``.``, starting with a letter) while a streamsub name
never holds ``/``: the first ``~`` splits the two. Pub/Sub's own rules for ids
(3 to 255 characters, starting with a letter, letters, digits and ``-_.~+%``, not
starting with ``goog``) are streamsub's name rules, so an id is checked by
checking the whole streamsub name, whose length (project + 1 + id) must also
stay within 255.
"""

from __future__ import annotations

import re
from typing import Literal

from .._core.names import check_name
from .._errors import InvalidArgumentError

__all__ = ["Kind", "from_native", "project_prefix", "to_native"]

Kind = Literal["topics", "subscriptions", "snapshots"]

_PROJECT = re.compile(r"[A-Za-z][A-Za-z0-9\-_.]{0,62}")
_SEPARATOR = "~"


def to_native(resource: str, kind: Kind) -> str:
    """The streamsub name of ``projects/P/<kind>/ID``; raise InvalidArgumentError
    with Pub/Sub's wording when the name is malformed."""
    parts = resource.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != kind:
        raise InvalidArgumentError(
            f"Invalid resource name given (name={resource}). Refer to "
            f"https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names for more "
            f"information; expected projects/PROJECT/{kind}/ID."
        )
    project, ident = parts[1], parts[3]
    if _PROJECT.fullmatch(project) is None:
        raise InvalidArgumentError(
            f"Invalid project in resource name (name={resource}): use a project id of 1 to 63 "
            "letters, digits, '-', '_' or '.', starting with a letter."
        )
    if ident.startswith("goog"):
        raise InvalidArgumentError(
            f"Invalid resource name given (name={resource}): an id must not start with 'goog'."
        )
    native = f"{project}{_SEPARATOR}{ident}"
    try:
        check_name(kind[:-1], native)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"Invalid resource name given (name={resource}): the id must be 3 to 255 letters, "
            "digits or - _ . ~ + %, start with a letter, and project + '~' + id must not "
            f"exceed 255 characters ({exc})."
        ) from None
    if len(ident) < 3 or not ident[0].isalpha():
        raise InvalidArgumentError(
            f"Invalid resource name given (name={resource}): the id must be at least 3 "
            "characters and start with a letter."
        )
    return native


def from_native(native: str, kind: Kind) -> str | None:
    """``projects/P/<kind>/ID`` for a streamsub name made by :func:`to_native`;
    None for names that were not (native topics without a project)."""
    project, separator, ident = native.partition(_SEPARATOR)
    if not separator or _PROJECT.fullmatch(project) is None or not ident:
        return None
    return f"projects/{project}/{kind}/{ident}"


def project_prefix(project_resource: str) -> str:
    """The streamsub name prefix of every resource of ``projects/P``."""
    parts = project_resource.split("/")
    if len(parts) != 2 or parts[0] != "projects" or _PROJECT.fullmatch(parts[1]) is None:
        raise InvalidArgumentError(
            f"Invalid project given (project={project_resource}); expected projects/PROJECT."
        )
    return parts[1] + _SEPARATOR

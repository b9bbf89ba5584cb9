"""The public surface: one sorted ``__all__`` and the error tree its docstring draws."""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import re

import pytest

import streamsub
from streamsub import _errors

_ALSO = re.compile(r"\(also (?P<builtin>\w+)\)")


def drawn_tree() -> list[tuple[str, str | None, str | None]]:
    """(class, parent, builtin it is also) for each line of the tree in _errors' docstring."""
    doc = _errors.__doc__ or ""
    block = doc.split("::", 1)[1].strip("\n").split("\n\n", 1)[0]
    rows: list[tuple[str, str | None, str | None]] = []
    stack: list[tuple[int, str]] = []
    root_column: int | None = None
    for line in block.splitlines():
        match = re.search(r"\w+", line)
        assert match, f"unreadable tree line: {line!r}"
        if root_column is None:
            root_column = match.start()
        depth = (match.start() - root_column) // 4  # each level is drawn four columns in
        while stack and stack[-1][0] >= depth:
            stack.pop()
        also = _ALSO.search(line)
        rows.append((match[0], stack[-1][1] if stack else None, also["builtin"] if also else None))
        stack.append((depth, match[0]))
    return rows


def test_all_is_sorted() -> None:
    """streamsub.__all__ is kept sorted, so a diff shows what was added."""
    assert streamsub.__all__ == sorted(streamsub.__all__)


def test_all_has_no_duplicates() -> None:
    """Every public name is listed once."""
    assert len(streamsub.__all__) == len(set(streamsub.__all__))


@pytest.mark.parametrize("name", streamsub.__all__)
def test_every_name_in_all_exists(name: str) -> None:
    """Every name in streamsub.__all__ can be imported from streamsub."""
    assert hasattr(streamsub, name)


def test_public_objects_are_not_named_private() -> None:
    """No public name but __version__ starts with an underscore."""
    assert [name for name in streamsub.__all__ if name.startswith("_")] == ["__version__"]


def test_version_is_a_string() -> None:
    """streamsub.__version__ is the package version string."""
    assert isinstance(streamsub.__version__, str)
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", streamsub.__version__)


@pytest.mark.parametrize("name", _errors.__all__)
def test_every_error_is_public(name: str) -> None:
    """Every error class is exported from streamsub itself."""
    assert name in streamsub.__all__
    assert getattr(streamsub, name) is getattr(_errors, name)


def test_error_tree_is_drawn_in_full() -> None:
    """The tree in _errors' docstring names every public exception class, once."""
    drawn = [name for name, _, _ in drawn_tree()]
    exceptions = [
        name
        for name in _errors.__all__
        if isinstance(getattr(_errors, name), type)
        and issubclass(getattr(_errors, name), BaseException)
    ]
    assert len(drawn) == len(set(drawn))
    assert sorted(drawn) == sorted(exceptions)


def test_error_tree_matches_the_classes() -> None:
    """Each class derives from the parent drawn above it and from the builtin it names."""
    rows = drawn_tree()
    assert rows[0] == ("StreamsubError", None, None)
    for name, parent, builtin in rows:
        cls = getattr(streamsub, name)
        if parent is not None:
            assert issubclass(cls, getattr(streamsub, parent)), f"{name} is not a {parent}"
        if builtin is not None:
            assert issubclass(cls, getattr(builtins, builtin)), f"{name} is not a {builtin}"


def test_error_tree_has_no_undrawn_relations() -> None:
    """A class is a subclass of another streamsub error only where the tree draws it."""
    rows = drawn_tree()
    parents = {name: parent for name, parent, _ in rows}

    def ancestors(name: str) -> set[str]:
        found = set()
        parent = parents[name]
        while parent is not None:
            found.add(parent)
            parent = parents[parent]
        return found

    for name, _, _ in rows:
        for other, _, _ in rows:
            if other == name:
                continue
            related = issubclass(getattr(streamsub, name), getattr(streamsub, other))
            assert related == (other in ancestors(name)), f"{name} vs {other}"


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (streamsub.StreamsubError, (Exception,)),
        (streamsub.InvalidArgumentError, (streamsub.StreamsubError, ValueError)),
        (streamsub.InvalidTypeError, (streamsub.InvalidArgumentError, TypeError)),
        (streamsub.MessageTooLargeError, (streamsub.InvalidArgumentError,)),
        (streamsub.NotFoundError, (streamsub.StreamsubError, LookupError)),
        (streamsub.TopicNotFoundError, (streamsub.NotFoundError,)),
        (streamsub.SubscriptionNotFoundError, (streamsub.NotFoundError,)),
        (streamsub.AlreadyExistsError, (streamsub.StreamsubError,)),
        (streamsub.FailedPreconditionError, (streamsub.StreamsubError,)),
        (streamsub.ClosedError, (streamsub.StreamsubError,)),
        (streamsub.AckError, (streamsub.StreamsubError,)),
        (streamsub.BackendError, (streamsub.StreamsubError,)),
        (streamsub.UnavailableError, (streamsub.BackendError,)),
        (streamsub.AuthenticationError, (streamsub.UnavailableError,)),
        (streamsub.CertificateError, (streamsub.UnavailableError,)),
    ],
)
def test_error_classes_derive_from_the_drawn_bases(
    cls: type[Exception], bases: tuple[type[Exception], ...]
) -> None:
    """Each public error class has exactly the direct bases the tree draws for it."""
    assert cls.__bases__ == bases


def test_bad_input_you_closed_it_and_the_world_broke_it_are_distinct() -> None:
    """Bad input, closed and backend failures are separate branches a caller can tell apart."""
    branches = [streamsub.InvalidArgumentError, streamsub.ClosedError, streamsub.BackendError]
    for a in branches:
        for b in branches:
            assert issubclass(a, b) == (a is b)


def test_ack_error_carries_its_status() -> None:
    """AckError keeps the AckStatus that says why the ack did not take."""
    error = streamsub.AckError("lease lost", status=streamsub.AckStatus.INVALID_ACK_ID)
    assert error.status is streamsub.AckStatus.INVALID_ACK_ID
    assert str(error) == "lease lost"


def test_default_consumer_names_are_host_pid_and_a_counter() -> None:
    """Default consumer names are ``host-pid-n``: no random part, unique per subscriber."""
    import os
    import socket

    from streamsub._client import _default_consumer

    first, second = _default_consumer(), _default_consumer()
    prefix = f"{socket.gethostname()}-{os.getpid()}-"
    assert first.startswith(prefix)
    assert second.startswith(prefix)
    assert int(second.removeprefix(prefix)) == int(first.removeprefix(prefix)) + 1


def test_blocking_module_all_is_sorted_and_exists() -> None:
    """streamsub.blocking is a public module of its own with a sorted __all__."""
    import streamsub.blocking

    assert streamsub.blocking.__all__ == sorted(streamsub.blocking.__all__)
    assert all(hasattr(streamsub.blocking, name) for name in streamsub.blocking.__all__)


_NOT_BLOCKING = {"aclose", "run_retention"}
"""Async methods without a blocking twin: close() is aclose's, and run_retention
runs for ever (use ``streamsub retention run``)."""


def test_blocking_client_mirrors_every_async_method_with_the_same_signature() -> None:
    """Each public method of streamsub.Client has a blocking twin taking the same
    parameters, kinds and defaults (subscribe's handler is Pub/Sub's callback),
    and connect() takes the settings of streamsub.connect()."""
    import inspect

    import streamsub.blocking

    def parameters(function: object, rename: dict[str, str]) -> list[tuple[str, object, object]]:
        signature = inspect.signature(function)  # type: ignore[arg-type]
        return [
            (rename.get(p.name, p.name), p.kind, p.default) for p in signature.parameters.values()
        ]

    names = {
        name
        for name, value in vars(streamsub.Client).items()
        if not name.startswith("_") and callable(value)
    } - _NOT_BLOCKING
    assert names, "no public methods found"
    for name in sorted(names):
        twin = getattr(streamsub.blocking.Client, name, None)
        assert twin is not None, f"streamsub.blocking.Client has no {name}()"
        assert parameters(twin, {}) == parameters(
            getattr(streamsub.Client, name), {"handler": "callback"}
        ), name
        assert twin.__doc__, f"blocking {name}() has no docstring"
    assert isinstance(vars(streamsub.blocking.Client)["url"], property)
    assert parameters(streamsub.blocking.connect, {}) == parameters(streamsub.connect, {})


def test_outgoing_message_is_a_frozen_keyword_only_value() -> None:
    """OutgoingMessage's own __init__ (faster than the dataclass's) keeps what
    the frozen dataclass promised: keywords only, defaults, equality and hash
    by value, no assignment, dataclasses.replace."""
    message = streamsub.OutgoingMessage(data=b"x", ordering_key="k")
    assert (message.data, message.ordering_key, message.attributes) == (b"x", "k", None)
    twin = streamsub.OutgoingMessage(data=b"x", ordering_key="k")
    assert message == twin
    assert hash(message) == hash(twin)
    assert message != streamsub.OutgoingMessage(data=b"x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.data = b"y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        streamsub.OutgoingMessage(b"x")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        streamsub.OutgoingMessage()  # type: ignore[call-arg]
    changed = dataclasses.replace(message, attributes={"a": "1"})
    assert (changed.data, changed.ordering_key, changed.attributes) == (b"x", "k", {"a": "1"})
    assert not hasattr(message, "__dict__")
    # A field added to the dataclass must be added to the hand-written __init__ too.
    fields = {field.name for field in dataclasses.fields(streamsub.OutgoingMessage)}
    assert set(inspect.signature(streamsub.OutgoingMessage).parameters) == fields

"""Names of topics and subscriptions: Pub/Sub's rules, safe for the Redis key layout."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from streamsub._core.names import check_name
from streamsub._errors import InvalidArgumentError, InvalidTypeError

_ALLOWED_REST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+%"


@pytest.mark.parametrize(
    "name",
    [
        "abc",
        "orders",
        "Orders-2024_v1.0~beta+x%20",
        "a" * 255,
        "z" + "9" * 254,
        "A--",
        "goo",
        "gooogle",
    ],
)
def test_valid_names_are_returned_unchanged(name: str) -> None:
    """A valid name is returned as given."""
    assert check_name("topic", name) is name


@given(
    st.text(alphabet=_ALLOWED_REST[:52], min_size=1, max_size=1),
    st.text(alphabet=_ALLOWED_REST, min_size=2, max_size=254),
)
def test_every_name_of_allowed_characters_is_valid(first: str, rest: str) -> None:
    """Any name of 3-255 allowed characters starting with a letter passes (unless 'goog...')."""
    name = first + rest
    assume(not name.startswith("goog"))
    assert check_name("subscription", name) == name


def test_empty_name_is_refused() -> None:
    """An empty name is refused with a message saying it must not be empty."""
    with pytest.raises(InvalidArgumentError, match="topic name must not be empty"):
        check_name("topic", "")


@pytest.mark.parametrize("name", ["a", "ab"])
def test_names_shorter_than_three_are_refused(name: str) -> None:
    """A name under three characters is refused, stating the allowed length."""
    with pytest.raises(InvalidArgumentError, match="use 3 to 255 characters"):
        check_name("topic", name)


def test_names_longer_than_255_are_refused() -> None:
    """A name over 255 characters is refused, stating the allowed length."""
    with pytest.raises(InvalidArgumentError, match="use 3 to 255 characters"):
        check_name("topic", "a" * 256)


@pytest.mark.parametrize("name", ["1abc", "-abc", "_abc", ".abc", "%abc", "~abc", "+abc"])
def test_names_must_start_with_a_letter(name: str) -> None:
    """A name starting with anything but an ASCII letter is refused."""
    with pytest.raises(InvalidArgumentError, match="start with a letter"):
        check_name("subscription", name)


@pytest.mark.parametrize(
    "name",
    [
        "ab{c}",  # a Redis Cluster hash tag
        "abc}",
        "ab{c",
        "ab:c",  # the key separator
        "ab c",
        "abc ",
        "abc\n",  # a regex `$` would let a trailing newline through
        "ab/c",
        "ab*c",
        "ab\u00e9",  # only ASCII letters
        "\u00e9abc",
        "ab\x00c",
        "ab\ud800",
    ],
)
def test_names_with_bad_characters_are_refused(name: str) -> None:
    """A name with a character outside letters, digits and -_.~+% is refused, quoting it."""
    with pytest.raises(InvalidArgumentError, match=r"invalid topic name .*then letters, digits"):
        check_name("topic", name)


@pytest.mark.parametrize("name", [None, b"orders", 123, ["orders"]])
def test_non_str_names_are_refused_with_a_type_error(name: object) -> None:
    """A name that is not a str raises InvalidTypeError naming the type."""
    with pytest.raises(
        InvalidTypeError, match=f"topic name must be a str, got {type(name).__name__}"
    ):
        check_name("topic", name)


@pytest.mark.parametrize("name", ["goog", "google-events", "googXYZ"])
def test_names_starting_with_goog_are_refused(name: str) -> None:
    """A name starting with 'goog' is refused, as Pub/Sub reserves it."""
    with pytest.raises(InvalidArgumentError, match="must not start with 'goog'"):
        check_name("topic", name)


def test_the_kind_appears_in_the_message() -> None:
    """The error names the kind of thing whose name is wrong."""
    with pytest.raises(InvalidArgumentError, match=r"^invalid subscription name 'a:b'"):
        check_name("subscription", "a:b")

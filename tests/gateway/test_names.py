"""The map between Pub/Sub resource names and streamsub names (no server)."""

from __future__ import annotations

import pytest

from streamsub import InvalidArgumentError
from streamsub.gateway._names import from_native, project_prefix, to_native


@pytest.mark.parametrize(
    ("resource", "native"),
    [
        ("projects/my-project/topics/orders", "my-project~orders"),
        ("projects/p.example/topics/a~b~c", "p.example~a~b~c"),
        ("projects/p_1/topics/Zz9-_.~+%", "p_1~Zz9-_.~+%"),
    ],
)
def test_names_map_both_ways(resource: str, native: str) -> None:
    """A resource name maps to one streamsub name and back, even with '~' in the id."""
    assert to_native(resource, "topics") == native
    assert from_native(native, "topics") == resource
    assert to_native(resource.replace("topics", "subscriptions"), "subscriptions") == native


@pytest.mark.parametrize(
    "resource",
    [
        "projects/p/topics/ab",  # too short
        "projects/p/topics/1abc",  # starts with a digit
        "projects/p/topics/goog-topic",  # reserved
        "projects/p/topics/a b c",  # bad character
        "projects/9p/topics/orders",  # project starts with a digit
        "projects/p~q/topics/orders",  # '~' would make the map ambiguous
        "projects/p/subscriptions/orders",  # wrong kind
        "projects/p/topics/" + "x" * 254,  # project + '~' + id over 255
        "topics/orders",
    ],
)
def test_malformed_names_are_refused(resource: str) -> None:
    """Names Pub/Sub refuses, or that would not map back, are invalid arguments."""
    with pytest.raises(InvalidArgumentError):
        to_native(resource, "topics")


def test_native_names_without_a_project_are_not_shown() -> None:
    """A topic made with the native API has no Pub/Sub name."""
    assert from_native("orders", "topics") is None
    assert project_prefix("projects/abc") == "abc~"
    with pytest.raises(InvalidArgumentError):
        project_prefix("projects/a/b")

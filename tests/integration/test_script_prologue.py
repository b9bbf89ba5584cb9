"""The prologue every Lua script starts with (``_undeclared_keys.lua``): keys
passed undeclared after the router's marker make KEYS whole again, and a
script called the usual way sees KEYS and ARGV as sent."""

from __future__ import annotations

from importlib import resources

import pytest
import redis

from streamsub._backends.redis import _backend
from streamsub._backends.redis._routing import UNDECLARED

pytestmark = pytest.mark.standalone  # one node: keys of any slot in one call

PROLOGUE = (
    resources.files(_backend.__package__).joinpath("scripts", "_undeclared_keys.lua").read_text()
)
ECHO = PROLOGUE + "return {KEYS, ARGV}"


def test_every_script_starts_with_the_prologue() -> None:
    """Each script's source begins with the prologue, before its helpers."""
    assert _backend._script("reclaim.lua", "_ids.lua").startswith(PROLOGUE)
    assert _backend._script("ack.lua").startswith(PROLOGUE)


def test_keys_passed_undeclared_are_keys_again(redis_client: redis.Redis) -> None:
    """With the marker, KEYS is every key in its order (declared ones dropped
    in favour of the full list) and ARGV is the script's own arguments."""
    reply = redis_client.eval(ECHO, 1, "s", UNDECLARED, 3, "s", "d", "t", "group", "1-0 2-0")
    assert reply == [[b"s", b"d", b"t"], [b"group", b"1-0 2-0"]]
    reply = redis_client.eval(ECHO, 0, UNDECLARED, 2, "d", "t")
    assert reply == [[b"d", b"t"], []]


def test_a_script_called_the_usual_way_sees_what_was_sent(redis_client: redis.Redis) -> None:
    """Without the marker, KEYS and ARGV are as sent, a marker-like argument later
    in ARGV included."""
    reply = redis_client.eval(ECHO, 2, "s", "d", "group", UNDECLARED, "x")
    assert reply == [[b"s", b"d"], [b"group", UNDECLARED.encode(), b"x"]]

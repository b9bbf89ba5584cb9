"""The publisher's token of a single publish, built without a named tuple's
``__new__`` (on every publish): the same token as the named tuple makes."""

from __future__ import annotations

import asyncio

from streamsub._engine.publisher import _lone_token, _Token


def test_a_single_publishs_token_is_the_named_tuple_of_its_fields() -> None:
    """Every field of _Token, in order, and nothing left to a default: a field
    added to _Token without adding it here fails this test."""
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[str] = loop.create_future()
        token = _lone_token((future, 0, None, 100, 1, True))
        assert type(token) is _Token
        assert token == _Token(future, 0, None, 100, length=1, data=True)
        assert len(token) == len(_Token._fields)
        assert (token.waiter, token.key, token.size, token.length, token.data) == (
            future,
            None,
            100,
            1,
            True,
        )
        plain = _lone_token((future, 0, "k", 7, 1, False))
        assert plain == _Token(future, 0, "k", 7)  # the defaults: one message, encoded
    finally:
        loop.close()

"""The in-order connection packs its commands itself: byte for byte what redis-py sends."""

from __future__ import annotations

import redis.asyncio.connection as aioconnection

from streamsub._backends.redis._in_order import pack_commands


def test_packing_matches_redis_py_byte_for_byte() -> None:
    """Commands of bytes, str (non-ASCII included), int (0 and negative), empty
    and large arguments, several at once: the same bytes as redis-py's packer;
    an argument past its 6,000-byte cutoff is, as there, a buffer of its own
    (not copied)."""
    connection = aioconnection.Connection()
    blob = bytes(range(256)) * 40
    commands = [
        ("EVAL", b"return 1", 1, "ss:{orders.3}", blob),
        ("EVAL", b"return 2", 2, "k\u00e9y", "link", b"", 0, -17, "", "chan:wake"),
        ("WAIT", 1, 5000),
        ("XADD", "s", "*", "d", "\u65e5\u672c"),
    ]
    packed = pack_commands(connection, commands)
    assert b"".join(packed) == b"".join(connection.pack_commands(commands))
    assert any(part is blob for part in packed), "the large argument was copied"


def test_other_argument_types_are_left_to_redis_py() -> None:
    """A float (no append sends one) is packed by redis-py, as it would be."""
    connection = aioconnection.Connection()
    commands = [("SET", "k", 1.5), ("GET", "k")]
    assert b"".join(pack_commands(connection, commands)) == b"".join(
        connection.pack_commands(commands)
    )

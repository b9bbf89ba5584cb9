"""The least-privilege Redis ACL rule for a user that runs streamsub.

README's Security section quotes :data:`ACL_RULE`, and a test runs publish,
subscribe, dead letters and admin as a user holding exactly this rule, so the
two cannot drift. Keys are limited to ``ss:*``; commands to the data types
streamsub stores (streams, hashes, sets, sorted sets: the Lua scripts' commands
are checked too; GET and SET for the publishers' links, SCAN to find them when a
topic is deleted), the scripts' own commands, and a few for connecting: on
Redis Cluster also CLUSTER SLOTS and COMMAND (redis-py's cluster client learns
the slots' nodes and the commands' keys with them), ASKING (a write into a
migrating slot), and CLUSTER NODES and READONLY (records read from a replica
while its master is down). No dangerous commands (FLUSHALL, CONFIG, KEYS, DEBUG, ...), no
pub/sub channels.
"""

from __future__ import annotations

__all__ = ["ACL_RULE"]

ACL_RULE = (
    "resetkeys ~ss:* resetchannels -@all "
    "+@stream +@hash +@set +@sortedset "
    "+exists +del +time +get +set +scan "
    "+eval +evalsha +script|load "
    "+ping +select +hello +info +memory|usage +cluster|slots +command +asking "
    "+cluster|nodes +readonly"
)
"""ACL SETUSER rules, after ``on >password``: what a streamsub client needs on Redis 6.2+
(on every node of a cluster)."""

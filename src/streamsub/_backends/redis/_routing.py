"""Commands sent to the cluster node that serves their key, following MOVED and
ASK on one connection of the node they are redirected to.

redis-py's asyncio ``RedisCluster`` follows redirections itself, with two traps
(checked in 5.0.1 and 7.x, ``_execute_command``): on ``ASK`` it sends
``ASKING`` and then the command as two calls, each taking a connection of the
node's pool, so when more than one is free they go out on different
connections, the importing node redirects the command again, and after its
redirect budget the call fails "TTL exhausted", for as long as the slot
migrates; and it rebuilds its view of the cluster every ``reinitialize_steps``
``MOVED`` replies by closing every node's connections, cutting calls in flight
on nodes that did not move. Its pipelines send each redirected command alone
through that same path.

So :class:`SlotRouter` sends each node's commands in one write on one
connection of that node (redis-py's ``execute_pipeline``, so the node's gate of
``_node_gates`` still caps its connections) and reads the replies itself: a
command answered ``MOVED`` goes to the new owner, whose slot is patched into
redis-py's map (no rebuild); one answered ``ASK`` goes to the importing node
behind ``ASKING`` in the same write, so both ride one connection; ``TRYAGAIN``
(a step on several keys, on the importing node, while some of them are not
there) is sent there again after a pause, until the slot is handed over.
Redis cannot tell a key still to come from one that does not exist, and under
traffic a step names such keys all the time (a partition's delay set before
any delayed nack, its delivery-time records before any redelivery): so a
script answered ``TRYAGAIN`` by the importing node is checked, key by key, on
the source (``EXISTS``: there, or an ``ASK`` if not) and then on the importing
node (behind ``ASKING``), in that order, because a key leaves the source only
after it is on the importing node and no new key is made on the source while
the slot migrates. If every key it lacks is on neither node, the script goes
there again at once declaring only the keys that exist, the others passed
after :data:`UNDECLARED` in ARGV (every script's prologue,
``_undeclared_keys.lua``, makes KEYS whole again): a command on one key that is
not there runs on the importing node behind ``ASKING``, from a script too (it
inherits the flag), where a step naming keys some of which are missing does
not. A key still on the source is waited for (Redis 7+ and Valkey answer
``TRYAGAIN`` on the source itself to a step some of whose keys are there; 6.2
sends it on with ``ASK``, and the check above holds it): the step is sent again after a
pause, and fails with :class:`SlotMigratingError` if the keys take longer than
the pauses to move. A command is redirected at most
:data:`MAX_REDIRECTS` times (:class:`SlotMigratingError` past that) and sent
again at most once after its connection broke (the standalone backend's rule:
once more on a fresh connection after a reset), unless the caller says not
to. Every other reply, an error reply included, is the command's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rexc
from redis.asyncio.cluster import PipelineCommand, RedisCluster

from ._slots import key_slot

__all__ = ["MAX_REDIRECTS", "TRY_AGAIN_PAUSES", "UNDECLARED", "SlotMigratingError", "SlotRouter"]

MAX_REDIRECTS = 5
"""How often one command may be redirected (MOVED/ASK) before it fails."""
TRY_AGAIN_PAUSES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
"""Seconds before each new try of a command answered ``TRYAGAIN`` (2.6 s in
all, under the socket timeout: a resharding tool moves a slot's keys in
batches of milliseconds, then hands the slot over at once)."""
UNDECLARED = "\0streamsub-undeclared-keys\0"
"""First ARGV of a script sent with keys undeclared; then the number of keys
and all of them in order, then the script's ARGV (``_undeclared_keys.lua``).
Its NUL bytes keep it apart from any name streamsub accepts."""
_SCRIPTS = frozenset({"EVAL", "EVALSHA"})


class SlotMigratingError(rexc.RedisError):
    """A command was redirected :data:`MAX_REDIRECTS` times (its slot keeps
    moving, or the nodes disagree about it for now), or answered ``TRYAGAIN``
    after every pause of :data:`TRY_AGAIN_PAUSES`."""

    def __init__(self, slot: int, message: str) -> None:
        super().__init__(message)
        self.slot = slot


class SlotRouter:
    """Runs commands on the masters of their keys' slots for ``client``."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client

    async def run(
        self, calls: Sequence[tuple[str, tuple[Any, ...]]], *, resend: bool = True
    ) -> list[Any]:
        """Each (key, command)'s reply, the commands of each node in one write,
        the nodes in parallel; an error reply (or a lost connection, or
        :class:`SlotMigratingError`) is the exception, in its place. With
        ``resend=False`` a command whose connection broke is not sent again:
        the server may have run it, and the caller must learn that (an ordered
        subscription's read takes back what such a read left pending)."""
        await self._client.initialize()  # at once unless a refresh is due
        slots = [key_slot(key) for key, _ in calls]
        commands = [command for _, command in calls]
        replies: list[Any] = [None] * len(calls)
        redirects = [0] * len(calls)
        tries = [0] * len(calls)
        resent = [False] * len(calls)
        # Per command still to send: the node a redirect names (None: the
        # slot's master in the map), and whether ASKING goes first.
        todo: dict[int, tuple[str | None, bool]] = dict.fromkeys(range(len(calls)), (None, False))
        while todo:
            by_node: dict[str, tuple[Any, list[tuple[int, bool]]]] = {}
            for i, (target, asking) in todo.items():
                node = await self._node(slots[i], target)
                by_node.setdefault(node.name, (node, []))[1].append((i, asking))
            sends = [self._send(node, items, commands) for node, items in by_node.values()]
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            todo, refresh = {}, False
            waits: dict[int, float] = {}  # answered TRYAGAIN: call -> its pause
            importing: dict[int, str] = {}  # of those, the ones an importing node answered
            for name, (_, items), outcome in zip(by_node, by_node.values(), outcomes, strict=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome
                results = [outcome] * len(items) if isinstance(outcome, Exception) else outcome
                for (i, asking), result in zip(items, results, strict=True):
                    if not isinstance(result, rexc.TryAgainError):
                        # Keys left undeclared hold for the node checked only.
                        commands[i] = calls[i][1]
                    if isinstance(result, rexc.MovedError):  # (an AskError too)
                        self._moved(result)
                        redirects[i] += 1
                        todo[i] = (None, False)
                    elif isinstance(result, rexc.AskError):
                        redirects[i] += 1
                        todo[i] = (f"{result.host}:{result.port}", True)
                    elif isinstance(result, rexc.TryAgainError):
                        if tries[i] == len(TRY_AGAIN_PAUSES):
                            replies[i] = SlotMigratingError(
                                slots[i],
                                f"a step on several keys of slot {slots[i]} was answered "
                                f"TRYAGAIN {tries[i]} times: some of its keys are not on "
                                "the node the slot migrates to (moved yet, or not existing)",
                            )
                            continue
                        waits[i] = TRY_AGAIN_PAUSES[tries[i]]
                        tries[i] += 1
                        if asking:
                            importing[i] = name
                        # The same node again: the importing one (behind ASKING),
                        # which runs it once the keys are there or the slot is its.
                        todo[i] = (name if asking else None, asking)
                    elif (
                        isinstance(result, rexc.ConnectionError)
                        and not isinstance(result, rexc.AuthenticationError)
                        and resend
                        and not resent[i]
                    ):
                        resent[i] = refresh = True
                        todo[i] = (None, False)
                    else:
                        replies[i] = result
                        continue
                    if redirects[i] > MAX_REDIRECTS:
                        del todo[i]
                        replies[i] = SlotMigratingError(
                            slots[i],
                            f"slot {slots[i]} was redirected {MAX_REDIRECTS} times (last: "
                            f"{type(result).__name__} {result})",
                        )
            if importing:
                checked = await asyncio.gather(
                    *(self.undeclared(slots[i], at, calls[i][1]) for i, at in importing.items())
                )
                for i, command in zip(importing, checked, strict=True):
                    if command is not None:  # sent again at once: it can run now
                        commands[i] = command
                        del waits[i]
            if refresh:  # the node may be gone, or a replica now
                await self._client.nodes_manager.initialize()
            if waits:
                await asyncio.sleep(max(waits.values()))
        return replies

    async def _node(self, slot: int, name: str | None) -> Any:
        manager: Any = self._client.nodes_manager
        if name is None:
            return manager.get_node_from_slot(slot)
        node = manager.get_node(node_name=name)
        if node is None:  # a node redis-py has not seen yet (say, added since)
            await manager.initialize()
            node = manager.get_node(node_name=name)
        if node is None:
            raise rexc.ConnectionError(f"the cluster has no node {name}")
        return node

    async def undeclared(
        self, slot: int, importing: str, command: tuple[Any, ...]
    ) -> tuple[Any, ...] | None:
        """``command`` (a script that ``importing`` answered ``TRYAGAIN``) with
        the keys that exist on neither the slot's source nor ``importing``
        undeclared; None if it is no script, if a key it lacks may still be on
        the source, or if the nodes do not answer as a migration in progress.
        (Also the cluster appender's, for a publisher's link key.)"""
        if str(command[0]).upper() not in _SCRIPTS:
            return None
        count = int(command[2])
        keys, args = command[3 : 3 + count], command[3 + count :]
        try:
            source = await self._node(slot, None)
            target = await self._node(slot, importing)
            if source.name == target.name:
                return None
            # The source first: a key gone from there is on the importing node
            # already (MIGRATE deletes it once the importing node stored it).
            there = [PipelineCommand(n, "EXISTS", key) for n, key in enumerate(keys)]
            await source.execute_pipeline(there)
            here: list[PipelineCommand] = []
            for key in keys:
                here.append(PipelineCommand(len(here), "ASKING"))
                here.append(PipelineCommand(len(here), "EXISTS", key))
            await target.execute_pipeline(here)
        except Exception:  # no verdict: the step waits, as before
            return None
        existing = []
        for key, on_source, on_target in zip(keys, there, here[1::2], strict=True):
            if on_target.result == 1:
                existing.append(key)
            elif not (
                isinstance(on_source.result, rexc.AskError)
                and f"{on_source.result.host}:{on_source.result.port}" == importing
            ):
                return None  # on the source still (1), or the slot no longer migrates
        if len(existing) == len(keys):
            return None  # all there now: a plain new try runs it
        return (*command[:2], len(existing), *existing, UNDECLARED, count, *keys, *args)

    def _moved(self, exc: rexc.MovedError) -> None:
        """Patch ``exc``'s slot into redis-py's map: its new master."""
        manager: Any = self._client.nodes_manager
        if hasattr(manager, "move_slot"):  # redis-py 6+
            manager.move_slot(exc)
        else:  # 5.x applies it at the next lookup; now, so none is lost
            manager._moved_exception = exc
            manager._update_moved_slots()

    @staticmethod
    async def _send(
        node: Any, items: list[tuple[int, bool]], commands: Sequence[tuple[Any, ...]]
    ) -> list[Any]:
        """Send ``items``' commands to ``node`` in one write on one of its
        connections, each behind ``ASKING`` where it says so; their replies."""
        sent: list[PipelineCommand] = []
        mine: list[PipelineCommand] = []
        for i, asking in items:
            if asking:
                sent.append(PipelineCommand(len(sent), "ASKING"))
            command = PipelineCommand(len(sent), *commands[i])
            sent.append(command)
            mine.append(command)
        await node.execute_pipeline(sent)
        return [command.result for command in mine]

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
Redis cannot tell a key still to come from one that does not exist, so a
step naming a key that does not exist (a partition's delay set before any
delayed nack) waits for the end of the migration, and fails with
:class:`SlotMigratingError` if that takes longer than the pauses. A command is redirected at most
:data:`MAX_REDIRECTS` times (:class:`SlotMigratingError` past that) and sent
again at most once after its connection broke (the standalone backend's rule:
once more on a fresh connection after a reset). Every other reply, an error
reply included, is the command's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rexc
from redis.asyncio.cluster import PipelineCommand, RedisCluster

from ._slots import key_slot

__all__ = ["MAX_REDIRECTS", "TRY_AGAIN_PAUSES", "SlotMigratingError", "SlotRouter"]

MAX_REDIRECTS = 5
"""How often one command may be redirected (MOVED/ASK) before it fails."""
TRY_AGAIN_PAUSES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
"""Seconds before each new try of a command answered ``TRYAGAIN`` (2.6 s in
all, under the socket timeout: a resharding tool moves a slot's keys in
batches of milliseconds, then hands the slot over at once)."""


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

    async def run(self, calls: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Each (key, command)'s reply, the commands of each node in one write,
        the nodes in parallel; an error reply (or a lost connection, or
        :class:`SlotMigratingError`) is the exception, in its place."""
        await self._client.initialize()  # at once unless a refresh is due
        slots = [key_slot(key) for key, _ in calls]
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
            sends = [self._send(node, items, calls) for node, items in by_node.values()]
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            todo, pause, refresh = {}, 0.0, False
            for name, (_, items), outcome in zip(by_node, by_node.values(), outcomes, strict=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome
                results = [outcome] * len(items) if isinstance(outcome, Exception) else outcome
                for (i, asking), result in zip(items, results, strict=True):
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
                        pause = max(pause, TRY_AGAIN_PAUSES[tries[i]])
                        tries[i] += 1
                        # The same node again: the importing one (behind ASKING),
                        # which runs it once the keys are there or the slot is its.
                        todo[i] = (name if asking else None, asking)
                    elif (
                        isinstance(result, rexc.ConnectionError)
                        and not isinstance(result, rexc.AuthenticationError)
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
            if refresh:  # the node may be gone, or a replica now
                await self._client.nodes_manager.initialize()
            if pause:
                await asyncio.sleep(pause)
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
        node: Any, items: list[tuple[int, bool]], calls: Sequence[tuple[str, tuple[Any, ...]]]
    ) -> list[Any]:
        """Send ``items``' commands to ``node`` in one write on one of its
        connections, each behind ``ASKING`` where it says so; their replies."""
        sent: list[PipelineCommand] = []
        mine: list[PipelineCommand] = []
        for i, asking in items:
            if asking:
                sent.append(PipelineCommand(len(sent), "ASKING"))
            command = PipelineCommand(len(sent), *calls[i][1])
            sent.append(command)
            mine.append(command)
        await node.execute_pipeline(sent)
        return [command.result for command in mine]

"""README, Partition ownership: "Not fenced: the sweeps that take back idle or due
entries of an owned partition (they check ownership by the clock before each
call, as reads did before)"; the module docstring of _engine/ownership.py:
"the fencing is local, by the clock, checked before every read, sweep and
handler start". The take-over sweep (Reclaimer.take_over, called from
PartitionOwner._take) is given its partitions once and never looks at the
clock again: between its batches it waits for flow-control room, for as long
as the handlers take, and then sends the next batch (min-idle 0, parked nacks
included) whether or not its lease may have run out meanwhile."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._delaying_proxy import DelayingProxy
from tests.ordered_faults._keys import Journal, index, keyed, ordered
from tests.ordered_faults._order import record_unowned_sweeps, regressions

# Behind a TCP proxy in front of one redis-server.
pytestmark = pytest.mark.standalone


@pytest.mark.timeout(90)
async def test_a_take_over_sweep_sends_its_next_batch_after_its_lease_may_have_run_out(
    client: streamsub.Client, server: RedisServer, short_ownership_lease: float
) -> None:
    """A crashed subscriber left k:0..k:59 pending. "former" (max_messages=5,
    behind a proxy that holds bytes as a network does) takes the partition
    over: its first batch brings 5 messages, and k:0's handler is held open, so
    the sweep waits for room. The network stalls; its lease runs out (2 s);
    "live" takes the partition (fence raised), takes the 60 over and holds
    them behind k:10 (held open). Then former's handler returns: its sweep
    sends the next batch at once -- although by its own clock the partition
    may be another's (PartitionOwner.surely_owned() says so) -- and when
    the network heals that batch takes live's messages. Asserted: no sweep
    call while the sender's lease may have run out by its clock; and the key's order."""
    await ordered(client, partitions=1, ack_deadline=2.0)
    backend = client._backend
    topic = await backend.get_topic("orders")
    assert topic is not None
    await client.publish_many("orders", keyed(["k"], 0, 60))
    crashed = await backend.read(topic, "billing", "crashed", [0], 100, None)
    assert len(crashed) == 60
    proxy = DelayingProxy()
    port = await proxy.start(server.port)
    journal = Journal()
    former_gate, live_gate = asyncio.Event(), asyncio.Event()
    late_calls: list[dict[int, str]] = []

    async def former_handle(message: streamsub.Message) -> None:
        journal.enter(message, "former")
        if index(message) == 0:
            await former_gate.wait()
        journal.leave(message)

    async def live_handle(message: streamsub.Message) -> None:
        journal.enter(message, "live")
        if index(message) == 10 and message.delivery_attempt <= 2:
            await live_gate.wait()
        journal.leave(message)

    async with (
        contextlib.aclosing(proxy),
        streamsub.connect(
            f"redis://127.0.0.1:{port}/0", socket_timeout=30.0, trim_in_background=False
        ) as behind_proxy,
    ):
        former = behind_proxy.subscribe(
            "billing",
            former_handle,
            consumer="former",
            flow_control=streamsub.FlowControl(max_messages=5),
        )
        # By its clock the lease may have run out when it sends these:
        record_unowned_sweeps(
            behind_proxy, former, lambda args, kwargs, owned: late_calls.append(dict(args[3]))
        )
        async with former:
            await until(lambda: journal.distinct() == 1, 20, "former running k:0")
            await asyncio.sleep(0.5)
            proxy.hold()
            await asyncio.sleep(short_ownership_lease + 0.5)  # former's lease runs out
            async with client.subscribe("billing", live_handle, consumer="live") as live:
                await until(lambda: live.statistics().owned != {}, 20, "live to own p0")
                await until(lambda: ("k", 10, 2, "live") in journal.records, 20, "live at k:10")
                former_gate.set()  # former's handler returns: room for the next batch
                await asyncio.sleep(1.0)
                proxy.release()
                await asyncio.sleep(1.0)
                await client.publish_many("orders", keyed(["k"], 60, 70))
                live_gate.set()
                await until(lambda: journal.distinct() == 70, 30, "every message handled")
                await asyncio.sleep(6.0)  # what was taken comes back once idle
    assert not late_calls, (
        f"former's take-over sweep sent {len(late_calls)} calls after its lease may have "
        "run out (PartitionOwner.surely_owned() no longer had the partition): "
        f"{late_calls[:3]}; the key's handlings: "
        f"{regressions(journal) or 'in order'}"
    )
    wrong = regressions(journal)
    assert not wrong, f"the key went back after later messages were acked: {wrong}"

"""Where one subscriber's time goes, per message, during an end-to-end round.

The e2e scenario of ``run.py`` for ``streamsub`` -- a freshly spawned consumer
process (one subscriber, ``FlowControl(max_messages=1000)``, an ``async def``
handler recording each body, as ``impls/streamsub_impl.py``'s) and, once it is
subscribed, a freshly spawned publisher (``publish_many`` in chunks of 1000,
four in flight) -- with these measurements, the consumer's from subscribed to
the last ack seen by the server (its wall time from the first message's
publish, as ``run.py``'s e2e throughput, and its event loop's idle time from
the first message's delivery: the wait for the publisher to start is not the
consumer's):

* its CPU time (``time.process_time``, user + system) divided by n: the CPU
  microseconds one message costs;
* the time the garbage collector ran, per message (its samples are in the
  profile too, under whatever allocated when a collection began);
* the time its event loop waited in ``epoll`` with nothing to run (for Redis's
  replies, or for the publisher), per message;
* the publisher's CPU time and redis-server's (``INFO cpu``: every master's
  on a cluster) over the round, per message: what the consumer shares the
  machine's cores with;
* a CPU-time sampling profile: ``setitimer(ITIMER_PROF)`` raises ``SIGPROF``
  after every ``--interval`` of CPU the process uses, and the handler counts
  the Python stack it interrupted. Time the process spends preempted or
  waiting is not CPU time and takes no samples, so on a busy machine the
  profile stays a profile of this process's own work. (A wall-clock sampler
  such as py-spy keeps sampling the last stack while the process waits for a
  core, which on this 2-core machine piles samples on whatever ran before a
  preemption, typically a socket write that woke redis-server.) Time in a C
  call lands on the Python frame that made it.

Each sample goes to one part of the receive path (``OWN_CODE``: the module
whose own code the innermost frame outside the standard library is; else
``PARTS``: the innermost frame that names one; else ``OWNERS``: the task it
works for), and a part's microseconds per message are its share of the
samples times the CPU per message (the sampler's own cost, a few percent, is
spread evenly). A task another task awaits (``asyncio.gather``'s, as the
cluster's per-node sends are) has the awaiting task's suspended frames put
before its own in the sample, so that its I/O goes to the task it works for.

Usage::

    .venv/bin/python benchmarks/receive_profile.py --messages 100000 --rounds 3
    .venv/bin/python benchmarks/receive_profile.py --messages 100000 --rounds 3 --cluster

``--cluster`` runs the same round against a private Redis Cluster instead (3
masters, no replicas, AOF off, as ``run.py --cluster`` starts it), streamsub
connecting with its ``redis+cluster://`` URL. What the cluster adds is a part
of its own, "cluster: routing, polls, wake-ups": the own code of streamsub's
cluster modules (``_backends/redis/_cluster.py``, ``_routing.py``,
``_slots.py``, ``_node_gates.py``, ``_wakeups.py``) and of redis-py's cluster
client (``redis/asyncio/cluster.py``, ``redis/cluster.py``, ``crc.py``, the
command parser that finds a command's keys), and the I/O of the wake-ups'
listener; the socket I/O and reply parsing beneath them go to the task they
work for (the reader's polls to "read and parse", the settler's acks to "ack
batching and send"), and so do the cluster's polls themselves (the
``XREADGROUP`` per partition, the entries made of the replies), which are the
read path as on one server.

``--stacks DIR`` keeps each round's collapsed stacks (``frame;frame;... count``,
for flamegraph.pl or speedscope). ``--compare REV`` runs the consumer on the
streamsub of another git revision too (``git archive``, as ``streamsub-0.1``
does), its rounds interleaved with this tree's, the publisher always this
tree's: a before and after from one run (with ``--cluster``, on the cluster:
REV must have the cluster backend).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import multiprocessing
import os
import signal
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import servers  # noqa: E402
from impls.base import Env, PublishAll, Receiver, redis_nodes, wait_until_all_acked  # noqa: E402
from impls.streamsub_impl import MAX_OUTSTANDING, SUBSCRIPTION, Streamsub  # noqa: E402

_SPAWN = multiprocessing.get_context("spawn")

Rule = Callable[[str, str], bool]
"""Whether a frame (its function's qualified name, its file) belongs to a part."""

_ACK_CALLS = {"ack", "_call", "_ack", "ack_returned", "_queue_owned_ack"}


def _ack_call(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in _ACK_CALLS


def _in(*suffixes: str) -> Rule:
    return lambda name, path: path.endswith(suffixes)


def _stdlib_asyncio(name: str, path: str) -> bool:
    return "site-packages" not in path and ("/asyncio/" in path or path.endswith("/selectors.py"))


_STDLIB = sysconfig.get_paths()["stdlib"]


def _stdlib(path: str) -> bool:
    return "-packages" not in path and path.startswith((_STDLIB, "<"))


CLUSTER = "cluster: routing, polls, wake-ups"
_CLUSTER_CODE = _in(
    "_backends/redis/_cluster.py", "_backends/redis/_routing.py", "_backends/redis/_slots.py",
    "_backends/redis/_node_gates.py", "_backends/redis/_wakeups.py",
    "redis/asyncio/cluster.py", "redis/cluster.py", "redis/crc.py",
    "redis/_parsers/commands.py",  # a command's keys, for its slot
)  # fmt: skip


def _cluster_poll(name: str, path: str) -> bool:
    # RedisClusterBackend.read's and read_owned's poll(): one XREADGROUP (or
    # read script) per partition and the entries made of the replies, what
    # _backend.py's read does on one server.
    return path.endswith("_backends/redis/_cluster.py") and "<locals>.poll" in name


OWN_CODE: list[tuple[str, Rule]] = [
    # If one of these names the innermost frame outside the standard library:
    # time in that module's own code (with the C and standard-library calls it
    # makes), not in the I/O and parsing it waits on (those go by OWNERS).
    ("read and parse", _cluster_poll),
    (CLUSTER, _CLUSTER_CODE),
]
PARTS: list[tuple[str, Rule]] = [
    # The innermost frame that matches one of these names the part.
    ("handler (the benchmark's)", lambda f, p: f.endswith("on_message") and p.endswith("/base.py")),
    ("handler (the benchmark's)", lambda f, p: f.endswith(".handler") and p.endswith("profile.py")),
    ("decode", _in("_core/codec.py")),
    ("Message construction", _in("streamsub/_message.py")),
    ("flow control", _in("_core/flow.py")),
    ("inventory and leases", _in("_engine/_inventory.py", "_core/lease.py")),
    ("metrics hooks", _in("streamsub/metrics.py")),
    ("settle (take out, queue the ack)", lambda f, p: _ack_call(f) and p.endswith("/settler.py")),
    ("settle (take out, queue the ack)", _in("_engine/receiver.py")),
    ("handler runners (start, run, report)", _in("_engine/dispatcher.py", "_engine/runners.py")),
    ("intake", _in("_engine/intake.py")),
]  # fmt: skip
OWNERS: list[tuple[str, Rule]] = [
    # Else the first of these found anywhere in the stack: the task the frames
    # below it work for (redis-py, sockets, asyncio's streams).
    ("ack batching and send", _in("_engine/settler.py")),
    ("read and parse", _in("_engine/reader.py")),
    ("leaser and reclaimer", _in("_engine/leaser.py", "_engine/reclaimer.py")),
    (CLUSTER, _CLUSTER_CODE),  # the wake-ups' listener, the map's refreshes
    ("event loop (tasks, epoll)", _stdlib_asyncio),
]
OTHER = "other"


def classify(stack: str) -> str:
    """The part a collapsed stack (``name (path:line)`` frames, root first) is in."""
    frames = []
    for frame in reversed(stack.split(";")):
        name, _, where = frame.partition(" (")
        frames.append((name, where.rsplit(":", 1)[0]))
    own = next(((name, path) for name, path in frames if not _stdlib(path)), None)
    if own is not None:
        for part, matches in OWN_CODE:
            if matches(*own):
                return part
    for name, path in frames:
        for part, matches in PARTS:
            if matches(name, path):
                return part
    for part, matches in OWNERS:
        if any(matches(name, path) for name, path in frames):
            return part
    return OTHER


AWAITED = "<awaits a task> (<asyncio>:0)"
"""The frame put between an awaiting task's suspended frames and the stack of
the task it awaits, in a collapsed stack."""


def _held_futures(callback: Any) -> list[asyncio.Future[Any]]:
    """The futures a done callback holds: in its closure (``gather``'s outer
    future) or among a ``functools.partial``'s arguments (``wait_for``'s waiter)."""
    held: list[Any] = list(getattr(callback, "args", ()))
    for cell in getattr(callback, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            held.append(cell.cell_contents)
    return [item for item in held if isinstance(item, asyncio.Future)]


def _awaiting_task(future: asyncio.Future[Any], depth: int = 3) -> asyncio.Task[Any] | None:
    """The task that awaits ``future``: one whose wake-up is among its done
    callbacks, or among those of a future a callback holds (``gather``'s
    outer future, ``wait_for``'s waiter), ``depth`` such steps at most."""
    for callback, _ in future._callbacks or ():
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            return owner
        if depth == 0:
            continue
        for inner in _held_futures(callback):
            if inner is not future:
                found = _awaiting_task(inner, depth - 1)
                if found is not None:
                    return found
    return None


def _suspended_frames(task: asyncio.Task[Any]) -> Iterator[FrameType]:
    """The frames of a suspended task's coroutines, outermost first."""
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            return
        yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


class CpuSampler:
    """Counts the Python stack every ``interval`` seconds of the process's CPU
    time, behind the suspended frames of the tasks awaiting the running task."""

    def __init__(self, interval: float, loop: asyncio.AbstractEventLoop) -> None:
        self.interval = interval
        self.stacks: collections.Counter[str] = collections.Counter()
        self._names: dict[tuple[Any, int], str] = {}
        self._loop = loop

    def _name(self, frame: FrameType) -> str:
        code = frame.f_code
        key = (code, frame.f_lineno)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{code.co_qualname} ({code.co_filename}:{frame.f_lineno})"
        return name

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        parts = []
        while frame is not None:
            parts.append(self._name(frame))
            frame = frame.f_back
        parts.reverse()
        try:
            task = asyncio.current_task(self._loop)
            for _ in range(8):  # tasks awaiting tasks, outwards
                task = _awaiting_task(task) if task is not None else None
                if task is None:
                    break
                parts[:0] = [*map(self._name, _suspended_frames(task)), AWAITED]
        except Exception:  # raised here, it would land in the code sampled
            pass
        self.stacks[";".join(parts)] += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)


class _IdleMeter:
    """Adds up the time the event loop waits in ``epoll`` with nothing to run:
    the consumer waiting for Redis (or for the publisher)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.seconds = 0.0
        self._selector = loop._selector  # type: ignore[attr-defined]
        self._select = self._selector.select
        self._selector.select = self._timed

    def _timed(self, timeout: float | None = None) -> Any:
        if timeout == 0:
            return self._select(timeout)
        began = time.perf_counter()
        try:
            return self._select(timeout)
        finally:
            self.seconds += time.perf_counter() - began

    def stop(self) -> None:
        self._selector.select = self._select


class _GcMeter:
    """Adds up the time the garbage collector runs (its collections, per generation)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._began
            self.counts[info["generation"]] += 1

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)


def _consumer(url: str, n: int, interval: float, ready: Any, results: Any, src: str | None) -> None:
    if src is not None:  # before anything imports streamsub
        sys.path.insert(0, src)
    import streamsub

    if not os.path.realpath(streamsub.__file__).startswith(os.path.realpath(sys.path[0])):
        results.put(("error", f"imported {streamsub.__file__}, not the code under test"))
        return
    try:
        results.put(("ok", asyncio.run(_consume(url, n, interval, ready))))
    except BaseException as exc:
        results.put(("error", repr(exc)))


async def _consume(
    url: str, n: int, interval: float, ready: Any
) -> tuple[float, float, float, list[float], collections.Counter[str]]:
    import streamsub

    receiver = Receiver(n)
    loop = asyncio.get_running_loop()
    idle, idle_before = _IdleMeter(loop), 0.0

    async def handler(message: streamsub.Message) -> None:
        nonlocal idle_before
        if not receiver.deliveries:  # the wait for the publisher is not the consumer's
            idle_before = idle.seconds
        receiver.on_message(message.data)

    sampler = CpuSampler(interval, loop)
    async with (
        redis_nodes(url) as watchers,
        streamsub.connect(url) as client,
        client.subscribe(
            SUBSCRIPTION,
            handler,
            flow_control=streamsub.FlowControl(max_messages=MAX_OUTSTANDING),
        ),
    ):
        collector = _GcMeter()
        idle.seconds, cpu = 0.0, time.process_time()
        if interval > 0:
            sampler.start()
        ready.set()
        await receiver.done.wait()
        last_ack_ns = await wait_until_all_acked(*watchers)
        sampler.stop()
        idle.stop()
        collector.stop()
        print(
            f"  garbage collections per generation: {collector.counts}, "
            f"objects tracked at the end: {len(gc.get_objects()):,}"
        )
        cpu = time.process_time() - cpu
        wall = (last_ack_ns - receiver.first_publish_ns) / 1e9
        return cpu, wall, idle.seconds - idle_before, collector.seconds, sampler.stacks


def _publisher(url: str, n: int, size: int, cpu: Any) -> None:
    began = time.process_time()
    asyncio.run(PublishAll(n, size)(Streamsub(Env(redis_url=url))))
    cpu.put(time.process_time() - began)


async def _servers_cpu(url: str) -> float:
    """The CPU seconds (user + system, ``INFO cpu``) the servers holding data used so far."""
    async with redis_nodes(url) as clients:
        infos = [await client.info("cpu") for client in clients]
    return sum(float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in infos)


class Round(NamedTuple):
    """One round's measurements, in seconds (``stacks``: samples per stack)."""

    cpu: float  # the consumer's
    wall: float
    idle: float  # the consumer's event loop in epoll
    collecting: list[float]  # the consumer's garbage collections, per generation
    stacks: collections.Counter[str]
    publisher_cpu: float
    servers_cpu: float  # redis-server's (every master's on a cluster), the round's whole span


def one_round(url: str, n: int, size: int, interval: float, src: str) -> Round:
    """Run one round, the consumer running the streamsub in ``src``."""
    impl = Streamsub(Env(redis_url=url))
    asyncio.run(impl.flush())
    asyncio.run(impl.setup())
    ready, results = _SPAWN.Event(), _SPAWN.Queue()
    consumer = _SPAWN.Process(target=_consumer, args=(url, n, interval, ready, results, src))
    consumer.start()
    if not ready.wait(60):
        consumer.kill()
        raise RuntimeError("the consumer did not subscribe")
    published = _SPAWN.Queue()
    servers_before = asyncio.run(_servers_cpu(url))
    publisher = _SPAWN.Process(target=_publisher, args=(url, n, size, published))
    publisher.start()
    status, value = results.get(timeout=600)
    servers_cpu = asyncio.run(_servers_cpu(url)) - servers_before
    if status != "ok":
        publisher.kill()
        consumer.join(30)
        raise RuntimeError(f"consumer failed: {value}")
    publisher_cpu = published.get(timeout=60)
    publisher.join(30)
    consumer.join(30)
    cpu, wall, idle, collecting, stacks = value
    return Round(cpu, wall, idle, collecting, stacks, publisher_cpu, servers_cpu)


def awaited(stacks: collections.Counter[str]) -> int:
    """How many samples were taken in a task another task awaits."""
    return sum(count for stack, count in stacks.items() if AWAITED in stack)


def breakdown(stacks: collections.Counter[str]) -> dict[str, float]:
    """Each part's share of the samples."""
    parts: collections.Counter[str] = collections.Counter()
    for stack, count in stacks.items():
        parts[classify(stack)] += count
    total = sum(parts.values()) or 1
    return {part: count / total for part, count in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument(
        "--interval", type=float, default=0.0005, help="CPU seconds between samples (0: none)"
    )
    parser.add_argument("--stacks", type=Path, help="keep each round's collapsed stacks here")
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="also run the consumer on the streamsub of git revision REV, rounds interleaved",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=f"on a private {servers.CLUSTER_MASTERS}-master Redis Cluster (no replicas) "
        "instead of one redis-server",
    )
    args = parser.parse_args(argv)
    redis_path = servers.find_binary("redis-server")
    if redis_path is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    n: int = args.messages
    codes = {"this tree": str(HERE.parent / "src")}
    if args.compare:
        from impls.streamsub_prev import REPO_ROOT, extract

        codes = {args.compare: str(extract(args.compare, REPO_ROOT)), **codes}
    rounds: dict[str, list[tuple[Round, dict[str, float]]]] = {code: [] for code in codes}
    start_servers = servers.redis_cluster if args.cluster else servers.redis_server
    with start_servers(redis_path) as url:
        if args.cluster:
            print(f"cluster: {url} ({servers.CLUSTER_MASTERS} masters, no replicas)", flush=True)
        for r in range(args.rounds):
            order = list(codes) if r % 2 == 0 else list(reversed(codes))
            for code in order:
                one = one_round(url, n, args.size, args.interval, codes[code])
                if args.stacks:
                    args.stacks.mkdir(parents=True, exist_ok=True)
                    lines = (f"{stack} {count}\n" for stack, count in one.stacks.most_common())
                    name = "".join(c if c.isalnum() else "-" for c in code)
                    (args.stacks / f"{name}-round{r + 1}.txt").write_text("".join(lines))
                rounds[code].append((one, breakdown(one.stacks)))
                print(
                    f"round {r + 1} {code}: {n / one.wall:,.0f} msgs/s, per message: CPU "
                    f"{one.cpu * 1e6 / n:.2f} us (publisher {one.publisher_cpu * 1e6 / n:.2f}, "
                    f"redis-server {one.servers_cpu * 1e6 / n:.2f}), wall "
                    f"{one.wall * 1e6 / n:.2f} us, loop idle {one.idle * 1e6 / n:.2f} us, "
                    "garbage collection "
                    f"{'/'.join(f'{g * 1e6 / n:.2f}' for g in one.collecting)} us (generations "
                    f"0/1/2); {sum(one.stacks.values())} samples ({awaited(one.stacks)} in tasks "
                    "another awaits), "
                    f"load {os.getloadavg()[0]:.2f}"
                )
    for code, results in rounds.items():

        def per_message(
            measure: Callable[[Round], float],
            results: list[tuple[Round, dict[str, float]]] = results,
        ) -> float:
            return statistics.median(measure(one) for one, _ in results) * 1e6 / n

        us = per_message(lambda one: one.cpu)
        names = {part for _, shares in results for part in shares}
        share = {p: statistics.median(s.get(p, 0.0) for _, s in results) for p in names}
        print(
            f"\n{code}, medians of {len(results)} rounds, per message: consumer CPU {us:.2f} us, "
            f"wall {per_message(lambda one: one.wall):.2f} us, event loop idle "
            f"{per_message(lambda one: one.idle):.2f} us, garbage collection "
            f"{per_message(lambda one: sum(one.collecting)):.2f} us (wall, in the CPU parts "
            f"below); the publisher's CPU {per_message(lambda one: one.publisher_cpu):.2f} us, "
            f"redis-server's {per_message(lambda one: one.servers_cpu):.2f} us"
        )
        print("| part | share of samples | us per message |\n|---|---:|---:|")
        for part in sorted(names, key=lambda p: -share[p]):
            print(f"| {part} | {share[part]:.1%} | {share[part] * us:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

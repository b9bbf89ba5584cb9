"""The ``streamsub`` command: a thin face over the public API.

Every command parses its arguments, calls :mod:`streamsub`, and prints the
result: rich tables for people, ``--json`` for scripts, data on stdout and
progress or diagnostics on stderr. A :class:`~streamsub.StreamsubError` becomes
one red line on stderr and an exit code that says what kind of failure it was:

====  ==========================================================
0     ok
1     failed otherwise (the demo lost messages, a server crashed)
2     bad input (``InvalidArgumentError``, bad options)
3     not found (``NotFoundError``)
4     already exists or failed precondition
5     unavailable or backend error (``BackendError``)
====  ==========================================================
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import io
import json
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Annotated, Any, Literal, NoReturn, TypeVar

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

import streamsub
from streamsub import (
    AlreadyExistsError,
    BackendError,
    DeadLetter,
    FailedPreconditionError,
    FlowControl,
    InvalidArgumentError,
    Message,
    NotFoundError,
    OutgoingMessage,
    PartitionNode,
    Retention,
    RetentionResult,
    RetryPolicy,
    SeekResult,
    Snapshot,
    Stats,
    StreamsubError,
    Subscription,
    SubscriptionStats,
    Topic,
)

from ._demo import DemoError, DemoSettings, run_demo
from ._server import RedisServer

__all__ = ["app", "main"]

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 5
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as shells report a command stopped by Ctrl-C."""

PUBLISH_CHUNK = 1000
"""Messages per ``publish_many`` call when publishing from stdin: one batch."""
PUBLISH_IN_FLIGHT = 2
"""Chunks written at once; the publisher keeps them in order, so ordering keys hold."""

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

app = typer.Typer(
    name="streamsub",
    help="Reliable pub/sub on Redis Streams, with Google Cloud Pub/Sub semantics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
topic_app = typer.Typer(help="Create, list, describe and delete topics.", no_args_is_help=True)
sub_app = typer.Typer(help="Create, list, describe and delete subscriptions.", no_args_is_help=True)
retention_app = typer.Typer(help="Enforce topics' retention.", no_args_is_help=True)
snapshot_app = typer.Typer(help="Create, list and delete snapshots.", no_args_is_help=True)
dead_letter_app = typer.Typer(
    help="List, show, replay and purge a subscription's dead letters.", no_args_is_help=True
)
app.add_typer(topic_app, name="topic")
app.add_typer(sub_app, name="sub")
app.add_typer(retention_app, name="retention")
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(dead_letter_app, name="dead-letters")

Url = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="STREAMSUB_URL",
        help="Server URL: redis://host:port/db, rediss://... (TLS), unix:///path/redis.sock.",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=1,
        max=65535,
        help="Serve Prometheus metrics on ADDR:PORT/metrics (needs streamsub[metrics]); "
        "ADDR is --metrics-addr.",
    ),
]
MetricsAddr = Annotated[
    str,
    typer.Option(
        "--metrics-addr",
        help="The address --metrics-port binds: 127.0.0.1 (default, this host only), "
        "0.0.0.0 for every IPv4 interface (e.g. in a container), or one interface's address.",
    ),
]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
MaxAge = Annotated[
    float | None,
    typer.Option("--max-age", min=0.001, help="Retention: keep messages this many seconds."),
]
MaxLength = Annotated[
    int | None,
    typer.Option("--max-length", min=1, help="Retention: keep this many messages per partition."),
]
DropUnacked = Annotated[
    bool,
    typer.Option(
        "--drop-unacked",
        help="Retention is a hard cap: drop unacknowledged messages too (counted).",
    ),
]


def _serve_metrics(port: int | None, addr: str = "127.0.0.1") -> None:
    if port is None:
        return
    from . import metrics

    try:
        metrics.serve(port, addr)
    except StreamsubError as exc:
        fail(str(exc), exit_code(exc))
    except OSError as exc:
        fail(f"cannot serve metrics on {addr} port {port}: {exc}", EXIT_BAD_INPUT)
    host = f"[{addr}]" if ":" in addr else addr
    err.print(f"metrics at http://{host}:{port}/metrics")


# --- errors --------------------------------------------------------------------
def exit_code(exc: StreamsubError) -> int:
    """The exit code for an error, by its kind."""
    if isinstance(exc, InvalidArgumentError):
        return EXIT_BAD_INPUT
    if isinstance(exc, NotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, AlreadyExistsError | FailedPreconditionError):
        return EXIT_CONFLICT
    if isinstance(exc, BackendError):
        return EXIT_UNAVAILABLE
    return EXIT_FAILURE


def fail(message: str, code: int) -> NoReturn:
    """Print ``message`` as one red line on stderr (details dim below it) and exit."""
    first, *rest = message.strip().splitlines() or ["failed"]
    err.print(Text(f"error: {first}", style="bold red"), soft_wrap=True)
    for line in rest:
        err.print(Text(line, style="dim"), soft_wrap=True)
    raise typer.Exit(code)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion, turning streamsub errors into exit codes.

    SIGTERM, like Ctrl-C, cancels ``main``: a running subscriber then stops
    reading, lets its handlers finish, gives back what is left and flushes its acks.
    """
    try:
        return asyncio.run(_cancelled_by_sigterm(main))
    except StreamsubError as exc:
        fail(str(exc), exit_code(exc))
    except (KeyboardInterrupt, asyncio.CancelledError):
        err.print(Text("interrupted", style="yellow"))
        raise typer.Exit(EXIT_INTERRUPTED) from None


async def _cancelled_by_sigterm(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await main
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _print_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=_json_default) + "\n")
    sys.stdout.flush()


def _json_default(value: object) -> object:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _when(moment: datetime.datetime) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


# --- dev-server ----------------------------------------------------------------
class _Stop(Exception):
    """SIGTERM arrived: stop like Ctrl-C does."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@app.command("dev-server")
def dev_server(
    directory: Annotated[
        Path, typer.Option("--dir", help="Data directory (AOF files, log, socket).")
    ] = Path(".streamsub/dev"),
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="Loopback TCP port.")
    ] = 6379,
    unix_socket: Annotated[
        bool, typer.Option("--unix-socket", help="Listen on DIR/redis.sock instead of TCP.")
    ] = False,
) -> None:
    """Run a private redis-server (AOF on) in the foreground until Ctrl-C or SIGTERM."""
    directory = directory.expanduser().resolve()
    if unix_socket and len(str(directory / "redis.sock")) > 100:
        fail(
            f"the socket path {directory / 'redis.sock'} is too long for a unix socket; "
            "pass a shorter --dir",
            EXIT_BAD_INPUT,
        )
    if not unix_socket and _port_in_use(port):
        fail(
            f"port {port} on 127.0.0.1 is in use (another redis-server?); "
            "pass --port N or --unix-socket",
            EXIT_CONFLICT,
        )
    try:
        server = RedisServer(directory, port=port, unix_socket=unix_socket)
        server.start()
    except StreamsubError as exc:
        fail(f"{exc}\nthe server log is {directory / 'redis.log'}", EXIT_UNAVAILABLE)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        err.print(f"[bold green]redis-server[/] running (pid {server.pid}), data in {directory}")
        err.print(f"log: {directory / 'redis.log'}; Ctrl-C to stop\n")
        out.print(f"[bold]{server.url}[/]")
        out.print(f"export STREAMSUB_URL={server.url}", soft_wrap=True)
        assert server.process is not None
        code = server.process.wait()
        fail(
            f"redis-server exited by itself with code {code}; see {directory / 'redis.log'}",
            EXIT_FAILURE,
        )
    except (KeyboardInterrupt, _Stop):
        err.print("stopping redis-server ...")
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
    err.print("[green]stopped[/]; the data stays in " + str(directory))


# --- topics --------------------------------------------------------------------
def _topic_json(topic: Topic, subscriptions: Sequence[Subscription] = ()) -> dict[str, object]:
    return {
        "name": topic.name,
        "partitions": topic.partitions,
        "created": topic.created,
        "retention": None if topic.retention is None else topic.retention.to_dict(),
        "subscriptions": [s.name for s in subscriptions],
    }


def _retention(
    max_age: float | None, max_length: int | None, drop_unacked: bool
) -> Retention | None:
    if max_age is None and max_length is None:
        if drop_unacked:
            raise InvalidArgumentError("--drop-unacked needs --max-age or --max-length")
        return None
    return Retention(max_age=max_age, max_length=max_length, drop_unacked=drop_unacked)


def _retention_text(retention: Retention | None) -> str:
    if retention is None or not retention.bounded:
        return "keep everything"
    parts = []
    if retention.max_age is not None:
        parts.append(f"max age {retention.max_age:g} s")
    if retention.max_length is not None:
        parts.append(f"max length {retention.max_length:,} per partition")
    parts.append("drops unacked (counted)" if retention.drop_unacked else "never drops unacked")
    return ", ".join(parts)


@topic_app.command("create")
def topic_create(
    name: str,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions (streams) of the topic.")
    ] = 16,
    max_age: MaxAge = None,
    max_length: MaxLength = None,
    drop_unacked: DropUnacked = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Create a topic (nothing happens if it exists with the same settings)."""

    async def main() -> Topic:
        retention = _retention(max_age, max_length, drop_unacked)
        async with streamsub.connect(url) as client:
            return await client.create_topic(name, partitions=partitions, retention=retention)

    topic = run(main())
    out.print(f"topic [bold]{topic.name}[/] ready ({topic.partitions} partitions)")


@topic_app.command("list")
def topic_list(url: Url = streamsub.DEFAULT_URL, as_json: Json = False) -> None:
    """List every topic with its partitions and subscriptions."""

    async def main() -> list[tuple[Topic, list[Subscription]]]:
        async with streamsub.connect(url) as client:
            subscriptions = await client.list_subscriptions()
            return [
                (t, [s for s in subscriptions if s.topic == t.name])
                for t in await client.list_topics()
            ]

    topics = run(main())
    if as_json:
        _print_json([_topic_json(t, subs) for t, subs in topics])
        return
    if not topics:
        err.print("no topics; create one with: streamsub topic create NAME")
        return
    table = Table("topic", "partitions", "subscriptions", "retention", "created")
    for topic, subs in topics:
        table.add_row(
            topic.name,
            str(topic.partitions),
            ", ".join(s.name for s in subs) or "-",
            _retention_text(topic.retention),
            _when(topic.created),
        )
    out.print(table)


def _ranges(numbers: Sequence[int]) -> str:
    """Numbers as sorted ranges: 0-2, 5, 7-8."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


NODE_ID_SHOWN = 8
"""Leading hex digits of a cluster node id shown by ``topic describe`` (as git
shortens commit ids): enough to tell a cluster's nodes apart."""


@topic_app.command("describe")
def topic_describe(name: str, url: Url = streamsub.DEFAULT_URL, as_json: Json = False) -> None:
    """Show a topic, its subscriptions and which server holds each partition."""

    async def main() -> tuple[Topic, list[Subscription], list[PartitionNode]]:
        async with streamsub.connect(url) as client:
            topic = await client.get_topic(name)
            subs = await client.list_subscriptions(name)
            return topic, subs, await client.locate_partitions(name)

    topic, subs, placement = run(main())
    if as_json:
        _print_json(
            {
                **_topic_json(topic, subs),
                "placement": [
                    {"partition": p.partition, "address": p.address, "node_id": p.node_id}
                    for p in placement
                ],
            }
        )
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_row("[bold]topic[/]", topic.name)
    grid.add_row("partitions", str(topic.partitions))
    grid.add_row("created", _when(topic.created))
    grid.add_row("retention", _retention_text(topic.retention))
    grid.add_row("subscriptions", ", ".join(s.name for s in subs) or "-")
    out.print(grid)
    by_node: dict[tuple[str, str | None], list[int]] = {}
    for located in placement:
        by_node.setdefault((located.address, located.node_id), []).append(located.partition)
    table = Table("node", "node id", "partitions", "count")
    for (address, node_id), partitions in sorted(by_node.items(), key=lambda item: item[1][0]):
        table.add_row(
            address,
            "-" if node_id is None else node_id[:NODE_ID_SHOWN],
            _ranges(partitions),
            str(len(partitions)),
        )
    out.print(table)


@topic_app.command("delete")
def topic_delete(
    name: str,
    force: Annotated[
        bool, typer.Option("--force", help="Also delete the topic's subscriptions.")
    ] = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Delete a topic and its messages."""

    async def main() -> None:
        async with streamsub.connect(url) as client:
            try:
                await client.delete_topic(name, force=force)
            except FailedPreconditionError:
                subs = await client.list_subscriptions(name)
                raise FailedPreconditionError(
                    f"topic {name!r} has subscriptions ({', '.join(s.name for s in subs)}); "
                    "delete them first or pass --force to delete them too"
                ) from None

    run(main())
    out.print(f"topic [bold]{name}[/] deleted")


@topic_app.command("retention")
def topic_retention(
    name: str,
    max_age: MaxAge = None,
    max_length: MaxLength = None,
    drop_unacked: DropUnacked = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Change a topic's retention (no bound given: keep everything)."""

    async def main() -> Topic:
        retention = _retention(max_age, max_length, drop_unacked)
        async with streamsub.connect(url) as client:
            return await client.update_topic_retention(name, retention)

    topic = run(main())
    out.print(f"topic [bold]{topic.name}[/] retention: {_retention_text(topic.retention)}")


# --- retention ---------------------------------------------------------------------
@retention_app.command("run")
def retention_run(
    topics: Annotated[
        list[str] | None, typer.Argument(help="Topics to trim once (default: all).")
    ] = None,
    forever: Annotated[
        bool,
        typer.Option(
            "--forever", help="Keep trimming every topic every --interval seconds until stopped."
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.01, help="Seconds between passes (--forever).")
    ] = 5.0,
    as_json: Json = False,
    metrics_port: MetricsPort = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Run one retention pass over topics now, or keep trimming with --forever."""
    _serve_metrics(metrics_port, metrics_addr)

    async def main() -> list[RetentionResult]:
        async with streamsub.connect(url, trim_in_background=False) as client:
            if forever:
                err.print(f"trimming every topic every {interval:g} s; Ctrl-C stops")
                await client.run_retention(interval=interval)
            names = topics or [t.name for t in await client.list_topics() if t.retention]
            return [await client.enforce_retention(n) for n in names]

    results = run(main())
    if as_json:
        _print_json(
            [
                {
                    "topic": r.topic,
                    "trimmed": r.trimmed,
                    "dropped_unacked": r.dropped_unacked,
                    "partitions": [dataclasses.asdict(p) for p in r.partitions],
                }
                for r in results
            ]
        )
        return
    table = Table("topic", "trimmed", "dropped unacked")
    for r in results:
        table.add_row(r.topic, f"{r.trimmed:,}", f"{r.dropped_unacked:,}")
    out.print(table)


# --- seek and snapshots ------------------------------------------------------------
def _seek_target(to: str) -> datetime.datetime | str:
    """A time in ISO 8601 (local time when it names no zone), else the text as given."""
    if to[:4].isdigit() and len(to) >= 10 and to[4] == "-" and to.count("-") >= 2 and ":" in to:
        moment = datetime.datetime.fromisoformat(to)
        return moment if moment.tzinfo else moment.astimezone()
    if len(to) == 10 and to[4] == "-" and to[:4].isdigit():
        return datetime.datetime.fromisoformat(to).astimezone()
    return to


def _confirm(question: str, yes: bool) -> None:
    if not yes and not typer.confirm(question, err=True):
        err.print("nothing done")
        raise typer.Exit(EXIT_FAILURE)


@app.command()
def seek(
    subscription: str,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="A time (ISO 8601, e.g. 2024-05-01T12:00:00Z; local time without a zone), "
            "'earliest', 'latest', a message id (<partition>-<ms>-<seq>) or a snapshot name.",
        ),
    ],
    yes: Yes = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Move a subscription: messages before the point count as acknowledged, those
    at or after it are delivered again."""
    target = _seek_target(to)
    _confirm(f"seek subscription {subscription!r} to {to}?", yes)

    async def main() -> SeekResult:
        async with streamsub.connect(url) as client:
            return await client.seek(subscription, to=target)

    result = run(main())
    out.print(
        f"subscription [bold]{subscription}[/] now at {to}: {result.acknowledged:,} pending "
        f"acknowledged, {result.redelivered_pending:,} to be delivered again"
    )


@snapshot_app.command("create")
def snapshot_create(
    name: str,
    subscription: Annotated[str, typer.Option("--sub", help="The subscription to snapshot.")],
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Record a subscription's acknowledgement state, to seek back to later."""

    async def main() -> Snapshot:
        async with streamsub.connect(url) as client:
            return await client.create_snapshot(name, subscription)

    snapshot = run(main())
    out.print(f"snapshot [bold]{snapshot.name}[/] of {snapshot.subscription} created")


def _snapshot_json(snapshot: Snapshot) -> dict[str, object]:
    return {
        "name": snapshot.name,
        "subscription": snapshot.subscription,
        "topic": snapshot.topic,
        "created": snapshot.created,
        "expires": snapshot.expires,
    }


@snapshot_app.command("list")
def snapshot_list(url: Url = streamsub.DEFAULT_URL, as_json: Json = False) -> None:
    """List every snapshot."""

    async def main() -> list[Snapshot]:
        async with streamsub.connect(url) as client:
            return await client.list_snapshots()

    snapshots = run(main())
    if as_json:
        _print_json([_snapshot_json(s) for s in snapshots])
        return
    table = Table("snapshot", "subscription", "topic", "created", "expires")
    for s in snapshots:
        table.add_row(s.name, s.subscription, s.topic, _when(s.created), _when(s.expires))
    out.print(table)


@snapshot_app.command("delete")
def snapshot_delete(name: str, yes: Yes = False, url: Url = streamsub.DEFAULT_URL) -> None:
    """Delete a snapshot."""
    _confirm(f"delete snapshot {name!r}?", yes)

    async def main() -> None:
        async with streamsub.connect(url) as client:
            await client.delete_snapshot(name)

    run(main())
    out.print(f"snapshot [bold]{name}[/] deleted")


# --- dead letters ---------------------------------------------------------------------
def _dead_letter_json(letter: DeadLetter) -> dict[str, object]:
    data, encoding = _data_text(letter.data)
    return {
        "id": letter.message_id,
        "source_topic": letter.source_topic,
        "source_subscription": letter.source_subscription,
        "source_message_id": letter.source_message_id,
        "delivery_attempts": letter.delivery_attempts,
        "reason": letter.reason,
        "first_delivery": letter.first_delivery,
        "last_delivery": letter.last_delivery,
        "ordering_key": letter.ordering_key,
        "attributes": dict(letter.attributes),
        "data": data,
        "data_encoding": encoding,
    }


Ids = Annotated[
    list[str] | None,
    typer.Option("--id", help="Only this dead letter (its id in the dead-letter topic); repeat."),
]


@dead_letter_app.command("list")
def dead_letters_list(
    subscription: str,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")
    ] = 100,
    as_json: Json = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """List a subscription's dead letters, oldest first, with why they failed."""

    async def main() -> list[DeadLetter]:
        async with streamsub.connect(url) as client:
            return await client.list_dead_letters(subscription, limit=limit)

    letters = run(main())
    if as_json:
        _print_json([_dead_letter_json(d) for d in letters])
        return
    table = Table("id", "source message", "attempts", "last delivery", "reason", "data")
    for d in letters:
        data, encoding = _data_text(d.data)
        table.add_row(
            d.message_id,
            d.source_message_id or "-",
            "-" if d.delivery_attempts is None else str(d.delivery_attempts),
            "-" if d.last_delivery is None else _when(d.last_delivery),
            d.reason or "-",
            (f"base64:{data}" if encoding == "base64" else data)[:60],
        )
    out.print(table)
    err.print(f"{len(letters)} dead letters of {subscription}")


@dead_letter_app.command("show")
def dead_letters_show(
    subscription: str, message_id: str, as_json: Json = False, url: Url = streamsub.DEFAULT_URL
) -> None:
    """Show one dead letter whole: data, attributes and metadata."""

    async def main() -> DeadLetter:
        async with streamsub.connect(url) as client:
            return await client.get_dead_letter(subscription, message_id)

    letter = run(main())
    if as_json:
        _print_json(_dead_letter_json(letter))
        return
    grid = Table.grid(padding=(0, 2))
    for key, value in _dead_letter_json(letter).items():
        shown = _when(value) if isinstance(value, datetime.datetime) else value
        grid.add_row(key, "-" if shown is None else str(shown))
    out.print(grid)


_COUNT_LIMIT = 10_000
"""Dead letters counted at most for a confirmation question."""


def _confirm_dead_letters(
    action: str, subscription: str, ids: list[str] | None, yes: bool, url: str
) -> None:
    """Ask before ``action`` touches the subscription's dead letters, saying how many
    (all of them, or those of ``ids`` that exist); with none, say so and stop."""
    if yes:
        return

    async def main() -> int:
        async with streamsub.connect(url, trim_in_background=False) as client:
            if not ids:
                return len(await client.list_dead_letters(subscription, limit=_COUNT_LIMIT))
            found = 0
            for message_id in dict.fromkeys(ids):
                try:
                    await client.get_dead_letter(subscription, message_id)
                except NotFoundError:
                    continue
                found += 1
            return found

    count = run(main())
    if count == 0:
        err.print(f"no such dead letters of {subscription}; nothing done")
        raise typer.Exit(0)
    many = f"at least {count:,}" if count >= _COUNT_LIMIT else f"{count:,}"
    _confirm(action.format(count=many), yes)


@dead_letter_app.command("replay")
def dead_letters_replay(
    subscription: str,
    to: Annotated[
        str | None, typer.Option("--to", help="Publish to this topic instead of the source.")
    ] = None,
    ids: Ids = None,
    yes: Yes = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Publish dead letters again (to their source topic, or --to), then delete them."""
    _confirm_dead_letters(
        f"replay {{count}} dead letters of {subscription!r} to {to or 'their source topic'}?",
        subscription,
        ids,
        yes,
        url,
    )

    async def main() -> int:
        async with streamsub.connect(url) as client:
            return await client.replay_dead_letters(subscription, to=to, message_ids=ids)

    count = run(main())
    out.print(f"replayed {count} dead letters of [bold]{subscription}[/]")


@dead_letter_app.command("purge")
def dead_letters_purge(
    subscription: str, ids: Ids = None, yes: Yes = False, url: Url = streamsub.DEFAULT_URL
) -> None:
    """Delete dead letters for good."""
    _confirm_dead_letters(
        f"delete {{count}} dead letters of {subscription!r} for good?", subscription, ids, yes, url
    )

    async def main() -> int:
        async with streamsub.connect(url) as client:
            return await client.purge_dead_letters(subscription, message_ids=ids)

    count = run(main())
    out.print(f"purged {count} dead letters of [bold]{subscription}[/]")


# --- stats ------------------------------------------------------------------------------
def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _bytes(count: int | None) -> str:
    if count is None:
        return "?"
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:,.0f} B" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GiB"


def _stats_tables(stats: Stats) -> Group:
    topics = Table(
        "topic",
        "partitions",
        "messages",
        "memory",
        "publish/s",
        "dropped unacked",
        "retention",
        title=f"topics at {_when(stats.taken)}",
    )
    for t in stats.topics:
        topics.add_row(
            t.topic,
            str(t.partitions),
            f"{t.length:,}",
            _bytes(t.memory_bytes),
            f"{t.publish_rate:,.1f}",
            f"{t.dropped_unacked:,}",
            _retention_text(t.retention),
        )
    subscriptions = Table(
        "subscription",
        "topic",
        "backlog",
        "pending",
        "oldest unacked",
        "pending per consumer",
        "delivery attempts",
        "dead-letter topic length",
        title="subscriptions",
    )
    partitions = Table(
        "subscription", "partition", "backlog", "pending", "oldest unacked", title="partitions"
    )
    for s in stats.subscriptions:
        subscriptions.add_row(
            s.subscription,
            s.topic,
            f"{s.backlog:,}",
            f"{s.pending:,}",
            _age(s.oldest_unacked_age),
            ", ".join(f"{c}={n:,}" for c, n in s.pending_per_consumer.items()) or "-",
            ", ".join(f"{a}x: {n:,}" for a, n in s.delivery_attempts.items()) or "-",
            "-" if s.dead_letter_topic_length is None else f"{s.dead_letter_topic_length:,}",
        )
        for p in s.partitions:
            partitions.add_row(
                s.subscription,
                str(p.partition),
                f"{p.backlog:,}",
                f"{p.pending:,}",
                _age(p.oldest_unacked_age),
            )
    return Group(topics, subscriptions, partitions)


def _stats_dict(stats: Stats) -> dict[str, object]:
    return dataclasses.asdict(stats)


@app.command()
def stats(
    topic: Annotated[
        str | None, typer.Argument(help="Only this topic and its subscriptions.")
    ] = None,
    watch: Annotated[
        float | None,
        typer.Option("--watch", min=0.1, help="Refresh every this many seconds until Ctrl-C."),
    ] = None,
    as_json: Json = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Backlog, stuck messages, dead letters, memory and publish rates."""

    async def main() -> Stats:
        async with streamsub.connect(url, trim_in_background=False) as client:
            if watch is None:
                return await client.stats(topic)
            if as_json:
                while True:
                    sys.stdout.write(
                        json.dumps(_stats_dict(await client.stats(topic)), default=_json_default)
                        + "\n"
                    )
                    sys.stdout.flush()
                    await asyncio.sleep(watch)
            with Live(console=out, auto_refresh=False) as live:
                while True:
                    live.update(_stats_tables(await client.stats(topic)), refresh=True)
                    await asyncio.sleep(watch)

    result = run(main())
    if as_json:
        _print_json(_stats_dict(result))
        return
    out.print(_stats_tables(result))


# --- subscriptions ---------------------------------------------------------------
def _subscription_json(sub: Subscription) -> dict[str, object]:
    retry = sub.retry_policy
    return {
        "name": sub.name,
        "topic": sub.topic,
        "created": sub.created,
        "start": sub.start,
        "ack_deadline": sub.ack_deadline,
        "max_delivery_attempts": sub.max_delivery_attempts,
        "dead_letter_topic": sub.dead_letter_topic,
        "retry_policy": None
        if retry is None
        else {"minimum_backoff": retry.minimum_backoff, "maximum_backoff": retry.maximum_backoff},
        "enable_message_ordering": sub.enable_message_ordering,
        "enable_exactly_once_delivery": sub.enable_exactly_once_delivery,
    }


def _stats_json(stats: SubscriptionStats) -> dict[str, object]:
    return {
        "messages": stats.messages,
        "pending": stats.pending,
        "lag": stats.lag,
        "consumers": stats.consumers,
        "partitions": [
            {
                "partition": p.partition,
                "length": p.length,
                "pending": p.pending,
                "lag": p.lag,
                "last_delivered_id": p.last_delivered_id,
                "consumers": p.consumers,
                "owner": stats.owners[p.partition][0] if p.partition in stats.owners else None,
            }
            for p in stats.partitions
        ],
    }


@sub_app.command("create")
def sub_create(
    name: str,
    topic: Annotated[str, typer.Option("--topic", help="The topic to subscribe to.")],
    start: Annotated[
        Literal["latest", "earliest"],
        typer.Option(
            "--start", help="latest: messages published from now on; earliest: all retained."
        ),
    ] = "latest",
    ack_deadline: Annotated[
        float, typer.Option("--ack-deadline", help="Seconds before an unacked message returns.")
    ] = 30.0,
    max_delivery_attempts: Annotated[
        int, typer.Option("--max-delivery-attempts", help="Attempts before dead-lettering.")
    ] = 5,
    dead_letter_topic: Annotated[
        str | None, typer.Option("--dead-letter-topic", help="Where exhausted messages go.")
    ] = None,
    min_backoff: Annotated[
        float | None, typer.Option("--min-backoff", help="Retry backoff after a nack (s).")
    ] = None,
    max_backoff: Annotated[
        float | None, typer.Option("--max-backoff", help="Longest retry backoff (s).")
    ] = None,
    ordering: Annotated[
        bool, typer.Option("--ordering", help="Deliver each ordering key in order.")
    ] = False,
    exactly_once: Annotated[
        bool, typer.Option("--exactly-once", help="Enable exactly-once delivery.")
    ] = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Create a subscription on a topic (nothing happens if it exists with the same settings)."""

    async def main() -> Subscription:
        retry = None
        if min_backoff is not None or max_backoff is not None:
            defaults = RetryPolicy()
            retry = RetryPolicy(
                minimum_backoff=defaults.minimum_backoff if min_backoff is None else min_backoff,
                maximum_backoff=defaults.maximum_backoff if max_backoff is None else max_backoff,
            )
        async with streamsub.connect(url) as client:
            return await client.create_subscription(
                name,
                topic=topic,
                start=start,
                ack_deadline=ack_deadline,
                max_delivery_attempts=max_delivery_attempts,
                dead_letter_topic=dead_letter_topic,
                retry_policy=retry,
                enable_message_ordering=ordering,
                enable_exactly_once_delivery=exactly_once,
            )

    sub = run(main())
    out.print(f"subscription [bold]{sub.name}[/] on topic [bold]{sub.topic}[/] ready")


@sub_app.command("list")
def sub_list(
    topic: Annotated[
        str | None, typer.Option("--topic", help="Only subscriptions of this topic.")
    ] = None,
    url: Url = streamsub.DEFAULT_URL,
    as_json: Json = False,
) -> None:
    """List subscriptions."""

    async def main() -> list[Subscription]:
        async with streamsub.connect(url) as client:
            if topic is not None:
                await client.get_topic(topic)  # an unknown topic is an error, not "none"
            return await client.list_subscriptions(topic)

    subs = run(main())
    if as_json:
        _print_json([_subscription_json(s) for s in subs])
        return
    if not subs:
        err.print("no subscriptions; create one with: streamsub sub create NAME --topic TOPIC")
        return
    table = Table("subscription", "topic", "start", "ack deadline", "max attempts", "dead letter")
    for sub in subs:
        table.add_row(
            sub.name,
            sub.topic,
            sub.start,
            f"{sub.ack_deadline:g} s",
            str(sub.max_delivery_attempts),
            sub.dead_letter_topic or "-",
        )
    out.print(table)


@sub_app.command("describe")
def sub_describe(name: str, url: Url = streamsub.DEFAULT_URL, as_json: Json = False) -> None:
    """Show a subscription's settings, backlog and per-partition state."""

    async def main() -> tuple[Subscription, SubscriptionStats]:
        async with streamsub.connect(url) as client:
            sub = await client.get_subscription(name)
            return sub, await client.subscription_stats(name)

    sub, stats = run(main())
    if as_json:
        _print_json({**_subscription_json(sub), "stats": _stats_json(stats)})
        return
    retry = sub.retry_policy
    grid = Table.grid(padding=(0, 2))
    grid.add_row("[bold]subscription[/]", sub.name)
    grid.add_row("topic", sub.topic)
    grid.add_row("created", _when(sub.created))
    grid.add_row("start", sub.start)
    grid.add_row("ack deadline", f"{sub.ack_deadline:g} s")
    grid.add_row("max delivery attempts", str(sub.max_delivery_attempts))
    grid.add_row("dead-letter topic", sub.dead_letter_topic or "-")
    grid.add_row(
        "retry backoff",
        "-" if retry is None else f"{retry.minimum_backoff:g} s to {retry.maximum_backoff:g} s",
    )
    grid.add_row("message ordering", "on" if sub.enable_message_ordering else "off")
    grid.add_row("exactly once", "on" if sub.enable_exactly_once_delivery else "off")
    grid.add_row("", "")
    grid.add_row("[bold]messages[/]", f"{stats.messages:,}")
    grid.add_row("pending (unacked)", f"{stats.pending:,}")
    grid.add_row("lag (undelivered)", "?" if stats.lag is None else f"{stats.lag:,}")
    grid.add_row("consumers", str(stats.consumers))
    out.print(grid)
    columns = ["partition", "messages", "pending", "lag", "last delivered", "consumers"]
    if sub.enable_message_ordering:
        columns.append("owner (token)")
    table = Table(*columns)
    for p in stats.partitions:
        row = [
            str(p.partition),
            f"{p.length:,}",
            f"{p.pending:,}",
            "?" if p.lag is None else f"{p.lag:,}",
            p.last_delivered_id,
            str(p.consumers),
        ]
        if sub.enable_message_ordering:
            owner = stats.owners.get(p.partition)
            row.append("-" if owner is None else f"{owner[0]} ({owner[1]})")
        table.add_row(*row)
    out.print(table)


@sub_app.command("delete")
def sub_delete(name: str, url: Url = streamsub.DEFAULT_URL) -> None:
    """Delete a subscription (its topic keeps the messages)."""

    async def main() -> None:
        async with streamsub.connect(url) as client:
            await client.delete_subscription(name)

    run(main())
    out.print(f"subscription [bold]{name}[/] deleted")


# --- publish -----------------------------------------------------------------------
def _parse_attributes(values: list[str]) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{value!r} is not key=value", param_hint="--attr")
        attributes[key] = text
    return attributes


def _read_lines(stream: IO[bytes], count: int) -> tuple[list[bytes], int]:
    """Up to ``count`` lines without their line ends, and the bytes read."""
    lines: list[bytes] = []
    consumed = 0
    while len(lines) < count:
        line = stream.readline()
        if not line:
            break
        consumed += len(line)
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        lines.append(line)
    return lines, consumed


def _stdin_size(stream: IO[bytes]) -> int | None:
    """The bytes left in stdin when it is a regular file (for a real progress bar)."""
    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return max(0, os.fstat(fd).st_size - os.lseek(fd, 0, os.SEEK_CUR)) or None
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


@app.command()
def publish(
    topic: str,
    messages: Annotated[
        list[str] | None,
        typer.Argument(help="Messages to publish; without any, one per line from stdin."),
    ] = None,
    ordering_key: Annotated[
        str | None, typer.Option("--ordering-key", help="Ordering key of every message.")
    ] = None,
    attr: Annotated[
        list[str] | None,
        typer.Option("--attr", help="An attribute key=value of every message (repeatable)."),
    ] = None,
    as_json: Json = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the number published.")
    ] = False,
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Publish messages and print their ids, one per line."""
    if as_json and quiet:
        raise typer.BadParameter("use --json or --quiet, not both", param_hint="--quiet")
    attributes = _parse_attributes(attr or []) or None
    stream_ids = not (as_json or quiet)

    def outgoing(lines: list[bytes]) -> list[OutgoingMessage]:
        return [
            OutgoingMessage(data=line, ordering_key=ordering_key, attributes=attributes)
            for line in lines
        ]

    def emit(ids: list[str]) -> None:
        if stream_ids and ids:
            sys.stdout.write("\n".join(ids) + "\n")
            sys.stdout.flush()

    async def from_args(client: streamsub.Client, args: list[str]) -> list[str]:
        ids: list[str] = []
        for start in range(0, len(args), PUBLISH_CHUNK):
            chunk = [a.encode() for a in args[start : start + PUBLISH_CHUNK]]
            written = await client.publish_many(topic, outgoing(chunk))
            emit(written)
            ids += written
        return ids

    async def from_stdin(client: streamsub.Client) -> list[str]:
        stdin = sys.stdin.buffer
        if sys.stdin.isatty():
            err.print("reading messages from stdin, one per line; end with Ctrl-D")
        await client.get_topic(topic)  # fail before reading anything
        ids: list[str] = []
        progress = Progress(
            SpinnerColumn(),
            TextColumn("publishing to {task.fields[topic]}"),
            BarColumn(),
            TextColumn("{task.fields[published]:,} messages"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=sys.stdin.isatty() or not err.is_terminal,
        )
        with progress:
            task = progress.add_task("publish", total=_stdin_size(stdin), topic=topic, published=0)
            in_flight: list[asyncio.Task[list[str]]] = []
            while True:
                lines, consumed = await asyncio.to_thread(_read_lines, stdin, PUBLISH_CHUNK)
                if lines:
                    written_soon = client.publish_many(topic, outgoing(lines))
                    in_flight.append(asyncio.create_task(written_soon))
                while in_flight and (len(in_flight) >= PUBLISH_IN_FLIGHT or not lines):
                    written = await in_flight.pop(0)
                    emit(written)
                    ids += written
                progress.update(task, advance=consumed, published=len(ids))
                if not lines:
                    return ids

    async def main() -> list[str]:
        async with streamsub.connect(url) as client:
            if messages:
                return await from_args(client, messages)
            return await from_stdin(client)

    ids = run(main())
    if as_json:
        _print_json({"topic": topic, "count": len(ids), "ids": ids})
    elif quiet:
        sys.stdout.write(f"{len(ids)}\n")
    else:
        err.print(f"published {len(ids):,} message{'s' * (len(ids) != 1)} to {topic}")


# --- pull --------------------------------------------------------------------------
def _data_text(data: bytes) -> tuple[str, str]:
    """The data as text when it is UTF-8, else as base64, and which it is."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _message_json(message: Message) -> dict[str, object]:
    data, encoding = _data_text(message.data)
    return {
        "id": message.message_id,
        "delivery_attempt": message.delivery_attempt,
        "ordering_key": message.ordering_key,
        "attributes": message.attributes,
        "publish_time": message.publish_time,
        "data": data,
        "data_encoding": encoding,
    }


def _message_line(message: Message) -> Text:
    data, encoding = _data_text(message.data)
    line = Text()
    line.append(message.message_id, style="bold cyan")
    line.append(f"  attempt={message.delivery_attempt}")
    if message.ordering_key is not None:
        line.append(f"  key={message.ordering_key}", style="magenta")
    if message.attributes:
        line.append("  " + json.dumps(message.attributes, ensure_ascii=False), style="green")
    line.append("  ")
    line.append(f"base64:{data}" if encoding == "base64" else data)
    return line


@app.command()
def pull(
    subscription: str,
    count: Annotated[
        int, typer.Option("-n", "--max-messages", min=1, help="Stop after this many messages.")
    ] = 10,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Stop after this many seconds.")
    ] = 5.0,
    as_json: Json = False,
    metrics_port: MetricsPort = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
    url: Url = streamsub.DEFAULT_URL,
) -> None:
    """Receive up to N messages, print them and acknowledge them."""
    _serve_metrics(metrics_port, metrics_addr)
    received: list[Message] = []
    enough = asyncio.Event()

    async def handler(message: Message) -> None:
        if len(received) >= count:
            return  # read past what was asked: given back unacked when pull stops
        received.append(message)
        if not as_json:
            out.print(_message_line(message), soft_wrap=True)
        if len(received) >= count:
            enough.set()

    async def main() -> None:
        async with streamsub.connect(url) as client:
            subscriber = client.subscribe(
                subscription,
                handler,
                ack_mode="manual",
                flow_control=FlowControl(max_messages=count),
                shutdown_timeout=5.0,
            )
            async with subscriber:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(enough.wait(), timeout)
                # Acked together at the end: acking as they come frees flow-control
                # room, and the reader would take more than we print.
                for message in received:
                    message.ack()

    run(main())
    if as_json:
        _print_json([_message_json(m) for m in received])
    err.print(f"pulled and acked {len(received)} of at most {count} messages")


# --- demo ----------------------------------------------------------------------------
@app.command()
def demo(
    messages: Annotated[
        int, typer.Option("--messages", min=1, help="Messages to publish.")
    ] = 100_000,
    subscribers: Annotated[
        int, typer.Option("--subscribers", min=1, max=64, help="Subscriber processes.")
    ] = 3,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, max=1024, help="Partitions of the topic.")
    ] = 16,
    keys: Annotated[int, typer.Option("--keys", min=1, help="Distinct ordering keys.")] = 1000,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Give up waiting for delivery after (s).")
    ] = 120.0,
) -> None:
    """Publish to subscriber processes on an embedded server; report speed and loss.

    Needs nothing running: it starts a private redis-server in a temporary
    directory, and exits 1 if any published message was never delivered.
    """
    settings = DemoSettings(
        messages=messages,
        subscribers=subscribers,
        partitions=partitions,
        keys=keys,
        timeout=timeout,
    )
    started = time.monotonic()
    try:
        result = run_demo(settings, out)
    except StreamsubError as exc:
        # A bare StreamsubError here is the embedded redis-server not starting.
        code = exit_code(exc)
        fail(str(exc), EXIT_UNAVAILABLE if code == EXIT_FAILURE else code)
    except DemoError as exc:
        fail(str(exc), EXIT_FAILURE)
    except KeyboardInterrupt:
        err.print(Text("interrupted; everything is stopped", style="yellow"))
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if result.lost:
        fail(
            f"{result.lost:,} published messages were never delivered "
            f"(after {time.monotonic() - started:.1f} s)",
            EXIT_FAILURE,
        )


# --- gateway -------------------------------------------------------------------------
@app.command()
def gateway(
    redis: Annotated[
        str,
        typer.Option(
            "--redis",
            envvar="STREAMSUB_URL",
            help="Server URL: redis://host:port/db, rediss://... (TLS), unix:///path/redis.sock.",
        ),
    ] = streamsub.DEFAULT_URL,
    grpc_address: Annotated[
        str, typer.Option("--grpc", help="HOST:PORT for gRPC (PUBSUB_EMULATOR_HOST).")
    ] = "127.0.0.1:8085",
    http_address: Annotated[
        str, typer.Option("--http", help="HOST:PORT for REST and gRPC-Web ('off': none).")
    ] = "127.0.0.1:8086",
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions of topics created here.")
    ] = 16,
    metrics_port: MetricsPort = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
) -> None:
    """Serve the Google Cloud Pub/Sub API (google.pubsub.v1) on streamsub.

    Point PUBSUB_EMULATOR_HOST at the gRPC address and the official Pub/Sub
    clients work unchanged. SIGTERM or Ctrl-C stops it gracefully: streams are
    closed and their leases given back. --metrics-port serves the library's
    metrics and the gateway's own (streams open, opened).
    """
    import logging

    try:
        from .gateway import Gateway, serve_metrics
    except ImportError as exc:
        fail(
            f"the gateway needs the 'gateway' extra ({exc}): pip install 'streamsub[gateway]'",
            EXIT_BAD_INPUT,
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        server = Gateway(
            redis,
            grpc_address=grpc_address,
            http_address=None if http_address == "off" else http_address,
            partitions=partitions,
        )
        await server.start()
        metrics_server = None
        try:
            if metrics_port is not None:
                try:
                    metrics_server = serve_metrics(server, metrics_port, metrics_addr)
                except (OSError, streamsub.FailedPreconditionError) as exc:
                    fail(
                        f"cannot serve metrics on {metrics_addr}:{metrics_port}: {exc}",
                        EXIT_BAD_INPUT,
                    )
                logging.getLogger("streamsub.gateway").info(
                    "streamsub gateway: metrics on %s:%d/metrics", metrics_addr, metrics_port
                )
            await stop.wait()
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
            await server.stop()

    run(main())


def main() -> None:
    """The ``streamsub`` console script."""
    app()

"""Benchmark streamsub against a hand-written redis-py loop, FastStream and NATS JetStream.

Usage (from the repository root)::

    .venv/bin/python benchmarks/run.py [--messages N] [--rounds R] [--size BYTES]
                                       [--only name,name] [--cluster] [--json out.json]

One run starts one private redis-server (and one nats-server for the NATS peer),
runs every scenario ``--rounds`` times with the implementations interleaved
round-robin, and reports medians and ratios against the hand-written loop. With
``--cluster`` it also starts a private 3-master Redis Cluster and runs, beside
them, each implementation that has a cluster variant there, as ``name@cluster``
(ratios against ``handwritten@cluster``). See benchmarks/README.md for what each
implementation does and the fairness rules.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
# Benchmark the working tree's streamsub, installed or not. Spawned children
# inherit sys.path, so they import the same code.
for entry in (str(BENCH_DIR), str(REPO_SRC)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import paths  # noqa: E402
import plotting  # noqa: E402
import servers  # noqa: E402
from impls import BASELINE, CLUSTER, REGISTRY, baseline_of, instantiate, load_available  # noqa: E402
from impls.base import (  # noqa: E402
    MIN_SIZE,
    BenchmarkError,
    EndToEndResult,
    Env,
    Implementation,
    PublishResult,
)

SCENARIOS = ("publish", "e2e", *paths.PATH_SCENARIOS)
SCENARIO_TITLES = {
    "publish": "publish -- one process publishes n messages; n / elapsed",
    "e2e": "end to end -- concurrent publisher and consumer processes; "
    "n / (last ack - first publish)",
}


STARTED_AT = time.strftime("%Y-%m-%dT%H:%M:%S%z")
"""When this run began (the script was loaded), for its ``--json``."""


@dataclasses.dataclass
class Round:
    round: int
    position: int
    n: int
    elapsed_s: float
    throughput: float
    publisher_elapsed_s: float | None = None
    latencies_ms: dict[str, float] | None = None
    duplicates: int | None = None


@dataclasses.dataclass
class Series:
    """All rounds of one implementation in one scenario."""

    rounds: list[Round] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def median_throughput(self) -> float | None:
        return statistics.median(r.throughput for r in self.rounds) if self.rounds else None

    def median_latency(self, key: str) -> float | None:
        values = [r.latencies_ms[key] for r in self.rounds if r.latencies_ms]
        return statistics.median(values) if values else None


def parse_caps(text: str) -> dict[str, int]:
    caps: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            msg = f"expected NAME=N, got {item!r}"
            raise argparse.ArgumentTypeError(msg)
        caps[name.strip()] = int(count)
    return caps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario")
    parser.add_argument("--size", type=int, default=100, help="message body size in bytes")
    parser.add_argument(
        "--only",
        type=lambda s: [name.strip() for name in s.split(",") if name.strip()],
        default=list(REGISTRY),
        help=f"comma-separated implementations (default: all of {','.join(REGISTRY)})",
    )
    parser.add_argument(
        "--scenarios",
        type=lambda s: [name.strip() for name in s.split(",") if name.strip()],
        default=["publish", "e2e"],
        help="comma-separated scenarios: publish, e2e (the default), and the publish "
        "paths each, workers, many (see benchmarks/paths.py)",
    )
    parser.add_argument(
        "--latency-messages",
        type=int,
        default=2000,
        help="messages per round of the 'each' scenario (one awaited at a time)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also start a private 3-master Redis Cluster and run each implementation "
        "that has a cluster variant (handwritten, streamsub...) there, as name@cluster",
    )
    parser.add_argument("--json", type=Path, help="write every raw figure to this file")
    parser.add_argument(
        "--plot",
        type=Path,
        help="draw the workers and many paths (msgs/s per row) into this PNG, and "
        "each scenario that ran beside it: PATH-each.png (mean latency per row), "
        "PATH-publish.png and PATH-e2e.png (median msgs/s per row, ratio to handwritten)",
    )
    parser.add_argument(
        "--cap",
        type=parse_caps,
        default={},
        metavar="NAME=N[,NAME=N]",
        help="fewer messages for slow implementations, e.g. faststream=20000 "
        "(throughput stays comparable; saturated e2e latency does not)",
    )
    parser.add_argument(
        "--nats-storage",
        choices=("memory", "file"),
        default="memory",
        help="JetStream storage (default memory, like a redis-server that saves nothing)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed for one round of one impl"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in [*args.only, *args.cap] if name not in REGISTRY]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; choose from {list(REGISTRY)}")
    bad = [name for name in args.scenarios if name not in SCENARIOS]
    if bad:
        parser.error(f"unknown scenario(s) {bad}; choose from {list(SCENARIOS)}")
    if args.size < MIN_SIZE:
        parser.error(f"--size must be at least {MIN_SIZE} (the timestamp header)")
    if args.messages < 1 or args.rounds < 1:
        parser.error("--messages and --rounds must be positive")
    return args


def short_error(exc: BaseException) -> str:
    """The last meaningful line(s) of an error, which may carry a child's traceback."""
    text = str(exc) or type(exc).__name__
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" + (
        f" ... {lines[-1].strip()}" if len(lines) > 1 else ""
    )


async def run_round(
    impl: Implementation, scenario: str, n: int, size: int, timeout: float
) -> PublishResult | EndToEndResult:
    await impl.flush()
    await impl.reset()
    await impl.setup()
    if scenario == "publish":
        result = await impl.publish_in_child(n, size, timeout)
        stored = await impl.stored_count()  # the e2e consumer checks its own count
        if stored != n:
            msg = f"the server holds {stored} messages after {n} were published"
            raise BenchmarkError(msg)
        return result
    return await impl.end_to_end(n, size, timeout)


def describe(result: PublishResult | EndToEndResult) -> str:
    text = f"{result.throughput:>12,.0f} msgs/s  ({result.elapsed_s:.2f}s)"
    if isinstance(result, EndToEndResult):
        lat = result.latencies_ms
        text += (
            f"  p50 {lat['p50']:.1f} ms  p99 {lat['p99']:.1f} ms"
            f"  (publisher {result.n / result.publisher_elapsed_s:,.0f} msgs/s)"
        )
        if result.duplicates:
            text += f"  {result.duplicates} redeliveries"
    return text


async def run_scenarios(
    impls: dict[str, Implementation],
    counts: dict[str, int],
    args: argparse.Namespace,
) -> dict[str, dict[str, Series]]:
    results: dict[str, dict[str, Series]] = {}
    names = list(impls)
    width = max(13, *map(len, names))  # the rows' figures line up
    for scenario in [s for s in args.scenarios if s not in paths.PATH_SCENARIOS]:
        series = {name: Series() for name in names}
        results[scenario] = series
        for round_no in range(args.rounds):
            # Round-robin, rotated each round so no implementation always runs first.
            shift = round_no % len(names)
            order = names[shift:] + names[:shift]
            for position, name in enumerate(order):
                if series[name].error is not None:
                    continue
                label = (
                    f"[{scenario} {round_no + 1}/{args.rounds}] {name:<{width}} n={counts[name]:<7}"
                )
                print(label, end=" ", flush=True)
                started = time.monotonic()
                try:
                    result = await run_round(
                        impls[name], scenario, counts[name], args.size, args.timeout
                    )
                except Exception as exc:
                    series[name].error = "".join(traceback.format_exception(exc)).strip()
                    print(f"FAILED after {time.monotonic() - started:.1f}s: {short_error(exc)}")
                    print(f"{'':>{len(label)}} (no further {scenario} rounds for {name})")
                    continue
                print(describe(result))
                series[name].rounds.append(make_round(round_no, position, result))
    return results


def make_round(round_no: int, position: int, result: PublishResult | EndToEndResult) -> Round:
    entry = Round(
        round=round_no + 1,
        position=position,
        n=result.n,
        elapsed_s=result.elapsed_s,
        throughput=result.throughput,
    )
    if isinstance(result, EndToEndResult):
        entry.publisher_elapsed_s = result.publisher_elapsed_s
        entry.latencies_ms = result.latencies_ms
        entry.duplicates = result.duplicates
    return entry


def ratio_to_baseline(by_impl: dict[str, Series], name: str) -> float | None:
    """``name``'s median throughput over its baseline's (:func:`impls.baseline_of`)."""
    base = by_impl.get(baseline_of(name))
    tp, base_tp = by_impl[name].median_throughput, base.median_throughput if base else None
    return tp / base_tp if tp is not None and base_tp else None


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def report(console: Console, results: dict[str, dict[str, Series]], counts: dict[str, int]) -> None:
    for scenario, by_impl in results.items():
        is_e2e = scenario == "e2e"
        width = max(21, *map(len, by_impl))
        table = Table()
        table.add_column("implementation")
        table.add_column("n", justify="right")
        table.add_column("median msgs/s", justify="right")
        clustered = any(name.endswith(CLUSTER) for name in by_impl)
        table.add_column(f"vs {BASELINE}" + (f"[{CLUSTER}]" if clustered else ""), justify="right")
        if is_e2e:
            table.add_column("p50 ms", justify="right")
            table.add_column("p99 ms", justify="right")
        for name, series in by_impl.items():
            tp = series.median_throughput
            ratio = ratio_to_baseline(by_impl, name)
            row = [
                name,
                f"{counts[name]:,}",
                fmt(tp, ",.0f") if tp is not None or not series.error else "failed",
                fmt(ratio, ".2f") + ("x" if ratio is not None else ""),
            ]
            if is_e2e:
                row += [
                    fmt(series.median_latency("p50"), ".1f"),
                    fmt(series.median_latency("p99"), ".1f"),
                ]
            table.add_row(*row)
        console.print()
        console.print(SCENARIO_TITLES[scenario], markup=False, highlight=False)
        console.print(table)
        for name, series in by_impl.items():
            values = " · ".join(f"{r.throughput:,.0f}" for r in series.rounds) or "—"
            line = f"  {name:<{width}} rounds: {values} msgs/s"
            if is_e2e and series.rounds:
                lat = " · ".join(
                    f"{r.latencies_ms['p50']:.1f}/{r.latencies_ms['p99']:.1f}"
                    for r in series.rounds
                    if r.latencies_ms
                )
                line += f"   p50/p99 ms: {lat}"
            if series.error:
                line += (
                    "   (failed; see --json for the traceback)" if series.rounds else "   failed"
                )
            console.print(line, markup=False, highlight=False)


def to_json(
    args: argparse.Namespace,
    env: Env,
    counts: dict[str, int],
    skipped: dict[str, str],
    versions: dict[str, str],
    results: dict[str, dict[str, Series]],
    load_at_start: tuple[float, float, float],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "started_at": STARTED_AT,
        "config": {
            "messages": args.messages,
            "rounds": args.rounds,
            "size": args.size,
            "only": args.only,
            "scenarios": args.scenarios,
            "cap": args.cap,
            "nats_storage": env.nats_storage,
            "cluster": args.cluster,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_start": load_at_start,
            "loadavg_at_end": os.getloadavg(),
            "python": sys.version,
            "platform": platform.platform(),
        },
        "servers": versions,
        "messages_per_impl": counts,
        "skipped": skipped,
        "baseline": BASELINE,
        "scenarios": {},
    }
    for scenario, by_impl in results.items():
        out["scenarios"][scenario] = {
            name: {
                "median_throughput": series.median_throughput,
                "baseline": baseline_of(name),
                "ratio_vs_baseline": ratio_to_baseline(by_impl, name),
                "median_p50_ms": series.median_latency("p50"),
                "median_p99_ms": series.median_latency("p99"),
                "rounds": [dataclasses.asdict(r) for r in series.rounds],
                "error": series.error,
            }
            for name, series in by_impl.items()
        }
    return out


def plot_throughput(by_impl: dict[str, Any], scenario: str, path: Path) -> str | None:
    """One bar per implementation: its median msgs/s in ``scenario`` (``publish``
    or ``e2e``), annotated with the ratio to its baseline (``handwritten``, or
    ``handwritten@cluster`` for a cluster row: a cluster row is hatched, in its
    implementation's colour); from :func:`to_json`'s figures. The reason if not drawn."""
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    from matplotlib.ticker import StrMethodFormatter

    names = list(by_impl)
    if not names:
        return f"no {scenario} figures to draw"
    values = [by_impl[name]["median_throughput"] for name in names]
    fig, ax, bars = plotting.row_bars(plt, names, values, CLUSTER)
    texts = [None if value is None else f"{value:,.0f}" for value in values]
    ratios = [by_impl[name]["ratio_vs_baseline"] for name in names]
    plotting.label_bars(ax, bars, names, texts, ratios)
    ax.set_ylabel("msgs/s (median of rounds)")
    ax.set_title(
        ("End to end" if scenario == "e2e" else "Publish, as fast as it goes")
        + f"\n(ratio: msgs/s / {BASELINE}'s on the same servers)"
    )
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.2)
    plotting.save(plt, fig, path)
    return None


def draw(data: dict[str, Any], path: Path) -> list[str]:
    """Every plot the run's figures (:func:`to_json` and ``publish_paths``) allow:
    ``workers`` and ``many`` into ``path``; ``each``, ``publish`` and ``e2e`` each
    into a PNG of its own beside it (``path``'s name + ``-each``, ``-publish``,
    ``-e2e``). Returns what was written, or why not."""
    figures = data.get("publish_paths") or {}
    drawings: list[tuple[Path, Callable[[], str | None]]] = []
    if figures.get("workers") or figures.get("many"):
        drawings.append((path, functools.partial(paths.plot, figures, path)))
    if figures.get("each"):
        each = plotting.sibling(path, "each")
        drawings.append((each, functools.partial(paths.plot_each, figures, each)))
    for scenario, by_impl in data["scenarios"].items():
        target = plotting.sibling(path, scenario)
        drawings.append((target, functools.partial(plot_throughput, by_impl, scenario, target)))
    lines = []
    for target, draw_one in drawings:
        reason = draw_one()
        lines.append(
            f"plot not drawn ({target}): {reason}" if reason else f"plot written to {target}"
        )
    return lines


async def main_async(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=160)
    classes, skipped = load_available(args.only)
    found = servers.binaries(classes, skipped)
    if found is None:
        return 2
    redis_path, nats_path = found
    versions = servers.versions(redis_path, nats_path)

    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(servers.redis_server(redis_path))
        nats_url = stack.enter_context(servers.nats_server(nats_path)) if nats_path else None
        env = Env(redis_url=redis_url, nats_url=nats_url, nats_storage=args.nats_storage)
        cluster_url = (
            stack.enter_context(servers.redis_cluster(redis_path)) if args.cluster else None
        )
        cluster_env = Env(redis_url=cluster_url) if cluster_url else None
        impls = instantiate(classes, env, cluster_env)
        counts = {
            name: min(args.messages, args.cap.get(impl.name, args.messages))
            for name, impl in impls.items()
        }

        print(f"redis: {redis_url} ({versions['redis-server']})")
        if cluster_url:
            print(f"cluster: {cluster_url} ({servers.CLUSTER_MASTERS} masters, no replicas)")
        if nats_url:
            print(f"nats:  {nats_url} ({versions['nats-server']}, {args.nats_storage} storage)")
        load_at_start = os.getloadavg()
        print(
            f"{args.rounds} round(s), {args.size}-byte messages, {os.cpu_count()} cpus, "
            f"load {load_at_start[0]:.2f}; messages per round: "
            + ", ".join(f"{name}={count:,}" for name, count in counts.items())
        )

        results = await run_scenarios(impls, counts, args)
        path_results = await paths.run_paths(impls, args)

    report(console, results, counts)
    if path_results:
        print()
        print(paths.markdown(path_results))
        print("Rounds (msgs/s):")
        print(paths.rounds_text(path_results))
    data = to_json(args, env, counts, skipped, versions, results, load_at_start)
    data["publish_paths"] = paths.to_json(path_results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        print(f"\nraw figures written to {args.json}")
    if args.plot:
        for line in draw(data, args.plot):
            print(line)
    failed = any(series.error for by_impl in results.values() for series in by_impl.values())
    failed = failed or any(
        series.error
        for by_param in path_results.values()
        for by_row in by_param.values()
        for series in by_row.values()
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

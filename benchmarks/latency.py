"""End-to-end latency at steady publish rates, the subscriber in another process.

Usage (from the repository root)::

    .venv/bin/python benchmarks/latency.py [--rates 100,1000,10000] [--duration 5]
        [--warmup 1] [--rounds 3] [--only name,name] [--cluster] [--json out.json]
        [--plot out.png]

For each rate and implementation a round spawns a consumer process, waits until
it is subscribed, then spawns a publisher process that publishes at that steady
rate (:class:`~impls.base.PacedPublish`: an absolute schedule, bursts of what is
due, bursts not waiting for each other) for ``--warmup`` + ``--duration``
seconds. Every message carries its send time (``time.time_ns()``, the same
CLOCK_REALTIME in both processes); the consumer's handler records now minus that
time. Messages published during the warm-up are received but left out of the
percentiles. Rounds interleave the implementations and rotate who goes first;
the tables show medians over rounds of each percentile. With ``--cluster`` a
private 3-master Redis Cluster runs too, and each implementation that has a
cluster variant runs there as well, as ``name@cluster``; a second table sets
their percentiles against ``handwritten@cluster`` and against the same
implementation on the one server. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from array import array
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
# Benchmark the working tree's streamsub; spawned children inherit sys.path.
for entry in (str(BENCH_DIR), str(REPO_SRC)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import plotting  # noqa: E402
import servers  # noqa: E402
from impls import CLUSTER, REGISTRY, baseline_of, instantiate, load_available  # noqa: E402
from impls.base import (  # noqa: E402
    MIN_SIZE,
    Env,
    Implementation,
    PacedPublish,
    PacedResult,
    latency_summary,
    run_pair,
)

RATES = (100, 1_000, 10_000)
DEFAULT_ONLY = ("handwritten", "streamsub", "streamsub-ordered", "faststream", "nats")
COLUMNS = ("p50", "p90", "p99", "max")
TARGET_RATE = 1_000
TARGET_P99_MS = 5.0
"""Issue 11: p99 at most 5 ms at a steady 1,000 msg/s, the subscriber in another process."""


STARTED_AT = time.strftime("%Y-%m-%dT%H:%M:%S%z")
"""When this run began (the script was loaded), for its ``--json``."""


@dataclasses.dataclass
class LatencyRound:
    round: int
    position: int
    measured: int
    """Messages in the percentiles: those published after the warm-up."""
    latencies_ms: dict[str, float]
    publisher_rate: float
    bursts: int
    max_in_flight: int
    publisher_lateness_ms: dict[str, float]
    duplicates: int
    loadavg_1m: float


@dataclasses.dataclass
class LatencySeries:
    rounds: list[LatencyRound] = dataclasses.field(default_factory=list)
    error: str | None = None

    def median(self, key: str) -> float | None:
        values = [r.latencies_ms[key] for r in self.rounds]
        return statistics.median(values) if values else None

    def median_lateness(self, key: str) -> float | None:
        values = [r.publisher_lateness_ms[key] for r in self.rounds]
        return statistics.median(values) if values else None

    def median_rate(self) -> float | None:
        values = [r.publisher_rate for r in self.rounds]
        return statistics.median(values) if values else None


Results = dict[int, dict[str, LatencySeries]]
"""rate -> implementation -> rounds."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def names(text: str) -> list[str]:
        return [name.strip() for name in text.split(",") if name.strip()]

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates",
        type=lambda s: [int(r) for r in names(s)],
        default=list(RATES),
        help="steady publish rates in msg/s (default 100,1000,10000)",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per round")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds published first, left out of the figures"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per rate")
    parser.add_argument("--size", type=int, default=100, help="message body size in bytes")
    parser.add_argument(
        "--only",
        type=names,
        default=list(DEFAULT_ONLY),
        help=f"comma-separated implementations (default: {','.join(DEFAULT_ONLY)})",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also start a private 3-master Redis Cluster and run each implementation "
        "that has a cluster variant there, as name@cluster",
    )
    parser.add_argument("--json", type=Path, help="write every raw figure to this file")
    parser.add_argument("--plot", type=Path, help="draw p50 and p99 per rate into this PNG")
    parser.add_argument(
        "--nats-storage", choices=("memory", "file"), default="memory", help="JetStream storage"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds one round may take beyond its schedule",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in REGISTRY]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; choose from {list(REGISTRY)}")
    if args.size < MIN_SIZE:
        parser.error(f"--size must be at least {MIN_SIZE} (the timestamp header)")
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0 or not args.rates:
        parser.error("--rounds, --duration and --rates must be positive, --warmup not negative")
    if any(rate <= 0 for rate in args.rates):
        parser.error("every rate must be positive")
    return args


async def one_round(
    impl: Implementation,
    rate: int,
    args: argparse.Namespace,
    round_no: int,
    position: int,
) -> LatencyRound:
    await impl.flush()
    await impl.reset()
    await impl.setup()
    job = PacedPublish(rate=rate, seconds=args.warmup + args.duration, size=args.size)
    timeout = args.warmup + args.duration + args.timeout
    published, result = await run_pair(impl, job.n, timeout, job)
    assert isinstance(published, PacedResult)
    warm = round(rate * args.warmup)
    measured = array(
        "q", (lat for lat, seq in zip(result.latencies_ns, result.seqs, strict=True) if seq >= warm)
    )
    return LatencyRound(
        round=round_no,
        position=position,
        measured=len(measured),
        latencies_ms=latency_summary(measured),
        publisher_rate=published.rate,
        bursts=published.bursts,
        max_in_flight=published.max_in_flight,
        publisher_lateness_ms=published.lateness_ms,
        duplicates=result.deliveries - result.distinct,
        loadavg_1m=os.getloadavg()[0],
    )


async def run_rounds(impls: dict[str, Implementation], args: argparse.Namespace) -> Results:
    results: Results = {rate: {name: LatencySeries() for name in impls} for rate in args.rates}
    names = list(impls)
    for round_no in range(1, args.rounds + 1):
        shift = (round_no - 1) % len(names)
        order = names[shift:] + names[:shift]
        for rate in args.rates:
            for position, name in enumerate(order, 1):
                series = results[rate][name]
                if series.error is not None:
                    continue
                label = f"[round {round_no}/{args.rounds}] {rate:>6,} msg/s {name:<26}"
                print(label, end=" ", flush=True)
                started = time.monotonic()
                try:
                    got = await one_round(impls[name], rate, args, round_no, position)
                except Exception as exc:
                    series.error = short_error(exc)
                    print(f"FAILED after {time.monotonic() - started:.1f}s: {series.error}")
                    continue
                lat = got.latencies_ms
                print(
                    f"p50 {lat['p50']:8.2f}  p90 {lat['p90']:8.2f}  p99 {lat['p99']:8.2f}  "
                    f"max {lat['max']:8.2f} ms  (sent {got.publisher_rate:,.0f}/s, "
                    f"late p99 {got.publisher_lateness_ms['p99']:.2f} ms, "
                    f"load {got.loadavg_1m:.2f})"
                )
                series.rounds.append(got)
    return results


def short_error(exc: BaseException) -> str:
    lines = [line for line in (str(exc) or type(exc).__name__).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" + (
        f" ... {lines[-1].strip()}" if len(lines) > 1 else ""
    )


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def report(console: Console, results: Results) -> None:
    table = Table(title="end-to-end latency at steady rates (ms; medians over rounds)")
    for column in (
        "implementation",
        "rate msg/s",
        *COLUMNS,
        "sent msg/s",
        "late p99",
        "rounds' p99",
    ):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for rate, by_impl in results.items():
        for name, series in by_impl.items():
            if series.error is not None and not series.rounds:
                table.add_row(name, f"{rate:,}", "failed", *[""] * 6)
                continue
            table.add_row(
                name,
                f"{rate:,}",
                *(fmt(series.median(c)) for c in COLUMNS),
                fmt(series.median_rate()),
                fmt(series.median_lateness("p99")),
                " · ".join(fmt(r.latencies_ms["p99"]) for r in series.rounds),
            )
        table.add_section()
    console.print(table)
    for rate, by_impl in results.items():
        for name, series in by_impl.items():
            if series.error:
                console.print(f"{name} at {rate:,} msg/s failed: {series.error}")
    print()
    print(markdown(results))


def markdown(results: Results) -> str:
    """The table, as Markdown for benchmarks/README.md."""
    out = [
        "| implementation | rate msg/s | p50 ms | p90 ms | p99 ms | max ms | rounds' p99 ms |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for rate, by_impl in results.items():
        for name, series in by_impl.items():
            if not series.rounds:
                out.append(f"| {name} | {rate:,} | failed | | | | |")
                continue
            cells = " | ".join(fmt(series.median(c)) for c in COLUMNS)
            rounds = " · ".join(fmt(r.latencies_ms["p99"]) for r in series.rounds)
            out.append(f"| {name} | {rate:,} | {cells} | {rounds} |")
    return "\n".join(out + cluster_ratios(results))


def cluster_ratios(results: Results) -> list[str]:
    """Each cluster row's median p50 and p99 over ``handwritten@cluster``'s and
    over the same implementation's on the one server (above 1: slower)."""
    rows = [
        (rate, name)
        for rate, by_impl in results.items()
        for name in by_impl
        if name.endswith(CLUSTER)
    ]
    if not rows:
        return []
    out = [
        "",
        "| implementation | rate msg/s | p50 / handwritten@cluster | p99 / handwritten@cluster "
        "| p50 / one server | p99 / one server |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def ratio(rate: int, name: str, other: str, key: str) -> str:
        mine, theirs = results[rate][name], results[rate].get(other)
        value, base = mine.median(key), theirs.median(key) if theirs else None
        return f"{value / base:.2f}x" if value is not None and base else "—"

    for rate, name in rows:
        cells = [
            ratio(rate, name, other, key)
            for other in (baseline_of(name), name.removesuffix(CLUSTER))
            for key in ("p50", "p99")
        ]
        out.append(f"| {name} | {rate:,} | " + " | ".join(cells) + " |")
    return out


def plot(results: Results, path: Path) -> str | None:
    """p50 and p99 against rate, one line per implementation; the reason if not drawn."""
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    names = list(next(iter(results.values())))
    for ax, key in zip(axes, ("p50", "p99"), strict=True):
        for name in names:
            points = [
                (rate, value)
                for rate, by_impl in results.items()
                if (value := by_impl[name].median(key)) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=name)
        if key == "p99":
            ax.axhline(TARGET_P99_MS, color="grey", linestyle="--", linewidth=1)
            ax.annotate(
                f"target p99 ≤ {TARGET_P99_MS:g} ms at {TARGET_RATE:,} msg/s",
                (TARGET_RATE, TARGET_P99_MS),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
                color="grey",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(list(results), [f"{rate:,}" for rate in results])
        ax.set_xlabel("steady publish rate (msg/s)")
        ax.set_title(f"{key} end-to-end latency")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms (median of rounds)")
    axes[1].legend(fontsize=8)
    plotting.save(plt, fig, path)
    return None


def to_json(
    args: argparse.Namespace,
    versions: dict[str, str],
    skipped: dict[str, str],
    results: Results,
    load_at_start: tuple[float, float, float],
) -> dict[str, Any]:
    return {
        "started_at": STARTED_AT,
        "config": {
            "rates": args.rates,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "size": args.size,
            "only": args.only,
            "nats_storage": args.nats_storage,
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
        "skipped": skipped,
        "rates": {
            str(rate): {
                name: {
                    **{f"median_{c}_ms": series.median(c) for c in COLUMNS},
                    "rounds": [dataclasses.asdict(r) for r in series.rounds],
                    "error": series.error,
                }
                for name, series in by_impl.items()
            }
            for rate, by_impl in results.items()
        },
    }


async def main_async(args: argparse.Namespace) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=160)
    classes, skipped = load_available(
        args.only, lambda cls: None if cls.sends() else "no paced sender"
    )
    found = servers.binaries(classes, skipped)
    if found is None:
        return 2
    redis_path, nats_path = found
    versions = servers.versions(redis_path, nats_path)

    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(servers.redis_server(redis_path))
        nats_url = stack.enter_context(servers.nats_server(nats_path)) if nats_path else None
        env = Env(redis_url=redis_url, nats_url=nats_url, nats_storage=args.nats_storage)
        cluster_env = (
            Env(redis_url=stack.enter_context(servers.redis_cluster(redis_path)))
            if args.cluster
            else None
        )
        impls = instantiate(classes, env, cluster_env)
        load_at_start = os.getloadavg()
        print(
            f"redis {versions['redis-server'].split()[2]}"
            + (f" (and a {servers.CLUSTER_MASTERS}-master cluster)" if cluster_env else "")
            + f", rates {args.rates} msg/s, "
            f"{args.warmup:g} s warm-up + {args.duration:g} s measured, {args.rounds} round(s), "
            f"{args.size}-byte messages, {os.cpu_count()} cpus, load {load_at_start[0]:.2f}"
        )
        results = await run_rounds(impls, args)

    load_at_end = os.getloadavg()
    report(console, results)
    print(
        f"\nload average (1, 5, 15 min): at start {', '.join(f'{x:.2f}' for x in load_at_start)}; "
        f"at end {', '.join(f'{x:.2f}' for x in load_at_end)}"
    )
    if args.plot:
        not_drawn = plot(results, args.plot)
        print(f"plot not drawn: {not_drawn}" if not_drawn else f"plot written to {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = to_json(args, versions, skipped, results, load_at_start)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        print(f"raw figures written to {args.json}")
    failed = any(series.error for by_impl in results.values() for series in by_impl.values())
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

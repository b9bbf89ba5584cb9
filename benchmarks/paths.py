"""Publishing as users publish: the publish-path scenarios of benchmarks/run.py.

* ``each``    -- one caller awaiting each publish in turn (a request handler);
  per-publish latency, against one redis-py ``XADD`` awaited in turn.
* ``workers`` -- N concurrent callers (a worker pool over a shared counter),
  each awaiting its publishes one by one, N in :data:`WORKERS`.
* ``many``    -- the library's batch call of K messages (``publish_many``, a
  pipeline), calls one after the other, K in :data:`PER_CALL`.

``workers`` and ``many`` are compared with the hand-written pipelined loop
(``XADD`` pipelined 200 at a time: the ``publish`` scenario's baseline), run as
its own row in every round. Rounds interleave the implementations and rotate
who goes first, as the other scenarios do; the tables show medians of the
rounds and ratios of medians.

With ``run.py --cluster`` the rows ``name@cluster`` run on a private Redis
Cluster; their ratios are to the hand-written loop on the cluster
(``handwritten@cluster``, ``pipelined-200@cluster``), and a last table sets
each cluster row against the same implementation on the one server.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import plotting
from impls import BASELINE, CLUSTER, baseline_of
from impls.base import WARMUP, BenchmarkError, Implementation, PathResult

PATH_SCENARIOS = ("each", "workers", "many")
WORKERS = (1, 10, 100, 500, 1000)
PER_CALL = (10, 100, 1000, 10_000)
PIPELINED = "pipelined-200"
"""The row of the hand-written pipelined loop, the baseline of ``workers`` and
``many`` (``pipelined-200@cluster`` on the cluster)."""

_METHOD = {"each": "each", "workers": "workers", "many": "calls"}


@dataclasses.dataclass
class PathRound:
    round: int
    throughput: float
    elapsed_s: float
    latencies_ms: dict[str, float] | None = None


@dataclasses.dataclass
class PathSeries:
    rounds: list[PathRound] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(r.throughput for r in self.rounds) if self.rounds else None

    def median_latency(self, key: str) -> float | None:
        values = [r.latencies_ms[key] for r in self.rounds if r.latencies_ms]
        return statistics.median(values) if values else None


Results = dict[str, dict[int, dict[str, PathSeries]]]
"""scenario -> parameter (N, K; 1 for ``each``) -> row -> rounds."""


def params(scenario: str) -> tuple[int, ...]:
    return {"each": (1,), "workers": WORKERS, "many": PER_CALL}[scenario]


def pipelined(row: str) -> bool:
    """Whether ``row`` is a pipelined loop's (on the one server or the cluster)."""
    return row.removesuffix(CLUSTER) == PIPELINED


def pipelined_of(row: str) -> str:
    """The pipelined loop's row on the servers ``row`` runs on."""
    return PIPELINED + CLUSTER if row.endswith(CLUSTER) else PIPELINED


def impl_of(row: str) -> str:
    """The implementation that runs ``row``: a pipelined row is the hand-written loop's."""
    return baseline_of(row) if pipelined(row) else row


async def _one(
    impl: Implementation,
    row: str,
    scenario: str,
    param: int,
    n: int,
    args: Any,
) -> PathResult:
    await impl.flush()
    await impl.reset()
    await impl.setup()
    if pipelined(row):
        result = await impl.publish_in_child(n, args.size, args.timeout)
        out = PathResult(n=n, elapsed_s=result.elapsed_s)
        expected = n
    else:
        out = await impl.path_in_child(_METHOD[scenario], param, n, args.size, args.timeout)
        expected = n + WARMUP
    stored = await impl.stored_count()
    if stored != expected:
        msg = f"the server holds {stored} messages, expected {expected}"
        raise BenchmarkError(msg)
    return out


async def run_paths(impls: dict[str, Implementation], args: Any) -> Results:
    results: Results = {}
    for scenario in [s for s in args.scenarios if s in PATH_SCENARIOS]:
        base_n = args.latency_messages if scenario == "each" else args.messages
        rows = [name for name, impl in impls.items() if impl.publishes(_METHOD[scenario])]
        if scenario != "each":
            rows += [pipelined_of(row) for row in impls if row.removesuffix(CLUSTER) == BASELINE]
        by_param: dict[int, dict[str, PathSeries]] = {}
        results[scenario] = by_param
        for param in params(scenario):
            by_param[param] = {row: PathSeries() for row in rows}
        for round_no in range(args.rounds):
            for param in params(scenario):
                series = by_param[param]
                names = list(series)
                shift = round_no % len(names)
                for row in names[shift:] + names[:shift]:
                    if series[row].error is not None:
                        continue
                    if pipelined(row) and param != params(scenario)[0]:
                        # One pipelined run a round serves every parameter.
                        first = by_param[params(scenario)[0]][row].rounds
                        if len(first) > round_no:
                            series[row].rounds.append(first[round_no])
                        continue
                    impl = impls[impl_of(row)]
                    n = min(base_n, args.cap.get(impl.name, base_n))
                    label = f"[{scenario} {round_no + 1}/{args.rounds}] {row:<23} {param:>6} n={n}"
                    print(label, end=" ", flush=True)
                    started = time.monotonic()
                    try:
                        result = await _one(impl, row, scenario, param, n, args)
                    except Exception as exc:
                        series[row].error = f"{type(exc).__name__}: {exc}"
                        print(f"FAILED after {time.monotonic() - started:.1f}s: {exc}")
                        continue
                    text = f"{result.throughput:>10,.0f} msgs/s"
                    if result.latencies_ms:
                        lat = result.latencies_ms
                        text += f"  mean {lat['mean']:.3f} ms  p50 {lat['p50']:.3f}"
                        text += f"  p99 {lat['p99']:.3f}"
                    print(text)
                    series[row].rounds.append(
                        PathRound(
                            round_no + 1,
                            result.throughput,
                            result.elapsed_s,
                            result.latencies_ms,
                        )
                    )
    return results


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def markdown(results: Results) -> str:
    """The tables, as Markdown for benchmarks/README.md. Every ratio is to the
    hand-written loop on the same servers (one server, or the cluster)."""
    out: list[str] = []
    each = results.get("each", {}).get(1)
    if each:
        out += [
            "**each** -- one caller awaiting each publish (ratio: mean latency / one XADD's)",
            "",
            "| implementation | msgs/s | mean ms | p50 ms | p99 ms | latency vs XADD |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row, series in each.items():
            base = each.get(baseline_of(row))
            mean = series.median_latency("mean")
            ratio = _ratio(mean, base.median_latency("mean") if base else None)
            out.append(
                f"| {row} | {_fmt(series.median, ',.0f')} | {_fmt(mean, '.3f')} | "
                f"{_fmt(series.median_latency('p50'), '.3f')} | "
                f"{_fmt(series.median_latency('p99'), '.3f')} | {_fmt(ratio, '.2f')}x |"
            )
        out.append("")
    for scenario, title in (
        ("workers", "**workers** -- N concurrent callers, each awaiting `publish()`"),
        ("many", "**many** -- batch calls of K messages, one after the other"),
    ):
        by_param = results.get(scenario)
        if not by_param:
            continue
        rows = list(next(iter(by_param.values())))
        label = "N" if scenario == "workers" else "K"
        out += [
            f"{title}: median msgs/s (ratio to the pipelined loop)",
            "",
            "| implementation | " + " | ".join(f"{label}={p:,}" for p in by_param) + " |",
            "|---|" + "---:|" * len(by_param),
        ]
        for row in rows:
            cells = []
            for series_by_row in by_param.values():
                series = series_by_row[row]
                base = series_by_row.get(pipelined_of(row))
                ratio = _ratio(series.median, base.median if base else None)
                cells.append(
                    ("failed" if series.error else _fmt(series.median, ",.0f"))
                    + (f" ({ratio:.2f}x)" if ratio else "")
                )
            out.append(f"| {row} | " + " | ".join(cells) + " |")
        out.append("")
    out += _cluster_against_one_server(results)
    return "\n".join(out)


def _cluster_against_one_server(results: Results) -> list[str]:
    """Each cluster row against the same row on the one server: for ``each`` the
    ratio of mean latencies, else of msgs/s."""
    columns = [
        (scenario, param)
        for scenario, by_param in results.items()
        for param in by_param
        if any(row.endswith(CLUSTER) for row in by_param[param])
    ]
    if not columns:
        return []
    rows = list(
        dict.fromkeys(
            row
            for scenario, param in columns
            for row in results[scenario][param]
            if row.endswith(CLUSTER) and row.removesuffix(CLUSTER) in results[scenario][param]
        )
    )
    names = {"each": "each (latency)", "workers": "N={:,}", "many": "K={:,}"}
    out = [
        "**cluster / one server** -- each row on the cluster against the same row on the "
        "one server: `each` the ratio of mean latencies (above 1: slower), "
        "`workers` and `many` of msgs/s (below 1: slower)",
        "",
        "| implementation | " + " | ".join(names[s].format(p) for s, p in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for row in rows:
        cells = []
        for scenario, param in columns:
            by_row = results[scenario][param]
            cluster, one = by_row.get(row), by_row.get(row.removesuffix(CLUSTER))
            if cluster is None or one is None:
                ratio = None
            elif scenario == "each":
                ratio = _ratio(cluster.median_latency("mean"), one.median_latency("mean"))
            else:
                ratio = _ratio(cluster.median, one.median)
            cells.append(_fmt(ratio, ".2f") + ("x" if ratio else ""))
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def rounds_text(results: Results) -> str:
    """Every round's figure, for the record under the tables."""
    lines = []
    for scenario, by_param in results.items():
        for param, by_row in by_param.items():
            for row, series in by_row.items():
                figures = " · ".join(f"{r.throughput:,.0f}" for r in series.rounds) or "—"
                error = f"  (failed: {series.error})" if series.error else ""
                lines.append(f"  {scenario} {param:>6} {row:<26} {figures}{error}")
    return "\n".join(lines)


def to_json(results: Results) -> dict[str, Any]:
    return {
        scenario: {
            str(param): {
                row: {
                    "median_throughput": series.median,
                    "median_mean_latency_ms": series.median_latency("mean"),
                    "rounds": [dataclasses.asdict(r) for r in series.rounds],
                    "error": series.error,
                }
                for row, series in by_row.items()
            }
            for param, by_row in by_param.items()
        }
        for scenario, by_param in results.items()
    }


def plot(figures: dict[str, Any], path: Path) -> str | None:
    """Draw ``workers`` (msgs/s against N callers) and ``many`` (against K per
    call), one line per row, from :func:`to_json`'s figures (a run's, or a
    saved ``--json`` file's ``publish_paths``); return the reason if not drawn."""
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    panels = [(s, figures[s]) for s in ("workers", "many") if figures.get(s)]
    if not panels:
        return "no workers or many figures to draw"
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (scenario, by_param) in zip(axes[0], panels, strict=True):
        params = sorted(int(param) for param in by_param)
        rows = list(dict.fromkeys(row for by_row in by_param.values() for row in by_row))
        for row in rows:
            points = [
                (param, value)
                for param in params
                if (value := by_param[str(param)].get(row, {}).get("median_throughput"))
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                dashed = row.startswith(PIPELINED)
                ax.plot(xs, ys, marker="o", linestyle="--" if dashed else "-", label=row)
        ax.set_xscale("log")
        ax.set_xticks(params, [f"{param:,}" for param in params])
        workers = scenario == "workers"
        ax.set_xlabel("concurrent publish() callers" if workers else "messages per call")
        ax.set_ylabel("msgs/s (median of rounds)")
        ax.set_title("N callers awaiting publish()" if workers else "publish_many of K, in turn")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    plotting.save(plt, fig, path)
    return None


def plot_each(figures: dict[str, Any], path: Path) -> str | None:
    """Draw ``each``: one bar per row, its mean publish latency (median of the
    rounds' means), annotated with the ratio to one ``XADD``'s on the same
    servers, and the rounds' median p99 as a mark; from :func:`to_json`'s
    figures. Return the reason if not drawn."""
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    by_row = figures.get("each", {}).get("1")
    if not by_row:
        return "no each figures to draw"
    rows = list(by_row)
    means = [by_row[row]["median_mean_latency_ms"] for row in rows]
    p99s = [
        statistics.median(values)
        if (
            values := [r["latencies_ms"]["p99"] for r in by_row[row]["rounds"] if r["latencies_ms"]]
        )
        else None
        for row in rows
    ]
    fig, ax, bars = plotting.row_bars(plt, rows, means, CLUSTER)
    marks = [(i, p99) for i, p99 in enumerate(p99s) if p99 is not None]
    if marks:
        xs, ys = zip(*marks, strict=True)
        ax.plot(xs, ys, linestyle="", marker="_", markersize=18, color="black", label="p99")
        ax.legend(fontsize=8)
    ratios = [
        _ratio(mean, by_row.get(baseline_of(row), {}).get("median_mean_latency_ms"))
        for row, mean in zip(rows, means, strict=True)
    ]
    texts = [None if mean is None else f"{mean:.3f} ms" for mean in means]
    plotting.label_bars(ax, bars, rows, texts, ratios)
    ax.set_ylabel("ms per publish (mean; median of rounds)")
    ax.set_title(
        "One caller awaiting each publish\n(ratio: mean latency / one XADD's on the same servers)"
    )
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.2)
    plotting.save(plt, fig, path)
    return None


if __name__ == "__main__":  # draw a saved run: python benchmarks/paths.py RUN.json OUT.png
    import json
    import sys

    reason = plot(json.loads(Path(sys.argv[1]).read_text())["publish_paths"], Path(sys.argv[2]))
    raise SystemExit(reason)

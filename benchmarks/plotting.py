"""matplotlib for the benchmarks' ``--plot`` options, imported only when a plot is drawn.

Every figure is drawn off-screen (the Agg backend) and saved as a PNG. Without
matplotlib (``pip install -e '.[bench]'``) a plot is not drawn and the runner
says why; the run's tables and ``--json`` are unaffected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MISSING = "matplotlib is not installed (pip install -e '.[bench]')"
DPI = 110


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend, or None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(plt: Any, fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` (a PNG) and free it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def sibling(path: Path, suffix: str) -> Path:
    """``out.png`` with ``suffix`` before its extension: ``out-each.png``."""
    return path.with_name(f"{path.stem}-{suffix}{path.suffix or '.png'}")


def label_bars(
    ax: Any, bars: Any, rows: list[str], texts: list[str | None], ratios: list[float | None]
) -> None:
    """Name ``bars`` by ``rows`` and write above each its text and ratio
    ("failed" for a row without figures), small and centred."""
    for bar, text, ratio in zip(bars, texts, ratios, strict=True):
        label = "failed" if text is None else text + (f"\n{ratio:.2f}x" if ratio else "")
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(range(len(rows)), rows, rotation=20, ha="right")


def row_bars(
    plt: Any, rows: list[str], values: list[float | None], cluster: str
) -> tuple[Any, Any, Any]:
    """A figure with one bar per row (``None``: an empty bar); a row and its
    ``cluster``-suffixed twin share a colour, the twin hatched. Returns the
    figure, its axes and the bars."""
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(rows) + 2), 4.5))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    impls = list(dict.fromkeys(row.removesuffix(cluster) for row in rows))
    bars = ax.bar(
        range(len(rows)),
        [value or 0.0 for value in values],
        color=[palette[impls.index(row.removesuffix(cluster)) % len(palette)] for row in rows],
        hatch=["//" if row.endswith(cluster) else "" for row in rows],
        edgecolor="white",
    )
    return fig, ax, bars

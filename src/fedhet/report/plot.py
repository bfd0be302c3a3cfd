"""Learning curves: a metric of the "avg" client vs round, mean over seeds with a ±std band per method."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedhet.atomic import atomic_write
from fedhet.report.runs import RunRecord
from fedhet.report.stats import mean_std
from fedhet.report.table import AVG, is_percent


def curve_stats(
    runs: Sequence[RunRecord], metric: str = "accuracy", client: str = AVG, split: str = "test"
) -> tuple[list[int], list[float], list[float], list[int]]:
    """(rounds, mean, std, n) over runs at every round any of them logged; std is 0 where n=1."""
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for r, v in zip(*run.curve(metric, client, split), strict=True):
            if not math.isnan(v):
                per_round.setdefault(r, []).append(v)
    rounds = sorted(per_round)
    stats = [mean_std(per_round[r]) for r in rounds]
    means = [m for m, _ in stats]
    stds = [0.0 if math.isnan(s) else s for _, s in stats]
    return rounds, means, stds, [len(per_round[r]) for r in rounds]


def plot_curves(
    runs: Sequence[RunRecord],
    path: str | os.PathLike[str],
    metric: str = "accuracy",
    split: str = "test",
    client: str = AVG,
    by: str = "method",
) -> Path:
    """One subplot per dataset, one line per method (mean over seeds, shaded ±sample std); saved atomically.

    Uses the Agg canvas directly (no pyplot state). The file format follows the suffix of `path`.
    """
    groups: dict[str, dict[str, list[RunRecord]]] = {}
    for run in runs:
        label = run.label if by == "method" else (run.name or run.label)
        groups.setdefault(run.dataset, {}).setdefault(label, []).append(run)
    n = max(len(groups), 1)
    cols = min(n, 3)
    nrows = math.ceil(n / cols)
    fig = Figure(figsize=(5.0 * cols, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    scale = 100.0 if is_percent(metric) else 1.0
    for i, (dataset, methods) in enumerate(groups.items() or [("(no runs)", {})]):
        ax = fig.add_subplot(nrows, cols, i + 1)
        drawn = False
        for method, group in methods.items():
            rounds, means, stds, counts = curve_stats(group, metric, client, split)
            if not rounds:
                continue
            lo = [(m - s) * scale for m, s in zip(means, stds, strict=True)]
            hi = [(m + s) * scale for m, s in zip(means, stds, strict=True)]
            (line,) = ax.plot(rounds, [m * scale for m in means], label=f"{method} (n={max(counts)})")
            ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn = True
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no per-round metrics", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(dataset)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{client} {split} {metric}" + (" (%)" if scale == 100.0 else ""))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fmt = Path(path).suffix.lstrip(".") or "png"
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120))

"""Anytime curves of a tuned sweep: the best validation loss any configuration reached so far vs the client-rounds
the tuning had spent by then, read from each tuning job's `tune/members.jsonl` (one line per round and member:
`client_rounds`, the clients trained so far by all members together; in a log without it, the length of `local`,
the local vectors of the clients the member trained that round, 0 for a member no longer alive)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedhet.atomic import atomic_write
from fedhet.errors import FedhetError
from fedhet.yaml_input import JSONDict

MEMBERS_LOG = Path("tune") / "members.jsonl"


def _lines(path: Path) -> list[JSONDict]:
    """The member log's lines (a truncated last line, from a stopped job, is left out)."""
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i < len(lines):
                raise FedhetError(f"corrupt JSON in {path} line {i}: {e.msg}; resume the tuning job to rewrite "
                                  "it, or delete the tuning folder to tune again") from e
    return rows


def anytime_curve(members_log: Path) -> tuple[list[int], list[float]]:
    """(client-rounds spent, best validation loss so far) after every round in which some member had a finite
    score: x = running sum over rounds of the members' trained clients; y = running minimum of the scores (a
    diverged member's +inf never counts), so y never rises. ([], []) without a log."""
    if not members_log.is_file():
        return [], []
    by_round: dict[int, list[JSONDict]] = {}
    for row in _lines(members_log):
        by_round.setdefault(int(row["round"]), []).append(row)
    spent, best = 0, math.inf
    xs: list[int] = []
    ys: list[float] = []
    for rnd in sorted(by_round):
        rows = by_round[rnd]
        recorded = [r["client_rounds"] for r in rows if isinstance(r.get("client_rounds"), int)]
        spent = max(recorded) if recorded else spent + sum(len(r.get("local") or []) for r in rows)
        scores = [float(r["score"]) for r in rows if isinstance(r.get("score"), (int, float))]
        best = min([best, *(s for s in scores if math.isfinite(s))])
        if math.isfinite(best):
            xs.append(spent)
            ys.append(best)
    return xs, ys


def plot_anytime(jobs: Sequence[tuple[str, str, Path]], path: Path, tuner: str) -> Path | None:
    """One subplot per dataset, one line per method (`jobs`: (dataset, method, tuning run dir)); saved
    atomically as PNG. None when no job has a member log with a finite score."""
    curves: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for dataset, method, job in jobs:
        xs, ys = anytime_curve(job / MEMBERS_LOG)
        if xs:
            curves.setdefault(dataset, {})[method] = (xs, ys)
    if not curves:
        return None
    cols = min(len(curves), 3)
    nrows = math.ceil(len(curves) / cols)
    fig = Figure(figsize=(5.0 * cols, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (dataset, methods) in enumerate(curves.items()):
        ax = fig.add_subplot(nrows, cols, i + 1)
        for method, (xs, ys) in methods.items():
            ax.plot(xs, ys, drawstyle="steps-post", marker=".", label=method)
        ax.legend(fontsize="small")
        ax.set_title(f"{dataset}: tuner {tuner}")
        ax.set_xlabel("client-rounds spent")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("best validation loss so far")
        ax.grid(alpha=0.3)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))

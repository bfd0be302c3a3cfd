"""The "Tuning" section of a report, for runs made by `fedhet tune` (summary.json's `tune`, tune/members.jsonl):
the final configuration, its global and finetuned accuracy, how many vectors were tried (FedPop's Table 1), and
each job's hyperparameter trajectories, one line per configuration over the rounds (FedPop's App. Fig. 4)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedhet.atomic import atomic_write
from fedhet.report.runs import RunRecord
from fedhet.yaml_input import JSONDict

MEMBERS_FILE = Path("tune") / "members.jsonl"
NOT_VALUES = ("round", "slot", "alive", "parent", "born", "score", "local")


def tuning_section(runs: Sequence[RunRecord], out_dir: Path) -> str:
    """A Markdown table of the tuning runs and their trajectory plots (written next to the report); "" when
    no run was tuned."""
    tuned = [r for r in runs if isinstance(r.summary.get("tune"), dict)]
    if not tuned:
        return ""
    lines = ["## Tuning\n", "Runs of `fedhet tune`: the final configuration's average test accuracy (global model; "
             "finetuned: each client trains it once with the configuration's client values first) and the number "
             "of distinct server (alpha) / client (beta) vectors that trained.\n",
             "| run | dataset | wrapper | tuner | configurations | tried alpha / beta | global (%) | finetuned (%) "
             "| final configuration |", "|---|---|---|---|---|---|---|---|---|"]
    plots = []
    for run in tuned:
        t = run.summary["tune"]
        finetuned = t.get("finetuned", {}).get("avg", {}).get("accuracy", math.nan)
        values = ", ".join(f"{k}={_short(v)}" for k, v in t.get("values", {}).items())
        lines.append(f"| {run.label} (seed {run.seed}) | {run.dataset} | {t.get('wrapper')} | {t.get('tuner')} | "
                     f"{t.get('configs')} | {t.get('tried_alpha')} / {t.get('tried_beta')} | "
                     f"{100 * run.final.get('avg', {}).get('accuracy', math.nan):.2f} | {100 * finetuned:.2f} | "
                     f"{values} |")
        plot = plot_trajectories(run.path / MEMBERS_FILE, out_dir / f"hp_{run.dataset}_{run.label}_seed{run.seed}.png")
        if plot is not None:
            plots.append(f"![hyperparameters of {run.label}, seed {run.seed}]({plot.name})\n")
    return "\n".join(lines) + "\n\n" + "\n".join(plots)


def plot_trajectories(members_log: Path, out: Path) -> Path | None:
    """One subplot per hyperparameter, one line per configuration slot over the rounds it was alive (a FedPop-G
    copy shows as a jump) and, for a client value, a dot per active client's own beta^k in the slot's colour
    (FedPop-L's local search, App. Fig. 4); log scale where the values span more than two decades. None without
    a log."""
    if not members_log.is_file():
        return None
    rows = [json.loads(line) for line in members_log.read_text().splitlines() if line.strip()]
    keys = [k for k in (rows[0] if rows else {}) if k not in NOT_VALUES]
    if not keys:
        return None
    cols = min(len(keys), 4)
    fig = Figure(figsize=(3.6 * cols, 2.8 * math.ceil(len(keys) / cols)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(math.ceil(len(keys) / cols), cols, i + 1)
        for slot in sorted({r["slot"] for r in rows}):
            mine = [r for r in rows if r["slot"] == slot and r["alive"] and isinstance(r[key], int | float)]
            line, = ax.plot([r["round"] for r in mine], [r[key] for r in mine], linewidth=1, label=f"m{slot}")
            dots = [(r["round"], b[key]) for r in mine for b in r.get("local", [])
                    if isinstance(b.get(key), int | float)]
            if dots:
                ax.scatter([d[0] for d in dots], [d[1] for d in dots], s=4, alpha=0.35, color=line.get_color(),
                           linewidths=0)
        if _wide(rows, key):
            ax.set_yscale("log")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
    atomic_write(out, lambda p: fig.savefig(p, format="png", dpi=110))
    return out


def _wide(rows: list[JSONDict], key: str) -> bool:
    values = [r[key] for r in rows if isinstance(r[key], int | float) and not isinstance(r[key], bool)]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def _short(value: Any) -> str:  # Any: a config value (parsed YAML)
    return f"{value:.3g}" if isinstance(value, float) else str(value)

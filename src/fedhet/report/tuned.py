"""The "Default vs tuned" section of a report, for a tuned sweep (`fedhet sweep --tune`, docs/tune.md): per
dataset and method, the default-config result beside each tuner's tuned result (mean ± std and a 95% interval
over the fresh seeds), the budget the tuning spent, the chosen hyperparameters and their validation score, the
members that diverged; a sentence per tuner saying which ordering of the methods tuning changed; an anytime plot
per tuner (`report.anytime`).

The layout it reads, under `runs/<name>/<dataset>/`: `<label>/seed<s>/` (default rows),
`<label>+tuned-<tuner>/tuning/` (the tuning job), `<label>+tuned-<tuner>/seed<s>/` (the re-runs) and
`<label>+tuned-<tuner>/tuned.json` (what the tuning chose and spent).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.report.anytime import plot_anytime
from fedhet.report.runs import RunRecord
from fedhet.report.setting import stand_in_lines
from fedhet.report.stats import mean_std, paired, t_interval
from fedhet.report.table import AVG, Cell, format_cell
from fedhet.yaml_input import JSONDict

TUNED_FILE = "tuned.json"
TUNING_DIR = "tuning"  # the tuning job's run directory inside `<label>+tuned-<tuner>/`
TUNED_MARK = "+tuned-"
_REQUIRED = ("default_label", "tuner")


@dataclass(frozen=True)
class TunedRow:
    """One (dataset, method, tuner): the default-config and tuned cells (client average) and tuned.json."""

    dataset: str
    method: str  # the default configuration's label
    tuner: str
    default: Cell | None
    tuned: Cell | None
    info: JSONDict
    folder: Path  # `<label>+tuned-<tuner>/`


def is_tuning_job(run: RunRecord) -> bool:
    """True for a tuned sweep's tuning job (`<label>+tuned-<tuner>/tuning/`): not a result row of the tables."""
    return run.path.name == TUNING_DIR and TUNED_MARK in run.path.parent.name


def read_tuned(folder: Path) -> JSONDict:
    """`folder`/tuned.json, checked for the keys the report needs; a FedhetError says what to do."""
    path = folder / TUNED_FILE
    try:
        info: Any = json.loads(path.read_text(encoding="utf-8"))  # Any: parsed JSON, checked below
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FedhetError(f"cannot read {path} ({e}); the tuned sweep rewrites it when the tuning ends: resume the "
                          f"sweep, or delete {folder} to tune that method again") from e
    missing = [k for k in _REQUIRED if not isinstance(info, dict) or k not in info]
    if missing or not isinstance(info, dict):
        raise FedhetError(f"{path} lacks {', '.join(missing)}; it was not written by `fedhet sweep --tune`: delete "
                          f"{folder} and resume the sweep")
    return info


def avg_cell(runs: Sequence[RunRecord], metric: str = "accuracy") -> Cell | None:
    """Mean, sample std and per-seed values of the runs' client-average `metric`; None without a value."""
    have = [(r.seed, r.final[AVG][metric]) for r in runs if metric in r.final.get(AVG, {})]
    have = [(s, v) for s, v in have if not math.isnan(v)]
    if not have:
        return None
    mean, std = mean_std([v for _, v in have])
    return Cell(mean, std, len(have), tuple(s for s, _ in have), values=tuple(v for _, v in have))


def tuned_rows(runs: Sequence[RunRecord], metric: str = "accuracy") -> list[TunedRow]:
    """A row per `<label>+tuned-<tuner>/` folder holding a tuned.json among the runs' parents, in run order."""
    folders = dict.fromkeys(r.path.parent for r in runs if (r.path.parent / TUNED_FILE).is_file())
    rows = []
    for folder in folders:
        info = read_tuned(folder)
        mine = [r for r in runs if r.path.parent == folder]
        dataset, method = mine[0].dataset, str(info["default_label"])
        defaults = [r for r in runs if r.dataset == dataset and r.label == method and not is_tuning_job(r)]
        rows.append(TunedRow(dataset, method, str(info["tuner"]), avg_cell(defaults, metric),
                             avg_cell([r for r in mine if not is_tuning_job(r)], metric), info, folder))
    return rows


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def ranking(scores: dict[str, float]) -> list[str]:
    """Methods best (highest) first; ties in name order."""
    return sorted(scores, key=lambda m: (-scores[m], m))


def ranks(scores: dict[str, float]) -> dict[str, int]:
    """Each method's place, 1 = highest; tied methods share the better place (1, 1, 3)."""
    return {m: 1 + sum(v > scores[m] for v in scores.values()) for m in scores}


def chain(scores: dict[str, float]) -> str:
    """'fraug > fedavg = fedbn': the ranking, '=' between tied methods."""
    order = ranking(scores)
    return order[0] + "".join(f" {'=' if scores[b] == scores[a] else '>'} {b}" for a, b in pairwise(order))


def _place(places: dict[str, int], method: str) -> str:
    tied = sum(p == places[method] for p in places.values()) > 1
    return f"{'joint ' if tied else ''}{ordinal(places[method])}"


def ordering_changes(default: dict[str, float], tuned: dict[str, float]) -> list[str]:
    """What tuning changed in the ranking of the methods both have: "a and b swap" for two that exchange places,
    "a moves from 3rd to 1st" otherwise, in the tuned order; [] when the ranking is unchanged."""
    both = [m for m in default if m in tuned]
    before, after = ranks({m: default[m] for m in both}), ranks({m: tuned[m] for m in both})
    moved = sorted((m for m in both if before[m] != after[m]), key=lambda m: (after[m], m))
    said: set[str] = set()
    parts = []
    for m in moved:
        if m in said:
            continue
        partner = next((o for o in moved if o not in said and before[o] == after[m] and after[o] == before[m]), None)
        if partner is not None:
            parts.append(f"{m} and {partner} swap")
            said |= {m, partner}
        else:
            parts.append(f"{m} moves from {_place(before, m)} to {_place(after, m)}")
            said.add(m)
    return parts


def read_ordering(dataset: str, tuner: str, default: dict[str, float], tuned: dict[str, float]) -> str:
    """The sentence on how tuning with `tuner` reorders the methods on `dataset`; '' with fewer than two."""
    both = [m for m in default if m in tuned]
    if len(both) < 2:
        return ""
    old, new = chain({m: default[m] for m in both}), chain({m: tuned[m] for m in both})
    if not (parts := ordering_changes(default, tuned)):
        return f"Tuned with {tuner} on {dataset}, no ordering changes: {old}, at the default configuration and tuned."
    return f"Tuned with {tuner} on {dataset}, {'; '.join(parts)} (default: {old}; tuned: {new})."


def noise_note(default: dict[str, float], tuned: dict[str, Cell]) -> str:
    """The pairs whose order tuning flipped while their tuned means lie within one standard deviation over seeds
    (not decisive); '' when there is none."""
    flipped = [(a, b) for a in tuned for b in tuned if default[a] < default[b] and tuned[a].mean > tuned[b].mean]
    if any(tuned[a].n < 2 or tuned[b].n < 2 for a, b in flipped):
        return " One seed: the changed order is not tested against noise."
    close = [f"{a} over {b}" for a, b in flipped
             if tuned[a].mean - tuned[b].mean <= max(tuned[a].std, tuned[b].std)]
    return f" Within one standard deviation over seeds, so not decisive: {', '.join(close)}." if close else ""


def tuned_readings(rows: Sequence[TunedRow]) -> list[str]:
    """One ordering sentence per (dataset, tuner), by client-average means, with its noise note."""
    groups: dict[tuple[str, str], list[TunedRow]] = {}
    for row in rows:
        groups.setdefault((row.dataset, row.tuner), []).append(row)
    texts = []
    for (dataset, tuner), group in groups.items():
        default = {r.method: r.default.mean for r in group if r.default is not None and r.tuned is not None}
        tuned = {r.method: r.tuned for r in group if r.default is not None and r.tuned is not None}
        if text := read_ordering(dataset, tuner, default, {m: c.mean for m, c in tuned.items()}):
            texts.append(text + noise_note(default, tuned))
    return texts


def _with_ci(cell: Cell | None) -> str:
    """'63.20 ± 1.10 [60.47, 65.93] (n=3)' in %; '–' without a value."""
    if cell is None:
        return "–"
    low, high = t_interval(cell.mean, cell.std, cell.n)
    interval = "" if math.isnan(low) else f" [{100 * low:.2f}, {100 * high:.2f}]"
    return f"{format_cell(cell, percent=True)}{interval} (n={cell.n})"


def _value(value: Any) -> str:  # Any: a config value (parsed JSON)
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _number(info: JSONDict, key: str, scale: float = 1.0, fmt: str = ".0f") -> str:
    value = info.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "?"
    return format(value * scale, fmt)


def _delta(row: TunedRow) -> str:
    """'+6.00 [+3.52, +8.48]': tuned minus default mean (points) and the paired 95% interval over shared seeds."""
    if row.default is None or row.tuned is None:
        return "–"
    text = f"{100 * (row.tuned.mean - row.default.mean):+.2f}"
    result = paired("tuned", "default", row.tuned.by_seed, row.default.by_seed)
    if result is not None and not math.isnan(result.low):
        text += f" [{100 * result.low:+.2f}, {100 * result.high:+.2f}]"
    return text


def row_line(row: TunedRow) -> str:
    """One Markdown table line of the section (see `tuned_section`'s header)."""
    info = row.info
    delta = _delta(row)
    tuner = row.tuner + (" (picked on **test**)" if info.get("selection") == "test" else "")
    chosen = info.get("chosen")
    hps = ", ".join(f"{k}={_value(v)}" for k, v in chosen.items()) if isinstance(chosen, dict) else ""
    return (f"| {row.method} | {_with_ci(row.default)} | {_with_ci(row.tuned)} | {delta} | {tuner} | "
            f"{_number(info, 'spent_client_rounds')} / {_number(info, 'budget_client_rounds')} | "
            f"{_number(info, 'wall_s', fmt='.1f')} | {_number(info, 'val_score', 100.0, '.2f')} | "
            f"{_number(info, 'diverged')} / {_number(info, 'members')} | {hps or '–'} |")


HEADER = ["| method | default | tuned | Δ tuned − default (points) | tuner | client-rounds spent / budget | "
          "tuning wall time (s) | val. accuracy of the pick (%) | diverged / members | chosen hyperparameters |",
          "|---|---|---|---|---|---|---|---|---|---|"]


def tuned_section(runs: Sequence[RunRecord], out_dir: Path, heading: bool = True) -> str:
    """The section's Markdown (tables per dataset, the ordering sentences, the anytime plots written into
    `out_dir`); '' when no run belongs to a tuned sweep."""
    rows = tuned_rows(runs)
    if not rows:
        return ""
    lines = ["## Default vs tuned (equal budget)\n"] if heading else []
    configs = [r.config for r in runs if any(r.dataset == row.dataset for row in rows)]
    lines += [*(f"{line}\n" for line in stand_in_lines(configs)),
              "Client-average test accuracy (%) of each method at its default configuration and with the "
              "configuration each tuner chose on the clients' validation splits, re-run on fresh seeds: mean ± "
              "sample std [95% Student t interval] over the seeds; Δ with the 95% interval of the paired "
              "difference over the seeds both ran. Every method of a tuner had the same budget in client-rounds "
              "(tuning rounds x live configurations x active clients); diverged members scored "
              "+inf.\n"]
    tuners = list(dict.fromkeys(r.tuner for r in rows))
    for dataset in dict.fromkeys(r.dataset for r in rows):
        lines += [f"### {dataset}\n", *HEADER, *(row_line(r) for t in tuners for r in rows
                                                 if r.dataset == dataset and r.tuner == t), ""]
    lines += [f"**Reading (tuning).** {text}\n" for text in tuned_readings(rows)]
    for tuner in tuners:
        mine = [(r.dataset, r.method, r.folder / TUNING_DIR) for r in rows if r.tuner == tuner]
        if (plot := plot_anytime(mine, out_dir / f"anytime_{tuner}.png", tuner)) is not None:
            lines.append(f"Anytime ({tuner}): the lowest validation loss any configuration of the tuning job had "
                         f"reached vs the client-rounds it had spent by then, one line per method.\n\n"
                         f"![anytime: best validation loss vs client-rounds, {tuner}]({plot.name})\n")
    return "\n".join(lines) + "\n"

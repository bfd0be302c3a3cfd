"""Plain-language sentences under a results table, one per metric: who leads on the client average, by how
much, against the local-only baseline, whether the lead is larger than the noise the seeds show, and the paired
comparison of the best two over the seeds both ran.

Built from the table's cells only (nothing hard-coded), so it reads any sweep, not just the quickstart.
"""

from __future__ import annotations

import math

from fedhet.report.stats import describe_paired, paired
from fedhet.report.table import AVG, Cell, DatasetTable

LOCAL_ONLY = "single"  # trains on each client's own data alone: the honest baseline for any federated method
ORACLE = "all"  # pools every client's data centrally: an upper reference, not a federated method


def _pct(value: float, percent: bool) -> str:
    return f"{100 * value:.1f}%" if percent else f"{value:.3f}"


def _gap(a: float, b: float, percent: bool) -> str:
    return f"{100 * (a - b):.1f} points" if percent else f"{a - b:.3f}"


def _noise_note(lead: Cell, runner_up: Cell | None, runner_name: str) -> str:
    if lead.n <= 1:
        return ("One seed: differences of a few points can be noise; add seeds (e.g. --seeds 0,1,2) for "
                "mean ± std.")
    if runner_up is None or runner_up.n <= 1:
        return ""
    spread = max(lead.std, runner_up.std)
    if not math.isnan(spread) and abs(lead.mean - runner_up.mean) <= spread:
        return f"Over {lead.n} seeds the lead over {runner_name} is within one standard deviation (not decisive)."
    return f"Over {lead.n} seeds the lead over {runner_name} is larger than one standard deviation."


def _name(metric: str) -> str:
    return metric.replace("_", " ")


def read_table(table: DatasetTable, percent: bool = True, metric: str = "accuracy",
               lower_is_better: bool = False) -> str:
    """Sentences reading the client-average row of `table`'s `metric`; '' when there is nothing to compare."""
    avg = {c: cell for c in table.columns if (cell := table.cells.get((AVG, c))) is not None
           and not cell.reference and not math.isnan(cell.mean)}
    ranked = sorted((c for c in avg if c != ORACLE), key=lambda c: avg[c].mean, reverse=not lower_is_better)
    if len(ranked) < 2:
        return ""
    best, second = ranked[0], ranked[1]
    lead = avg[best]
    word, other = ("lowest", "highest") if lower_is_better else ("highest", "lowest")
    parts = [f"On {table.dataset}, {best} has the {word} average {_name(metric)} over clients "
             f"({_pct(lead.mean, percent)}), {_gap(*_ordered(lead.mean, avg[second].mean, lower_is_better), percent)}"
             f" {'below' if lower_is_better else 'above'} {second}"]
    if LOCAL_ONLY in avg and best != LOCAL_ONLY and second != LOCAL_ONLY:
        gap = _gap(*_ordered(lead.mean, avg[LOCAL_ONLY].mean, lower_is_better), percent)
        parts.append(f" and {gap} {'below' if lower_is_better else 'above'} training on each client's "
                     f"own data alone ({LOCAL_ONLY})")
    parts.append(f"; {ranked[-1]} is {other} ({_pct(avg[ranked[-1]].mean, percent)}).")
    if best == LOCAL_ONLY:
        parts.append(" No federated method beats local training here: collaboration does not pay off at this "
                     "data size and shift.")
    if ORACLE in avg:
        parts.append(f" Pooling all data centrally ({ORACLE}, not federated) reaches "
                     f"{_pct(avg[ORACLE].mean, percent)}.")
    note = _noise_note(lead, avg[second], second)
    comparison = paired(best, second, lead.by_seed, avg[second].by_seed)
    if comparison is not None and len(comparison.seeds) > 1:
        note += " Paired over seeds: " + describe_paired(comparison, 100.0 if percent else 1.0,
                                                          " points" if percent else "")
    return "".join(parts) + (f" {note.strip()}" if note.strip() else "")


def _ordered(lead: float, other: float, lower_is_better: bool) -> tuple[float, float]:
    """(a, b) such that a - b is the leader's margin, positive."""
    return (other, lead) if lower_is_better else (lead, other)

"""The report's cost table: per (dataset, method) the parameters a client sends and receives per round (as the
PEFT papers' "communication overhead" column, from the runs' own messages) and the wall time per round and run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from fedhet.report.runs import RunRecord

TRAFFIC = "traffic_per_client_round"  # the summary key the engine writes (core.messages.traffic)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def traffic_mean(runs: Sequence[RunRecord], key: str) -> float | None:
    """Mean of `key` ("up_params", "down_bytes", ...) of the runs' recorded traffic; None when none recorded it."""
    return _mean([float(r.summary[TRAFFIC][key]) for r in runs
                  if isinstance(r.summary.get(TRAFFIC), dict) and key in r.summary[TRAFFIC]])


def format_params(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


def _seconds(s: float | None) -> str:
    return "?" if s is None else f"{s:.2f}" if s < 10 else f"{s:.0f}"


def cost_section(runs: Sequence[RunRecord], by: str = "method") -> str:
    """A Markdown table: dataset, method (columns as in `table.make_table`, `by`), parameters up / down per client
    per round, s per round, s per run; "" when no run recorded either."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in runs:
        groups.setdefault((r.dataset, r.label if by == "method" else (r.name or r.label)), []).append(r)
    if not any(TRAFFIC in r.summary or r.wall_time_s is not None for r in runs):
        return ""
    lines = ["## Cost\n",
             "Parameters a client sends to the server (up) and receives (down) in a round, as counted in the run's "
             "messages (mean over sampled clients and runs); wall time (mean over runs).\n",
             "| dataset | method | params up / round | params down / round | s / round | s / run | runs |",
             "|---|---|---|---|---|---|---|"]
    for (dataset, method), group in sorted(groups.items()):
        up, down = traffic_mean(group, "up_params"), traffic_mean(group, "down_params")
        per_round = _mean([float(r.summary["round_time_s"]) for r in group
                           if isinstance(r.summary.get("round_time_s"), (int, float))])
        per_run = _mean([r.wall_time_s for r in group if r.wall_time_s is not None])
        lines.append(f"| {dataset} | {method} | {format_params(up)} | {format_params(down)} | {_seconds(per_round)} | "
                     f"{_seconds(per_run)} | {len(group)} |")
    return "\n".join(lines) + "\n"

"""The final per-client table `fedhet run` prints: every client, or a summary when quiet or when there are many.

A client without test data (accuracy NaN, `engine.evaluation`) is shown as "—" and left out of the means, and the
lines say how many were left out; the full table is in the run's summary.json / metrics.jsonl (`fedhet report`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

SUMMARISE_ABOVE = 20  # more clients than this: a summary instead of one row each
AGGREGATES = ("avg", "pooled")  # rows that are not clients (the client average, the pooled test set)
NO_TEST_DATA = "—  (no test data)"
Metrics = Mapping[str, float]


def _row(name: str, m: Metrics) -> str:
    if math.isnan(m["accuracy"]):
        return f"{name:<16} {NO_TEST_DATA}"
    return f"{name:<16} {100 * m['accuracy']:>8.2f}% {100 * m['balanced_accuracy']:>8.2f}% {m['loss']:>8.4f}"


def _left_out(empty: int) -> str:
    return f" ({empty} client{'s' if empty != 1 else ''} without test data left out)" if empty else ""


def _summary(clients: Mapping[str, Metrics]) -> list[str]:
    """Mean, min and max test accuracy over the clients with test data, and the worst three."""
    scored = sorted((m["accuracy"], name) for name, m in clients.items() if not math.isnan(m["accuracy"]))
    empty = len(clients) - len(scored)
    if not scored:
        return [f"{len(clients)} clients, none with test data"]
    accs = [a for a, _ in scored]
    worst = ", ".join(f"{name} {100 * a:.2f}%" for a, name in scored[:3])
    return [f"{len(scored)} clients: accuracy mean {100 * sum(accs) / len(accs):.2f}%, min {100 * accs[0]:.2f}%, "
            f"max {100 * accs[-1]:.2f}%{_left_out(empty)}",
            f"worst: {worst}  (every client: summary.json / metrics.jsonl, `fedhet report`)"]


def final_table(final: Mapping[str, Metrics], quiet: bool = False) -> list[str]:
    """The lines printed after a run from summary.json's `final` (client name -> accuracy, balanced_accuracy,
    loss): one row per client, or `_summary` when `quiet` or more than SUMMARISE_ABOVE clients; then the
    aggregate rows."""
    if not final:
        return []
    clients = {name: m for name, m in final.items() if name not in AGGREGATES}
    empty = sum(math.isnan(m["accuracy"]) for m in clients.values())
    lines = [f"{'client':<16} {'accuracy':>9} {'bal.acc':>9} {'loss':>8}"]
    if quiet or len(clients) > SUMMARISE_ABOVE:
        lines = [*_summary(clients), lines[0]]
    else:
        lines += [_row(name, m) for name, m in clients.items()]
    for name in AGGREGATES:
        if name in final:
            lines.append(_row(name, final[name]) + (_left_out(empty) if name == "avg" else ""))
    return lines


def attack_lines(attack: Mapping[str, Any] | None) -> list[str]:  # Any: summary.json values
    """The lines after the table of a run with an `attack:` (summary.json's `attack`): who attacked, the honest
    clients' mean and worst accuracy, the attackers' own, and the backdoor's attack success rate."""
    if not attack:
        return []

    def pct(key: str) -> str:
        value = attack.get(key)
        return "—" if not isinstance(value, float) or math.isnan(value) else f"{100 * value:.2f}%"

    clients = ", ".join(str(c) for c in attack.get("clients", []))
    lines = [f"attack {attack['kind']} by {clients}: honest clients' accuracy mean {pct('honest_accuracy')}, worst "
             f"{pct('honest_worst_accuracy')}; attackers' own {pct('attacker_accuracy')} (not a defense metric)"]
    if attack["kind"] == "backdoor":
        lines.append(f"backdoor attack success rate on the honest clients' triggered test images: "
                     f"{pct('attack_success_rate')}")
    return lines

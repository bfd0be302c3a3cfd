"""The wrappers FedPop runs inside (spec fedpop.md §2.6-2.8): random search (RS: every configuration trains for
the whole budget R_c) and successive halving (SHA, appendix Alg. 1: after each of E elimination rounds the best
1/eta of the live configurations stay, 27 -> 9 -> 3 -> 1), and the choice of the final configuration.

Where the paper is silent (spec §2.7): the elimination rounds are evenly spaced, R_c * t / (E + 1) for
t = 1..E ("the time step for elimination can be computed", no formula); SHA ranks by the same score FedPop-G
uses (the power-law-decayed validation loss, Eq. 5); the final configuration is the live one with the best mean
validation accuracy of its deployed models (`select: val`, ours) or, as the paper prints for RS, the best test
accuracy (`select: test`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedhet.errors import ConfigError


def sha_rounds(rounds: int, eliminations: int) -> list[int]:
    """The rounds after which SHA eliminates: R_c * t / (E + 1), t = 1..E, rounded; distinct and < R_c."""
    points = [round(rounds * t / (eliminations + 1)) for t in range(1, eliminations + 1)]
    if len(set(points)) != eliminations or points[0] < 1 or points[-1] >= rounds:
        raise ConfigError(f"tune: {eliminations} SHA eliminations need more rounds than {rounds} (each stage at "
                          f"least one round); raise rounds or lower tune.eliminations")
    return points


def survivors(slots: Sequence[int], scores: Sequence[float], eta: int) -> list[int]:
    """The slots SHA keeps: the best (lowest score) max(1, n // eta), ties to the lower slot (appendix Alg. 1:
    "keep the best 1/eta")."""
    keep = max(1, len(slots) // eta)
    ranked = sorted(zip(scores, slots, strict=True), key=lambda pair: (_finite(pair[0]), pair[1]))
    return sorted(slot for _, slot in ranked[:keep])


def best_slot(slots: Sequence[int], accuracies: Sequence[float]) -> int:
    """The slot with the highest accuracy (ties to the lower slot; NaN ranks last)."""
    ranked = sorted(zip(accuracies, slots, strict=True), key=lambda pair: (-_finite(pair[0], worst=-1.0), pair[1]))
    return ranked[0][1]


def _finite(value: float, worst: float = float("inf")) -> float:
    return value if value == value and abs(value) != float("inf") else worst

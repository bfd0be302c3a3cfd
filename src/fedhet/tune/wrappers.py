"""The wrappers FedPop runs inside (spec fedpop.md §2.6-2.8): random search (RS: every configuration trains for
the whole budget R_c) and successive halving (SHA, appendix Alg. 1: after each of E elimination rounds the best
1/eta of the live configurations stay, 27 -> 9 -> 3 -> 1), and the choice of the final configuration.

Where the paper is silent (spec §2.7: "the time step for elimination can be computed", no formula): with a total
budget R_t (`tune.budget`) the stages before each elimination are equally long, s = floor((R_t - R_c) /
sum_t (n_t - 1)) rounds with n_t the configurations alive in stage t, so that the survivor's R_c rounds plus the
eliminated configurations' rounds fit R_t (the starting point of the FedEx code's `get_schedule`, which FedPop's
SHA follows; that code then lengthens stages into the leftover of fewer than sum_t (n_t - 1) rounds, ours does
not); without a budget the eliminations are evenly spaced over R_c, R_c * t / (E + 1), t = 1..E. SHA ranks by
the same score FedPop-G uses (the power-law-decayed validation loss, Eq. 5); the final configuration is the live
one with the best mean validation accuracy of its deployed models (`select: val`, ours) or, as the paper prints
for RS, the best test accuracy (`select: test`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedhet.errors import ConfigError


def sha_rounds(rounds: int, eliminations: int, configs: int, eta: int, budget: int | None = None) -> list[int]:
    """The rounds after which SHA eliminates (module docstring): equal stages that fit `budget` (R_t) when
    given, else R_c * t / (E + 1); distinct, increasing and before the last round."""
    if budget is None:
        points = [round(rounds * t / (eliminations + 1)) for t in range(1, eliminations + 1)]
    else:
        alive, extra = configs, 0
        for _ in range(eliminations):
            extra += alive - 1
            alive = max(1, alive // eta)
        stage = (budget - rounds) // extra if extra else 0
        points = [stage * t for t in range(1, eliminations + 1)]
    if len(set(points)) != eliminations or points[0] < 1 or points[-1] >= rounds:
        raise ConfigError(f"tune: {eliminations} SHA eliminations of {configs} configurations do not fit rounds="
                          f"{rounds}" + (f" and tune.budget={budget}" if budget else "") + " (every stage needs at "
                          "least one round and the survivor its R_c); raise rounds / budget or lower "
                          "tune.eliminations")
    return points


def check_rs_budget(configs: int, rounds: int, budget: int | None) -> None:
    """Random search trains every configuration for R_c rounds: N_c * R_c must fit R_t (the paper: R_c = R_t /
    N_c)."""
    if budget is not None and configs * rounds > budget:
        raise ConfigError(f"tune: random search trains {configs} configurations for rounds={rounds} each, "
                          f"{configs * rounds} rounds in all, over tune.budget={budget}; set rounds to "
                          f"{budget // configs} (R_c = R_t / N_c) or raise the budget")


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

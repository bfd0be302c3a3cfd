"""Uncertainty over seeds: Student-t 95% intervals of a mean, and the paired comparison of two methods run on
the same seeds (same data split, same initial model, so the seed-to-seed noise they share cancels)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); std is NaN for a single value."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n == 1:
        return mean, math.nan
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def t_halfwidth(std: float, n: int, level: float = LEVEL) -> float:
    """Half-width of the two-sided t-interval of a mean of n values with sample std `std` (NaN for n < 2)."""
    if n < 2 or math.isnan(std):
        return math.nan
    return float(stats.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)


def t_interval(mean: float, std: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the t-interval; (NaN, NaN) when it is undefined (n < 2)."""
    half = t_halfwidth(std, n, level)
    return mean - half, mean + half


@dataclass(frozen=True)
class Paired:
    """A - B over the seeds both ran: mean difference, its t-interval, the paired t-test's two-sided p."""

    a: str
    b: str
    seeds: tuple[int, ...]
    mean: float
    low: float
    high: float
    p: float


def paired(a: str, b: str, values_a: Mapping[int, float], values_b: Mapping[int, float]) -> Paired | None:
    """The paired comparison of two methods' per-seed values; None when they share no seed."""
    seeds = tuple(sorted(set(values_a) & set(values_b)))
    if not seeds:
        return None
    n = len(seeds)
    mean, std = mean_std([values_a[s] - values_b[s] for s in seeds])
    if n < 2:
        return Paired(a, b, seeds, mean, math.nan, math.nan, math.nan)
    low, high = t_interval(mean, std, n)
    if std == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = float(2 * stats.t.sf(abs(mean) / (std / math.sqrt(n)), n - 1))
    return Paired(a, b, seeds, mean, low, high, p)


def describe_paired(result: Paired, unit: float, suffix: str) -> str:
    """'fraug - fedbn = +1.2 points (95% CI -0.4 to +2.8, paired t-test p = 0.12, seeds 0, 1, 2)'."""
    seeds = ", ".join(map(str, result.seeds))
    head = f"{result.a} − {result.b} = {unit * result.mean:+.2f}{suffix}"
    if len(result.seeds) < 2:
        return f"{head} on the one seed both ran ({seeds}): no interval."
    verdict = "the interval excludes 0" if result.low > 0 or result.high < 0 else "the interval includes 0"
    return (f"{head} (95% CI {unit * result.low:+.2f} to {unit * result.high:+.2f}, paired t-test p = "
            f"{result.p:.3g}, seeds {seeds}): {verdict}.")


def mean_ranks(scores: Mapping[str, Mapping[str, float]], lower_is_better: bool) -> dict[str, tuple[float, int]]:
    """method -> (mean rank over the datasets it ran on, number of datasets); scores = {dataset: {method: v}}.
    Ties share their average rank (1 = best)."""
    ranks: dict[str, list[float]] = {}
    for per_method in scores.values():
        values = {m: v for m, v in per_method.items() if not math.isnan(v)}
        ordered: Sequence[float] = [v if lower_is_better else -v for v in values.values()]
        for method, rank in zip(values, stats.rankdata(ordered), strict=True):
            ranks.setdefault(method, []).append(float(rank))
    return {m: (math.fsum(r) / len(r), len(r)) for m, r in ranks.items()}

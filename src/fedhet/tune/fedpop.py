"""FedPop's decision rules (spec fedpop.md §2.1-2.7, Alg. 1): pure functions of scores, vectors and a
`numpy.random.Generator`; no torch, no model weights (the runner copies weights and states).

* `member_score`: FedPop-G's score of a member from its per-round scores (Eq. 5 / appendix Eq. 1; Table 5's
  `avg` and `last`).
* `split_quantiles`: the best (Q_t, P_t) and worst (Q_b, P_b) 1/rho shares; lower scores (losses) are better.
* `fedpop_l`: the worst local vectors beta^k of one member become Evo-perturbed copies of its best ones, clipped
  into the Delta-ball around beta^0; only inside the window `l_window_open` (the first 0.2 T_g rounds of a
  member's life, §2.4).
* `fedpop_g`: the worst members get Evo-perturbed (alpha, beta^0) of the best ones (`Replacement`).
* `g_interval` / `is_g_round`: T_g = 0.1 R_c and the rounds FedPop-G runs in; `Tried` counts Table 1's vectors.

Where the paper is silent (spec §7.3), our choices, each documented where it is made: the score window (the last
T_g rounds), rank-based groups with index tie-breaks (the official code's ceil(0.3 n); `rule="rank"` for
floor(n / rho), `rule="quantile"` for the literal thresholds), a
non-finite score ranks worst, all replacements of one call read the inputs (simultaneous, not sequential).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedhet.tune.evo import BALL_RADIUS, EvoOptions, evo, project_to_ball
from fedhet.tune.space import HPVector, Space

RHO = 3  # quantile coefficient rho (spec §2.10)
GAMMA_G = 0.9  # power-law decay gamma_g of FedPop-G's scores (Eq. 5)
L_GAMMA = 0.9  # the official code's discount of a local vector's losses (FedPop-L's score)
G_SHARE = 0.1  # T_g as a share of R_c (§2.10)
L_WINDOW = 0.2  # FedPop-L runs for the first L_WINDOW * T_g rounds of a member's life (§2.4)
SCORE_RULES = ("powerlaw", "avg", "last")
SPLIT_RULES = ("official", "rank", "quantile")
PLAIN_EVO = EvoOptions()  # Evo's defaults (clip, at-least-one discrete step)


def member_score(history: Sequence[float], rule: str = "powerlaw", gamma: float = GAMMA_G,
                 window: int | None = None) -> float:
    """A member's score for FedPop-G from its per-round scores s^(r) (the mean validation loss of its active
    clients in round r, oldest first; lower is better).

    * `powerlaw` (Eq. 5, appendix Eq. 1): sum_r gamma^(R-r) s^(r) / sum_r gamma^(R-r), the newest round weighted 1;
    * `avg`: the plain mean; `last`: s^(R) (appendix Table 5's ablation).

    The window (spec §7.3, our choice): the last `window` rounds of `history`, all of it if None or shorter.
    The runner passes the history since the member's (re)initialisation and window = T_g, as Eq. 5 sums over
    the last T_g rounds: at a FedPop-G round every member is then scored on the same T_g rounds (a member
    replaced at the previous one has exactly T_g). A NaN in the window gives NaN (`split_quantiles`: worst).
    """
    if rule not in SCORE_RULES:
        raise ValueError(f"member_score: unknown rule {rule!r}; valid: {', '.join(SCORE_RULES)}")
    if not 0 < gamma <= 1:
        raise ValueError(f"member_score: gamma must be in (0, 1], got {gamma}")
    if window is not None and window < 1:
        raise ValueError(f"member_score: window must be >= 1 rounds, got {window}")
    if len(history) == 0:
        raise ValueError("member_score: the member has no scores yet (it has not trained a round since its "
                         "(re)initialisation)")
    s = np.asarray(history[-window:] if window is not None else history, dtype=float)
    if rule == "last":
        return float(s[-1])
    if rule == "avg":
        return float(s.mean())
    weights = gamma ** np.arange(len(s) - 1, -1, -1, dtype=float)  # gamma^(R-r), r = 1..R
    return float(np.dot(weights, s) / weights.sum())


def _worst_last(scores: Sequence[float]) -> np.ndarray:
    s = np.asarray(scores, dtype=float)
    return np.where(np.isnan(s), np.inf, s)


def split_quantiles(scores: Sequence[float], rho: int = RHO,
                    rule: str = "official") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(top, bottom): the indices, ascending, of the best (lowest) and worst (highest) share of `scores`.

    Alg. 1 writes quantile thresholds (bottom: s >= the (rho-1)/rho-quantile, top: s <= the 1/rho-quantile),
    which with ties or few scores can pick many, none-of-the-intended or overlapping sets (spec §7.3).
    * `official` (the default, the official code's group size): order by (score, index) and take
      q = ceil(0.3 n) from each end (`rho` is not used); n = 5 gives 2 and 2, n = 10 gives 3 and 3.
    * `rank` (ours, rho's share): the same order, q = floor(n / rho) from each end, at least 1 each when n >= 2.
    Under both the sets never overlap (2q <= n for n >= 2), equal scores go to the lower index first, so the
    top keeps the lowest indices and the bottom takes the highest, and n = 1 gives ((0,), ()): nothing to
    replace (ours: the official code's rule would make the one member its own parent).
    * `quantile`: the literal thresholds with `np.quantile`'s default (linear) interpolation; the sets can
      overlap (all scores equal: every index is in both) and n = 1 gives ((0,), (0,)).
    NaN and +inf (a diverged model) rank worst under both rules and are never in the top (fewer finite scores
    than q: a smaller top, so a diverged member is never a parent); `quantile` takes its thresholds over the
    finite scores.
    """
    if rule not in SPLIT_RULES:
        raise ValueError(f"split_quantiles: unknown rule {rule!r}; valid: {', '.join(SPLIT_RULES)}")
    if isinstance(rho, bool) or not isinstance(rho, int) or rho < 2:
        raise ValueError(f"split_quantiles: rho must be an integer >= 2, got {rho!r}")
    s = _worst_last(scores)
    n = len(s)
    if n == 0:
        raise ValueError("split_quantiles: no scores")
    if rule != "quantile":
        order = [int(i) for i in np.lexsort((np.arange(n), s))]  # by score, then by index
        if n == 1:
            return (order[0],), ()
        q = (3 * n + 9) // 10 if rule == "official" else max(1, n // rho)  # ceil(0.3 n) in integers
        return tuple(sorted(i for i in order[:q] if np.isfinite(s[i]))), tuple(sorted(order[n - q:]))
    finite = s[np.isfinite(s)]
    if finite.size == 0:
        return (), tuple(range(n))
    low, high = np.quantile(finite, [1.0 / rho, (rho - 1.0) / rho])
    top = tuple(i for i in range(n) if s[i] <= low)
    bottom = tuple(i for i in range(n) if s[i] >= high or not np.isfinite(s[i]))
    return top, bottom


def l_window_open(rounds_since_init: int, t_g: int, share: float = L_WINDOW) -> bool:
    """Whether FedPop-L still searches (§2.4: "we stop the local search of beta after the first 0.2 T_g
    communication rounds of a newly initialized (perturbed) HP-configuration").

    `rounds_since_init` counts the member's rounds before this one since its (re)initialisation: 0 in its first
    round (rnd - born - 1 with 1-based rounds and `born` the round FedPop-G replaced it, 0 at the start). Open
    iff rounds_since_init < share * T_g, exactly where FedPop-L's eps = anneal(eps0, rounds_since_init,
    share * T_g) is still positive; T_g = 10 gives 2 rounds, T_g <= 5 gives 1 (only the first round).
    """
    if rounds_since_init < 0:
        raise ValueError(f"l_window_open: rounds_since_init must be >= 0, got {rounds_since_init}")
    if t_g < 1:
        raise ValueError(f"l_window_open: T_g must be >= 1, got {t_g}")
    return rounds_since_init < share * t_g


def _into_bounds(space: Space, vec: Mapping[str, float]) -> HPVector:
    """`vec` clipped to each dimension's [a, b] (a safeguard: Evo keeps its values inside; the Delta-ball lies
    inside [a, b], so clipping first does not change the projection into it)."""
    return {key: min(max(vec[key], dim.low), dim.high) for key, dim in space.dims.items()}


def fedpop_l(betas: Sequence[Mapping[str, float]], scores: Sequence[float], beta0: Mapping[str, float],
             eps: float, p_re: float, rng: np.random.Generator, space: Space,
             options: EvoOptions = PLAIN_EVO, *, rounds_since_init: int, t_g: int, share: float = L_WINDOW,
             rho: int = RHO, rule: str = "official", radius: float = BALL_RADIUS) -> list[HPVector]:
    """FedPop-L (Alg. 1) on one member's local vectors: `betas[k]` trained the k-th active client this round
    and scored `scores[k]` (its locally trained model's validation loss, §2.5).

    Each bottom slot k_b (in index order) gets project_to_ball(Evo(beta^{k_t})) around beta^0 for a top slot
    k_t drawn uniformly (one `rng.integers`, then Evo's draws); top and middle slots are unchanged. Every Evo
    reads this call's inputs. Outside the window (`l_window_open`) the call is a no-op: the paper stops the
    local search there, while with eps = 0 but p_re > 0 (p_re anneals over R_c) Alg. 1 would keep copying top
    slots. Returns a new list of new dicts; the inputs are not mutated.
    """
    if len(betas) != len(scores):
        raise ValueError(f"fedpop_l: {len(betas)} local vectors but {len(scores)} scores")
    out = [dict(b) for b in betas]
    if not betas or not l_window_open(rounds_since_init, t_g, share):
        return out
    top, bottom = split_quantiles(scores, rho, rule)
    if not top:
        return out
    for k_b in bottom:
        k_t = top[int(rng.integers(len(top)))]
        child = evo(space, betas[k_t], eps, p_re, rng, options)
        out[k_b] = project_to_ball(space, _into_bounds(space, child), beta0, radius)
    return out


@dataclass(frozen=True)
class Replacement:
    """One FedPop-G replacement: member `bottom` takes member `top`'s model weights and server / client states
    (copied by the runner) and the new vectors `alpha`, `beta0` = Evo(alpha_top, beta0_top). Indices are
    positions in the lists passed to `fedpop_g`."""

    bottom: int
    top: int
    alpha: HPVector = field(hash=False)
    beta0: HPVector = field(hash=False)


def fedpop_g(alphas: Sequence[Mapping[str, float]], beta0s: Sequence[Mapping[str, float]],
             scores: Sequence[float], eps: float, p_re: float, rng: np.random.Generator, server_space: Space,
             client_space: Space, options: EvoOptions = PLAIN_EVO, rho: int = RHO, *,
             rule: str = "official", beta_eps: float | None = None) -> list[Replacement]:
    """FedPop-G (Alg. 1) over the live members: `scores[i]` is member i's `member_score` (lower is better).

    Each bottom member i_b (in index order) gets a top member i_t drawn uniformly (one `rng.integers`), then
    alpha = Evo(alpha_{i_t}) and beta^0 = Evo(beta^0_{i_t}), drawn in that order (the same draws as Evo on
    Concat(alpha, beta^0) in the joint space). Every Evo reads the inputs (a member in both sets under
    `rule="quantile"` is a parent with its old vectors). Top and middle members are not listed. No projection:
    beta^0 moves freely (FedPop-L's Delta-ball is around the new beta^0, which the runner resamples, §2.2).
    `beta_eps` is beta^0's Evo intensity (None: `eps`; the official code's is 2 eps0, not annealed:
    tuners/pbt_wrs_mix.py lines 220-226, the runner's `tune.g_beta_eps: double`).
    """
    if not len(alphas) == len(beta0s) == len(scores):
        raise ValueError(f"fedpop_g: {len(alphas)} alphas, {len(beta0s)} beta0s and {len(scores)} scores")
    if not scores:
        return []
    top, bottom = split_quantiles(scores, rho, rule)
    replacements = []
    for i_b in bottom:
        if not top:
            break
        i_t = top[int(rng.integers(len(top)))]
        alpha = evo(server_space, alphas[i_t], eps, p_re, rng, options)
        beta0 = evo(client_space, beta0s[i_t], eps if beta_eps is None else beta_eps, p_re, rng, options)
        replacements.append(Replacement(bottom=i_b, top=i_t, alpha=alpha, beta0=beta0))
    return replacements


def g_interval(r_c: int, share: float = G_SHARE) -> int:
    """T_g = max(1, round(share * R_c)) (§2.10: 0.1 R_c; Python's round, as `TuneConfig.g_rounds`)."""
    if r_c < 1:
        raise ValueError(f"g_interval: R_c must be >= 1 rounds, got {r_c}")
    return max(1, round(share * r_c))


def is_g_round(r: int, t_g: int, last: int | None = None) -> bool:
    """Whether FedPop-G runs after round r (1-based): r % T_g == 0 (Alg. 1). The paper also runs it after the
    final round; pass `last` = R_c to skip that one (it would only clone members that never train again)."""
    if t_g < 1:
        raise ValueError(f"is_g_round: T_g must be >= 1, got {t_g}")
    return r >= 1 and r % t_g == 0 and r != last


def vector_key(vec: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """A hashable identity of an HP vector (its sorted (key, position) pairs)."""
    return tuple(sorted((k, float(v)) for k, v in vec.items()))


@dataclass
class Tried:
    """The distinct HP vectors that trained, for Table 1's "number of tried alpha / beta" (counted, not the
    formulas of appendix Eq. 2, which do not reproduce the table: spec §2.12). Note every alpha a member trains
    with and every beta^k an active client trains with; a vector reused over rounds counts once."""

    alphas: set[tuple[tuple[str, float], ...]] = field(default_factory=set)
    betas: set[tuple[tuple[str, float], ...]] = field(default_factory=set)

    def note(self, alpha: Mapping[str, float], betas: Sequence[Mapping[str, float]]) -> None:
        self.alphas.add(vector_key(alpha))
        self.betas.update(vector_key(b) for b in betas)

    def counts(self) -> tuple[int, int]:
        """(# tried alpha, # tried beta)."""
        return len(self.alphas), len(self.betas)

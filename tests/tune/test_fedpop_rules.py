"""FedPop's decision rules (spec fedpop.md Alg. 1, Eq. 5): the power-law score weights the newest round most,
the quantile split keeps the lowest losses on top and the highest at the bottom (ties by index), FedPop-L
replaces exactly the worst local vectors with Delta-ball vectors and stops after 0.2 T_g rounds, FedPop-G
replaces exactly the worst ceil(0.3 n) members from the best ones, and a seed fixes every decision."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest

from fedhet.tune import (
    EvoOptions,
    Replacement,
    Space,
    Tried,
    delta_ball,
    fedpop_g,
    fedpop_l,
    g_interval,
    is_g_round,
    l_window_open,
    member_score,
    parse_dim,
    split_quantiles,
)
from fedhet.tune.config import TuneConfig
from fedhet.tune.space import HPVector


def make_space(dims: dict[str, dict[str, object]]) -> Space:
    return Space({k: parse_dim(k, v) for k, v in dims.items()})


SERVER = make_space({"server.lr": {"type": "log_uniform", "low": -1, "high": 1},
                     "server.momentum": {"type": "uniform", "low": 0.0, "high": 0.9}})
CLIENT = make_space({"train.lr": {"type": "log_uniform", "low": -4, "high": 0, "scale": 2.0},
                     "train.momentum": {"type": "uniform", "low": 0.0, "high": 0.99},
                     "train.local_epochs": {"type": "int", "low": 1, "high": 5},
                     "train.batch_size": {"type": "log2_int", "low": 3, "high": 7}})
BETA0 = {"train.lr": -2.0, "train.momentum": 0.5, "train.local_epochs": 2, "train.batch_size": 2}
# distinct losses of 10 active clients; the worst ceil(0.3 * 10) = 3 are slots 1, 4, 8 and the best 3 are 0, 5, 6
SCORES = [0.20, 2.50, 0.90, 1.00, 3.00, 0.10, 0.30, 1.20, 2.00, 0.95]
WORST, BEST = (1, 4, 8), (0, 5, 6)


# ---------------------------------------------------------------- scores
def test_power_law_score_by_hand_weights_the_newest_round_most() -> None:
    history = [1.0, 2.0, 4.0]  # weights 0.81, 0.9, 1 (gamma^(T - r)); on the wrong end: 6.04 / 2.71
    assert member_score(history) == pytest.approx((0.81 * 1 + 0.9 * 2 + 1 * 4) / 2.71)
    assert member_score(history) == pytest.approx(6.61 / 2.71)
    assert member_score(history, "avg") == pytest.approx(7 / 3)
    assert member_score(history, "last") == 4.0
    assert member_score(history, gamma=1.0) == pytest.approx(7 / 3)
    assert member_score([0.7]) == 0.7


def test_the_score_window_is_the_last_rounds_and_an_empty_history_is_an_error() -> None:
    assert member_score([50.0, 9.0, 1.0, 2.0, 4.0], window=3) == pytest.approx(6.61 / 2.71)
    assert member_score([50.0, 1.0, 2.0, 4.0], "avg", window=3) == pytest.approx(7 / 3)
    assert member_score([1.0, 2.0, 4.0], window=10) == pytest.approx(6.61 / 2.71)  # shorter: all of it
    assert np.isnan(member_score([1.0, float("nan")], window=2))
    with pytest.raises(ValueError, match="no scores"):
        member_score([])
    with pytest.raises(ValueError, match="unknown rule"):
        member_score([1.0], "mean")
    with pytest.raises(ValueError, match="window"):
        member_score([1.0], window=0)


# ---------------------------------------------------------------- quantiles
@pytest.mark.parametrize("rule,n,q", [("rank", 2, 1), ("rank", 3, 1), ("rank", 5, 1), ("rank", 9, 3), ("rank", 10, 3),
                                      ("rank", 27, 9), ("official", 2, 1), ("official", 3, 1), ("official", 4, 2),
                                      ("official", 5, 2), ("official", 7, 3), ("official", 10, 3),
                                      ("official", 11, 4), ("official", 27, 9)])
def test_rank_splits_take_their_group_size_lowest_on_top_and_highest_at_the_bottom(rule: str, n: int, q: int) -> None:
    """`official`: ceil(0.3 n) (the official code); `rank`: floor(n / rho) (ours)."""
    scores = np.random.default_rng(n).permutation(n).astype(float)  # score = rank: 0 best
    top, bottom = split_quantiles(list(scores), rule=rule)
    assert sorted(scores[list(top)]) == list(range(q))
    assert sorted(scores[list(bottom)]) == list(range(n - q, n))
    assert list(top) == sorted(top) and list(bottom) == sorted(bottom)


def test_rank_split_of_one_score_replaces_nothing_and_bad_arguments_are_errors() -> None:
    assert split_quantiles([0.4]) == ((0,), ()) == split_quantiles([0.4], rule="rank")
    assert split_quantiles([0.4, 0.1]) == ((1,), (0,))
    with pytest.raises(ValueError, match="no scores"):
        split_quantiles([])
    with pytest.raises(ValueError, match="rho"):
        split_quantiles([0.1, 0.2], rho=1)
    with pytest.raises(ValueError, match="unknown rule"):
        split_quantiles([0.1, 0.2], rule="median")


def test_rank_split_breaks_ties_by_index_and_never_overlaps() -> None:
    assert split_quantiles([1.0] * 6) == ((0, 1), (4, 5))
    assert split_quantiles([0.5, 0.2, 0.2, 0.9, 0.9, 0.2]) == ((1, 2), (3, 4))
    assert split_quantiles([0.2, 0.2, 0.2, 0.9, 0.5, 0.5]) == ((0, 1), (3, 5))
    assert split_quantiles([7.0, 7.0]) == ((0,), (1,))
    assert split_quantiles([0.3, float("nan"), 0.1, float("inf"), 0.2, 0.25]) == ((2, 4), (1, 3))  # NaN: worst


def test_quantile_split_uses_the_literal_thresholds() -> None:
    assert split_quantiles(list(np.arange(9.0)), rule="quantile") == ((0, 1, 2), (6, 7, 8))
    assert split_quantiles([1.0] * 4, rule="quantile") == ((0, 1, 2, 3), (0, 1, 2, 3))  # ties: all in both
    assert split_quantiles([0.4], rule="quantile") == ((0,), (0,))
    # n = 4: the quantiles at positions 1 and 2 are 1.0 and 5.0, so half on each side (rank: one each)
    assert split_quantiles([0.0, 1.0, 5.0, 6.0], rule="quantile") == ((0, 1), (2, 3))
    assert split_quantiles([0.0, 1.0, 5.0, 6.0], rule="rank") == ((0,), (3,))
    assert split_quantiles([0.0, 1.0, 5.0, 6.0, 7.0], rule="quantile") == ((0, 1), (3, 4))  # 2.33 and 5.67
    assert split_quantiles([0.0, 1.0, 5.0, 6.0], rho=2, rule="quantile") == ((0, 1), (2, 3))
    assert split_quantiles([0.2, float("nan"), 0.1], rule="quantile") == ((2,), (0, 1))  # over 0.1, 0.2


# ---------------------------------------------------------------- FedPop-L
def local_vectors(seed: int = 0) -> list[HPVector]:
    return delta_ball(CLIENT, BETA0, len(SCORES), np.random.default_rng(seed))


def run_l(betas: list[HPVector], seed: int = 1, eps: float = 0.1, p_re: float = 0.0, age: int = 0,
          t_g: int = 10) -> list[HPVector]:
    return fedpop_l(betas, SCORES, BETA0, eps, p_re, np.random.default_rng(seed), CLIENT,
                    rounds_since_init=age, t_g=t_g)


def in_ball(vec: HPVector) -> bool:
    for key, dim in CLIENT.dims.items():
        half = 1 if dim.discrete else 0.2 * dim.width
        if not (dim.low <= vec[key] <= dim.high and abs(vec[key] - BETA0[key]) <= half + 1e-12):
            return False
    return True


@pytest.mark.parametrize("p_re", [0.0, 0.1, 1.0])
def test_fedpop_l_replaces_exactly_the_worst_slots_with_delta_ball_vectors(p_re: float) -> None:
    betas = local_vectors()
    before = copy.deepcopy(betas)
    for seed in range(20):
        new = run_l(betas, seed, eps=0.1, p_re=p_re)
        assert betas == before  # inputs untouched
        assert [k for k in range(len(betas)) if new[k] != betas[k]] == list(WORST)
        assert all(new[k] is not betas[k] for k in range(len(betas)))
        assert all(in_ball(new[k]) for k in WORST)


def test_fedpop_l_children_are_evo_steps_of_a_best_slot() -> None:
    betas, eps = local_vectors(3), 0.05
    lr_step = CLIENT.dims["train.lr"].width * eps * 2.0  # (b - a) eps scale
    parents_used = set()
    for seed in range(60):
        new = run_l(betas, seed, eps=eps)
        for k in WORST:
            parents = [t for t in BEST if abs(new[k]["train.lr"] - betas[t]["train.lr"]) <= lr_step + 1e-12
                       and abs(new[k]["train.momentum"] - betas[t]["train.momentum"]) <= 0.99 * eps + 1e-12
                       and abs(new[k]["train.local_epochs"] - betas[t]["train.local_epochs"]) <= 1]
            assert parents, f"slot {k} is no Evo step of a top slot"
            parents_used.update(parents)
    assert parents_used == set(BEST)


def test_fedpop_l_stops_after_its_window() -> None:
    assert [l_window_open(r, 10) for r in range(4)] == [True, True, False, False]  # 0.2 * 10 = 2 rounds
    assert [l_window_open(r, 5) for r in range(3)] == [True, False, False]
    assert l_window_open(0, 1) and not l_window_open(1, 1)
    assert l_window_open(4, 10, share=0.5) and not l_window_open(5, 10, share=0.5)
    betas = local_vectors()
    assert run_l(betas, age=1, p_re=1.0) != betas
    for age in (2, 3, 50):
        assert run_l(betas, age=age, p_re=1.0) == betas  # p_re > 0 would still move them without the window
    with pytest.raises(ValueError):
        l_window_open(-1, 10)


def test_fedpop_l_checks_its_inputs_and_one_slot_is_kept() -> None:
    with pytest.raises(ValueError, match="scores"):
        fedpop_l(local_vectors()[:3], SCORES, BETA0, 0.1, 0.1, np.random.default_rng(0), CLIENT,
                 rounds_since_init=0, t_g=10)
    one = local_vectors()[:1]
    assert fedpop_l(one, [0.3], BETA0, 0.1, 1.0, np.random.default_rng(0), CLIENT,
                    rounds_since_init=0, t_g=10) == one


def test_fedpop_l_projects_reflected_evo_steps_into_the_ball() -> None:
    betas = local_vectors()
    for seed in range(20):
        new = fedpop_l(betas, SCORES, BETA0, 1.0, 0.0, np.random.default_rng(seed), CLIENT,
                       EvoOptions(boundary="reflect"), rounds_since_init=0, t_g=10)
        assert all(in_ball(new[k]) for k in WORST)


# ---------------------------------------------------------------- FedPop-G
def population(n: int, seed: int = 0) -> tuple[list[HPVector], list[HPVector], list[float]]:
    rng = np.random.default_rng(seed)
    alphas = [SERVER.sample(rng) for _ in range(n)]
    beta0s = [CLIENT.sample(rng) for _ in range(n)]
    return alphas, beta0s, list(rng.permutation(n).astype(float))  # score = rank: 0 best


def run_g(n: int, seed: int = 1, eps: float = 0.1, p_re: float = 0.0) -> list[Replacement]:
    alphas, beta0s, scores = population(n)
    return fedpop_g(alphas, beta0s, scores, eps, p_re, np.random.default_rng(seed), SERVER, CLIENT)


@pytest.mark.parametrize("n", [2, 3, 5, 9, 27])
def test_fedpop_g_replaces_exactly_the_worst_members_from_the_best(n: int) -> None:
    alphas, beta0s, scores = population(n)
    before = copy.deepcopy((alphas, beta0s))
    q = math.ceil(0.3 * n)  # the official group size
    tops: set[int] = set()
    for seed in range(30):
        reps = fedpop_g(alphas, beta0s, scores, 0.1, 0.1, np.random.default_rng(seed), SERVER, CLIENT)
        assert (alphas, beta0s) == before
        assert sorted(scores[r.bottom] for r in reps) == list(range(n - q, n))  # the worst q, each once
        assert all(scores[r.top] < q for r in reps)  # each from one of the best q
        tops.update(r.top for r in reps)
    assert len(tops) == q  # the parent is drawn over the whole top


def test_fedpop_g_steps_stay_within_delta_of_the_parent() -> None:
    alphas, beta0s, _ = population(9)
    eps = 0.05
    for r in run_g(9, eps=eps) + run_g(9, seed=2, eps=eps):
        for space, new, parent in ((SERVER, r.alpha, alphas[r.top]), (CLIENT, r.beta0, beta0s[r.top])):
            for key, dim in space.dims.items():
                bound = 1 if dim.discrete else dim.width * eps * dim.scale
                assert abs(new[key] - parent[key]) <= bound + 1e-12 and dim.low <= new[key] <= dim.high
            assert new != parent
    copies = run_g(9, eps=0.0, p_re=0.0)
    assert all(r.alpha == alphas[r.top] and r.beta0 == beta0s[r.top] for r in copies)


def test_fedpop_g_with_p_re_one_resamples_every_coordinate() -> None:
    alphas, beta0s, _ = population(27)
    reps = run_g(27, eps=0.0, p_re=1.0)
    for key in SERVER.dims:
        assert all(r.alpha[key] != alphas[r.top][key] for r in reps)
    spread = [r.beta0["train.lr"] for r in reps]
    assert all(r.beta0["train.lr"] != beta0s[r.top]["train.lr"] for r in reps)
    assert max(spread) - min(spread) > 1.5  # drawn from U[-4, 0], not near the parents


def test_fedpop_g_edge_cases_and_the_replacement_is_frozen() -> None:
    alphas, beta0s, _ = population(1)
    assert fedpop_g(alphas, beta0s, [0.5], 0.1, 0.1, np.random.default_rng(0), SERVER, CLIENT) == []
    assert fedpop_g([], [], [], 0.1, 0.1, np.random.default_rng(0), SERVER, CLIENT) == []
    with pytest.raises(ValueError, match="scores"):
        fedpop_g(alphas, beta0s, [0.5, 0.6], 0.1, 0.1, np.random.default_rng(0), SERVER, CLIENT)
    rep = run_g(3)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.bottom = 0  # type: ignore[misc]


# ---------------------------------------------------------------- determinism, schedule, counts
def test_the_same_seed_gives_the_same_decisions() -> None:
    assert run_g(27, seed=5, p_re=0.3) == run_g(27, seed=5, p_re=0.3)
    assert run_g(27, seed=5, p_re=0.3) != run_g(27, seed=6, p_re=0.3)
    betas = local_vectors()
    assert run_l(betas, seed=5, p_re=0.3) == run_l(betas, seed=5, p_re=0.3)
    assert run_l(betas, seed=5, p_re=0.3) != run_l(betas, seed=6, p_re=0.3)


def test_g_interval_and_g_rounds() -> None:
    assert [g_interval(r) for r in (800, 200, 80, 10, 5, 1)] == [80, 20, 8, 1, 1, 1]
    assert all(g_interval(r) == TuneConfig().g_rounds(r) for r in range(1, 400))
    assert g_interval(100, share=0.2) == 20
    assert [r for r in range(0, 25) if is_g_round(r, 8)] == [8, 16, 24]
    assert [r for r in range(0, 25) if is_g_round(r, 8, last=24)] == [8, 16]
    assert all(is_g_round(r, 1) for r in range(1, 5))
    with pytest.raises(ValueError):
        g_interval(0)


def test_tried_counts_distinct_vectors() -> None:
    tried = Tried()
    betas = local_vectors()
    tried.note({"server.lr": 0.0}, betas)
    tried.note({"server.lr": 0.0}, betas[:4])
    assert tried.counts() == (1, 10)
    tried.note({"server.lr": 0.5}, [dict(BETA0)])
    assert tried.counts() == (2, 11)

"""Evo (FedPop Eq. 3), cosine annealing (Eq. 4) and the Delta-ball (spec §2.2): steps stay within
+-(b - a) eps scale and inside [a, b], discrete values stay on the grid, p_re controls resampling, eps and p_re
reach exactly 0 at r0, every Delta-ball vector lies in the ball, and a seed fixes every draw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhet.tune import EvoOptions, Space, anneal, delta_ball, discrete_step, evo, parse_dim, project_to_ball

DRAWS = 2000
PLAIN = EvoOptions()  # the defaults: clip, k = max(1, floor(delta))


def space() -> Space:
    """A log-scaled lr with scale 2, a plain momentum, an epoch grid 1..9 and a batch grid 2^3..2^7."""
    dims = {"train.lr": {"type": "log_uniform", "low": -4, "high": 0, "scale": 2.0},
            "train.momentum": {"type": "uniform", "low": 0.0, "high": 0.9},
            "train.local_epochs": {"type": "int", "low": 1, "high": 9},
            "train.batch_size": {"type": "log2_int", "low": 3, "high": 7}}
    return Space({k: parse_dim(k, v) for k, v in dims.items()})


CENTER = {"train.lr": -2.0, "train.momentum": 0.45, "train.local_epochs": 4, "train.batch_size": 2}


def many(eps: float, p_re: float, vec: dict[str, float] = CENTER, seed: int = 0,
         options: EvoOptions = PLAIN) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [evo(space(), vec, eps, p_re, rng, options) for _ in range(DRAWS)]
    return {k: np.array([o[k] for o in out]) for k in vec}


def test_continuous_steps_stay_within_delta_and_use_all_of_it() -> None:
    eps = 0.05
    got = many(eps, 0.0)
    for key, width, scale in (("train.lr", 4.0, 2.0), ("train.momentum", 0.9, 1.0)):
        step = np.abs(got[key] - CENTER[key])
        bound = width * eps * scale  # (b - a) eps scale: ignoring eps or scale breaks one of the two lines
        assert step.max() <= bound + 1e-12
        assert step.max() > 0.95 * bound and step.mean() == pytest.approx(bound / 2, rel=0.1)


def test_continuous_steps_are_clipped_or_reflected_into_the_bounds() -> None:
    edge = {**CENTER, "train.lr": 0.0, "train.momentum": 0.0}
    clipped = many(0.1, 0.0, edge)
    assert clipped["train.lr"].max() <= 0.0 and clipped["train.momentum"].min() >= 0.0
    assert (clipped["train.lr"] == 0.0).mean() == pytest.approx(0.5, abs=0.05)  # half the steps leave [a, b]
    mirrored = many(0.1, 0.0, edge, options=EvoOptions(boundary="reflect"))
    assert mirrored["train.lr"].max() <= 0.0 and mirrored["train.momentum"].min() >= 0.0
    assert (mirrored["train.lr"] == 0.0).mean() < 0.01 and mirrored["train.lr"].min() < -0.3


def test_discrete_values_stay_on_the_grid_and_move_to_a_neighbour_or_stay() -> None:
    got = many(0.1, 0.0)  # delta = 8 * 0.1 = 0.8 -> k = max(1, 0) = 1
    for key in ("train.local_epochs", "train.batch_size"):
        assert np.all(got[key] == np.round(got[key])) and got[key].min() >= 0
        assert set(np.unique(got[key] - CENTER[key])) == {-1, 0, 1}
        assert (got[key] == CENTER[key]).mean() == pytest.approx(1 / 3, abs=0.05)
    assert got["train.batch_size"].max() <= 4 and got["train.local_epochs"].max() <= 8


def test_discrete_step_is_floor_delta_and_the_paper_literal_floor_never_moves_small_eps() -> None:
    dim = space().dims["train.local_epochs"]  # 9 values: b - a = 8 index steps
    assert discrete_step(dim, 0.1) == 1 and discrete_step(dim, 0.3) == 2  # floor(2.4)
    assert discrete_step(dim, 0.1, EvoOptions(paper_floor=True)) == 0
    assert discrete_step(dim, 0.0) == 0  # eps annealed to 0: no move, even with the at-least-one rule
    wide = many(0.3, 0.0)
    assert set(np.unique(wide["train.local_epochs"] - 4)) == {-2, 0, 2}
    literal = many(0.1, 0.0, options=EvoOptions(paper_floor=True))
    assert np.all(literal["train.local_epochs"] == 4) and np.all(literal["train.batch_size"] == 2)


def test_a_neighbour_off_the_grid_is_dropped() -> None:
    edge = {**CENTER, "train.local_epochs": 0, "train.batch_size": 4}
    got = many(0.1, 0.0, edge)
    assert set(np.unique(got["train.local_epochs"])) == {0, 1}
    assert (got["train.batch_size"] == 4).mean() == pytest.approx(0.5, abs=0.05)


def test_p_re_one_resamples_every_coordinate_from_its_original_distribution() -> None:
    got = many(0.0, 1.0)  # eps = 0: without resampling nothing would move
    assert np.all(got["train.lr"] != CENTER["train.lr"])
    assert got["train.lr"].min() < -3.9 and got["train.lr"].max() > -0.1  # all of U[-4, 0] in log10
    assert np.mean(got["train.lr"] < -2) == pytest.approx(0.5, abs=0.05)
    assert got["train.momentum"].min() < 0.02 and got["train.momentum"].max() > 0.88
    counts = np.bincount(got["train.local_epochs"].astype(int), minlength=9)
    assert len(counts) == 9 and counts.min() > DRAWS / 9 * 0.7  # every epoch 1..9, about uniformly
    assert set(np.unique(got["train.batch_size"])) == {0, 1, 2, 3, 4}


def test_p_re_zero_never_resamples_and_p_re_sets_the_share() -> None:
    frozen = many(0.0, 0.0)
    for key, value in CENTER.items():
        assert np.all(frozen[key] == value)
    some = many(0.0, 0.3)
    assert np.mean(some["train.lr"] != CENTER["train.lr"]) == pytest.approx(0.3, abs=0.04)


def test_the_same_seed_gives_the_same_vectors() -> None:
    a, b, c = many(0.1, 0.1, seed=7), many(0.1, 0.1, seed=7), many(0.1, 0.1, seed=8)
    assert all(np.array_equal(a[k], b[k]) for k in CENTER)
    assert not np.array_equal(a["train.lr"], c["train.lr"])
    ball = [delta_ball(space(), CENTER, 10, np.random.default_rng(3)) for _ in range(2)]
    assert ball[0] == ball[1]


@pytest.mark.parametrize("x0,r0", [(0.1, 8.0), (0.1, 1.6), (0.5, 80.0)])
def test_annealing_starts_at_x0_reaches_exactly_zero_at_r0_and_stays_there(x0: float, r0: float) -> None:
    assert anneal(x0, 0, r0) == x0
    assert anneal(x0, r0 / 2, r0) == pytest.approx(x0 / 2)
    assert anneal(x0, r0 / 4, r0) == pytest.approx(x0 / 2 * (1 + math.cos(math.pi / 4)))
    assert anneal(x0, r0, r0) == 0.0
    assert all(anneal(x0, r, r0) == 0.0 for r in (r0 + 0.5, 1.5 * r0, 2 * r0, 10 * r0))  # cos rises again
    values = [anneal(x0, r, r0) for r in np.linspace(0, r0, 21)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_every_delta_ball_vector_lies_in_the_ball() -> None:
    sp = space()
    for center in (CENTER, {"train.lr": -0.1, "train.momentum": 0.0, "train.local_epochs": 8, "train.batch_size": 0}):
        vectors = delta_ball(sp, center, 500, np.random.default_rng(1))
        for key, dim in sp.dims.items():
            got = np.array([v[key] for v in vectors])
            assert got.min() >= dim.low and got.max() <= dim.high
            half = 1 if dim.discrete else 0.2 * dim.width  # neighbouring values / +-0.2 (b - a)
            assert np.abs(got - center[key]).max() <= half + 1e-12
            if dim.discrete:
                assert np.all(got == np.round(got))
    spread = np.array([v["train.lr"] for v in delta_ball(sp, CENTER, 500, np.random.default_rng(2))])
    assert spread.max() > -2.0 + 0.75 and spread.min() < -2.0 - 0.75  # the ball is +-0.8 wide in log10 lr
    epochs = {v["train.local_epochs"] for v in delta_ball(sp, CENTER, 200, np.random.default_rng(2))}
    assert epochs == {3, 4, 5}


def test_projection_pulls_a_vector_onto_the_ball() -> None:
    far = {"train.lr": 0.0, "train.momentum": 0.0, "train.local_epochs": 8, "train.batch_size": 0}
    got = project_to_ball(space(), far, CENTER)
    assert got == pytest.approx({"train.lr": -1.2, "train.momentum": 0.45 - 0.18, "train.local_epochs": 5,
                                 "train.batch_size": 1})
    assert project_to_ball(space(), CENTER, CENTER) == CENTER

"""The switches between fedhet and the official FedPop / FedEx code (docs/tune.md), and the rules they sit on, by
hand: the final RS pick is the best validation accuracy; FedPop-G replaces the worst-scored (highest-loss)
members; FedEx's candidates lie around the member's beta^0 (not drawn from the whole space), its step is
eta0 / max|grad| with a discounted baseline; after FedPop-L's window every client trains with the best local
vector; FedPop-G's new beta^0 takes Evo with 2 eps0; `tune.sampling: per_member` draws each member's clients."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.tune import population as population_module
from fedhet.tune.config import resolve_space, tune_config
from fedhet.tune.fedex import FedExState, fedex_start, fedex_step
from fedhet.tune.population import Population, plan_round
from fedhet.tune.run import run_tuning
from fedhet.tune.wrappers import best_slot

BASE = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "train.local_steps=2", "rounds=4",
        "run.num_threads=1", "run.quiet=true", "server.fraction_fit=0.5", "eval.every=4", "tune.configs=2",
        "tune.fedpop_l=false", "tune.fedpop_g=false",
        "tune.space={client: {train.lr: {type: log_uniform, low: -3, high: -0.5}, "
        "train.batch_size: {type: choice, values: [4, 8, 16, 32]}}, server: {server.lr: {type: log_uniform, "
        "low: -0.3, high: 0.3}}}"]


def started(*extra: str) -> Population:
    cfg = load_config(None, [*BASE, *extra])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start()
    return pop


def test_best_slot_is_the_highest_accuracy() -> None:
    assert best_slot([4, 1, 3], [0.30, 0.90, 0.50]) == 1
    assert best_slot([4, 1, 3], [0.90, 0.90, float("nan")]) == 1  # ties: the lower slot; NaN last


def test_the_final_rs_pick_is_the_member_with_the_best_validation_accuracy(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    val = {0: 0.2, 1: 0.9, 2: 0.5}  # each member's mean validation accuracy, as finish() computes it
    real = Population.evaluate

    def evaluate(self: Population, member: Any, rnd: int, split: str = "test") -> dict[str, dict[str, float]]:
        out = real(self, member, rnd, split)
        return {k: {**v, "accuracy": val[member.slot]} for k, v in out.items()} if split == "val" else out

    monkeypatch.setattr(Population, "evaluate", evaluate)
    cfg = load_config(None, [*BASE, "rounds=1", "tune.configs=3", "tune.clients=fixed"])
    assert run_tuning(cfg, tmp_path / "rs", progress=False).summary["tune"]["selected"] == 1


def test_fedpop_g_replaces_the_highest_losses_with_copies_of_the_lowest() -> None:
    pop = started("tune.configs=5", "tune.fedpop_g=true", "tune.clients=fixed", "rounds=20")
    for member, loss in zip(pop.members, [0.1, 0.9, 0.5, 0.3, 0.7], strict=True):
        member.history = [loss]  # scores are validation losses: lower is better
    pop.global_search(2)
    children = {m.slot: m.parent for m in pop.members if m.parent is not None}
    assert set(children) == {1, 4} and set(children.values()) <= {0, 3}  # ceil(0.3 * 5) = 2 each way


def test_fedex_candidates_lie_around_the_members_beta0() -> None:
    pop = started("tune.clients=fedex", "tune.configs=1")
    member = pop.members[0]
    beta0, grid = dict(member.beta0), pop.space.client.dims["train.batch_size"]
    pop.local_vectors(member, 1, 2)
    assert member.fedex is not None and member.fedex.candidates[0] == beta0 and len(member.fedex.candidates) == 27
    for cand in member.fedex.candidates:  # log10 lr within +-(b - a) eps0 = 0.25, batch size one neighbour at most
        assert abs(cand["train.lr"] - beta0["train.lr"]) <= 2.5 * 0.1 + 1e-12
        assert abs(cand["train.batch_size"] - beta0["train.batch_size"]) <= 1 and 0 <= cand["train.batch_size"] < 4
    assert grid.discrete
    wide = fedex_start(pop.space.client, np.random.default_rng(0), mode="space")  # the old switch: the whole space
    assert max(abs(c["train.lr"] - wide.candidates[0]["train.lr"]) for c in wide.candidates) > 0.25


def test_fedex_aggressive_step_and_discounted_baseline_by_hand() -> None:
    cands = [{"train.lr": float(i)} for i in range(3)]
    state = FedExState(candidates=cands, z=[-math.log(3)] * 3, trace=[0.4, 0.2], discount=0.5, sched="aggressive")
    new = fedex_step(state, chosen=[0, 1], errors=[0.2, 0.6], weights=[1.0, 1.0])
    b = (0.5 * 0.4 + 1.0 * 0.2) / 1.5  # the discounted mean of the earlier rounds' errors, the newest weighted 1
    grad = np.array([0.5 * (0.2 - b) * 3, 0.5 * (0.6 - b) * 3, 0.0])
    z = np.full(3, -math.log(3)) - math.sqrt(2 * math.log(3)) / np.abs(grad).max() * grad
    assert np.allclose(new.theta, np.exp(z - np.logaddexp.reduce(z))) and new.trace == [0.4, 0.2, 0.4]


def test_after_fedpop_ls_window_every_client_trains_with_the_best_local_vector() -> None:
    pop = started("tune.fedpop_l=true", "tune.configs=1", "rounds=20")  # T_g = 2: FedPop-L in round 1 only
    pop.play_round(1)
    member = pop.members[0]
    assert member.best_local is not None
    best = member.betas[member.best_local]
    assert pop.local_vectors(member, 2, 2) == [best, best]
    keep = started("tune.fedpop_l=true", "tune.configs=1", "rounds=20", "tune.l_after=keep")
    keep.play_round(1)
    assert keep.local_vectors(keep.members[0], 2, 2) == keep.members[0].betas  # scattered, as before


@pytest.mark.parametrize("rule", ["double", "annealed"])
def test_fedpop_g_new_beta0_takes_twice_eps0_or_the_annealed_eps(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    seen: dict[str, float] = {}

    def spy(*args: Any, **kwargs: Any) -> list[Any]:
        seen.update(eps=args[3], beta_eps=kwargs["beta_eps"])
        return []

    monkeypatch.setattr(population_module, "fedpop_g", spy)
    pop = started("tune.configs=3", "tune.fedpop_g=true", "tune.clients=fixed", "rounds=20", f"tune.g_beta_eps={rule}")
    for member in pop.members:
        member.history = [1.0]
    pop.global_search(10)
    assert seen["eps"] == pytest.approx(0.05)  # alpha's eps: 0.1 / 2 (1 + cos(pi / 2))
    assert seen["beta_eps"] == pytest.approx(0.2 if rule == "double" else 0.05)


def test_per_member_sampling_draws_each_members_own_clients() -> None:
    pop = started("tune.configs=3", "tune.sampling=per_member", "data.num_clients=8", "data.partition=iid")
    shared = [0, 1, 2, 3]
    drawn = [clients_of(pop, m, shared) for m in pop.members]
    assert all(len(d) == 4 == len(set(d)) and d == sorted(d) for d in drawn) and len({tuple(d) for d in drawn}) > 1
    assert drawn == [clients_of(pop, m, shared) for m in pop.members]  # re-derived from the seed
    same = started("tune.configs=3")
    assert clients_of(same, same.members[0], shared) == shared  # tune.sampling: shared: the round's sample


def clients_of(pop: Population, member: Any, shared: list[int]) -> list[int]:
    """The clients `member` trains in round 1 when the round's sample is `shared`."""
    return list(plan_round(pop, member, 1, shared).messages)

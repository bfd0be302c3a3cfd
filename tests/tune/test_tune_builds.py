"""Build-time keys tuned per member (tune/member.py `MethodCopies.build`): each member's method and model are built
from its own configuration, the chosen one re-runs to the member's result, FedPop-G's replacement takes its
parent's build with its weights; and a newly declared per-call key changes training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.config import load_config
from fedhet.engine.checkpoint import load_checkpoint
from fedhet.engine.experiment import build_experiment
from fedhet.errors import ConfigError
from fedhet.launch.run import run_experiment
from fedhet.runtimes.batched.rule import lane_group
from fedhet.tune.checkpoint import FILENAME, load_population
from fedhet.tune.config import resolve_space, tune_config
from fedhet.tune.population import Population
from fedhet.tune.run import run_tuning

BASE = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "model.args={hidden: [8]}",
        "train.local_steps=2", "rounds=2", "run.num_threads=1", "run.quiet=true", "server.fraction_fit=0.5",
        "eval.every=2", "method=moon", "tune.configs=3", "tune.clients=fixed", "tune.fedpop_l=false",
        "tune.fedpop_g=false"]
BUILT = ("tune.space={server: {model.args.hidden: {type: choice, values: [[6], [12], [24]]}, "
         "method_args.projection_dim: {type: choice, values: [3, 5, 7]}}, "
         "client: {train.lr: {type: log_uniform, low: -2, high: -1}}}")


def shapes(model: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.items()}


def test_rs_builds_each_member_from_its_own_values_and_the_chosen_one_reruns_to_its_result(tmp_path: Path) -> None:
    cfg = load_config(None, [*BASE, BUILT])
    result = run_tuning(cfg, tmp_path / "tune", progress=False)
    members = load_population(result.run_dir / "checkpoints" / FILENAME, cfg).members
    space = resolve_space(tune_config(cfg))
    values = [m.values(space) for m in members]
    assert len({str(v["model.args.hidden"]) for v in values}) > 1  # the members really differ in their builds
    for member, chosen in zip(members, values, strict=True):
        own = load_config(None, [*BASE, f"model.args.hidden={chosen['model.args.hidden']}",
                                 f"method_args.projection_dim={chosen['method_args.projection_dim']}"])
        assert shapes(member.server.model) == shapes(build_experiment(own).init_server().model)
    best = load_config(str(result.run_dir / "tune" / "best_config.yaml"))
    chosen_member = members[result.summary["tune"]["selected"]]
    assert best.model.args["hidden"] == chosen_member.values(space)["model.args.hidden"]
    rerun = run_experiment(best, tmp_path / "rerun", progress=False)
    ref = load_checkpoint(rerun.run_dir / "checkpoints" / "latest.pt", best.to_dict())["server"]
    assert all(torch.equal(chosen_member.server.model[k], ref.model[k]) for k in ref.model)


def test_fedpop_g_replacements_take_their_parents_build_with_its_weights() -> None:
    cfg = load_config(None, [*BASE, BUILT, "rounds=4", "tune.g_interval=0.5", "tune.fedpop_g=true",
                             "tune.p_re0=1.0", "tune.configs=4"])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start()
    for rnd in range(1, cfg.rounds + 1):
        pop.play_round(rnd)
    assert any(m.parent is not None for m in pop.members)
    for member in pop.members:  # its weights fit the method and model its own values build
        own = pop.copies.of(member.alpha, member.beta0)
        assert shapes(member.server.model) == shapes(own.init_server().model)
        assert own.params.projection_dim == member.values(pop.space)["method_args.projection_dim"]


@pytest.mark.parametrize("key,low,high", [("method_args.beta", 0.0, 10.0), ("method_args.eta_g", 0.001, 1.0)])
def test_a_per_call_key_changes_training(key: str, low: float, high: float) -> None:
    """FRAug's L_FT weight (beta) and generator step size (eta_g): two members that differ only in it score
    differently, from one shared build."""
    cfg = load_config(None, [*BASE, "method=fraug", "rounds=2", "tune.configs=2",
                             f"tune.space={{client: {{{key}: {{type: choice, values: [{low}, {high}]}}}}}}"])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start(vectors=[({}, {key: 0}), ({}, {key: 1})])
    for rnd in range(1, cfg.rounds + 1):
        pop.play_round(rnd)
    first, second = pop.members
    assert pop.copies.build({key: 0}) is pop.copies.build({key: 1}) is pop.exp.algorithm
    assert pop.copies.of({}, second.beta0).params.__dict__[key.split(".")[1]] == high
    assert first.history != second.history


def test_lanes_group_only_members_with_the_same_build() -> None:
    """The batched runtime lanes copies with equal `lane_group` keys: one build per distinct build-time values."""
    cfg = load_config(None, [*BASE, BUILT])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    same = [pop.copies.of({"model.args.hidden": 0, "method_args.projection_dim": 1}, {"train.lr": lr})
            for lr in (-2.0, -1.0)]
    other = pop.copies.of({"model.args.hidden": 1, "method_args.projection_dim": 1}, {"train.lr": -2.0})
    assert lane_group(same[0]) == lane_group(same[1]) != lane_group(other)
    assert sum(p.numel() for p in other.parts.new().parameters()) > sum(
        p.numel() for p in same[0].parts.new().parameters())


def test_a_model_value_that_does_not_build_is_one_clear_error_before_training() -> None:
    cfg = load_config(None, [*BASE, "tune.space={server: {model.args.dropout: {type: uniform, low: 0.0, high: 1.5}}}"])
    tune = tune_config(cfg)
    with pytest.raises(ConfigError, match="'model.args.dropout': the value 1.5 it can take does not build.*narrow"):
        Population(build_experiment(cfg), tune, resolve_space(tune))


def test_the_summary_says_whether_the_chosen_build_is_personalized(tmp_path: Path) -> None:
    """EmbNoise without local_bn (build-time) is FedAvg plus noise: not personalized, unlike its default."""
    space = "tune.space={server: {method_args.local_bn: {type: choice, values: [false]}}}"
    cfg = load_config(None, [*BASE, "method=embnoise", "model.args={hidden: [8], norm: bn}", "tune.configs=2",
                             "rounds=1", space])
    assert run_tuning(cfg, tmp_path, progress=False).summary["personalized"] is False  # the base (True) is not


def test_a_train_or_server_value_the_method_refuses_when_built_is_one_clear_error() -> None:
    """FedDyn sets the global model itself: `fedhet run` refuses a server lr other than 1, and so does tuning."""
    cfg = load_config(None, [*BASE, "method=feddyn", "tune.space={server: {server.lr: {type: log_uniform, low: -1, "
                                                     "high: 0}}}"])
    tune = tune_config(cfg)
    with pytest.raises(ConfigError, match="'server.lr': the value 0.1 it can take does not build.*feddyn sets the "
                       "global model itself"):
        Population(build_experiment(cfg), tune, resolve_space(tune))

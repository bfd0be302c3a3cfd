"""The tuning population (FedPop runner S6): with fixed vectors and no search between rounds, each member is
exactly the federation `fedhet run` trains for its configuration; with the Delta-ball its clients train with
their own local vectors, and every member is scored by its active clients' validation losses."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from fedhet.config import load_config
from fedhet.engine.checkpoint import load_checkpoint
from fedhet.engine.experiment import build_experiment
from fedhet.launch.run import run_experiment
from fedhet.tune import apply_vector, check_space
from fedhet.tune.config import resolve_space, tune_config
from fedhet.tune.population import Population, member_scores

BASE = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "train.local_steps=3", "rounds=3",
        "run.num_threads=1", "run.quiet=true", "server.fraction_fit=0.5", "eval.every=3", "tune.configs=2",
        "tune.fedpop_l=false", "tune.fedpop_g=false",
        "tune.space={client: {train.lr: {type: log_uniform, low: -2, high: -0.5}, "
        "train.batch_size: {type: choice, values: [8, 16]}}, server: {server.lr: {type: log_uniform, low: -0.3, "
        "high: 0.3}}}"]


def population(*extra: str) -> Population:
    cfg = load_config(None, [*BASE, *extra])
    tune = tune_config(cfg)
    space = resolve_space(tune)
    check_space(space, cfg)
    pop = Population(build_experiment(cfg), tune, space)
    pop.start()
    for rnd in range(1, cfg.rounds + 1):
        pop.play_round(rnd)
    return pop


def test_each_member_is_the_run_of_its_configuration(tmp_path: Path) -> None:
    pop = population("tune.clients=fixed")
    assert len(pop.members) == 2 and pop.members[0].values(pop.space) != pop.members[1].values(pop.space)
    for member in pop.members:
        cfg = apply_vector(pop.exp.config, pop.space.joint, {**member.alpha, **member.beta0})
        cfg.tune = {}
        result = run_experiment(cfg, tmp_path / f"member{member.slot}", progress=False)
        ref = load_checkpoint(result.run_dir / "checkpoints" / "latest.pt", cfg.to_dict())["server"]
        assert all(torch.equal(member.server.model[k], ref.model[k]) for k in ref.model)
        assert len(member.history) == 3 and all(s > 0 for s in member.history)


def test_ball_clients_train_with_their_own_vectors_and_the_member_is_scored_by_them() -> None:
    pop = population("tune.clients=ball")
    for member in pop.members:
        assert len(member.betas) == 2 and member.betas[0] != member.betas[1]  # one vector per active client
        assert member.betas[0] != member.beta0
        assert member.history[-1] == pytest.approx(statistics.fmean(pop.last_scores[member.slot]))
    fixed = population("tune.clients=fixed")  # the same (alpha, beta0): the clients' own vectors change the model
    assert [(m.alpha, m.beta0) for m in fixed.members] == [(m.alpha, m.beta0) for m in pop.members]
    assert all(any(not torch.equal(a.server.model[k], b.server.model[k]) for k in a.server.model)
               for a, b in zip(fixed.members, pop.members, strict=True))
    again = population("tune.clients=ball")  # the tuner's draws are re-derived from the seed
    assert [m.betas for m in again.members] == [m.betas for m in pop.members]
    assert all(torch.equal(a.server.model[k], b.server.model[k])
               for a, b in zip(again.members, pop.members, strict=True) for k in a.server.model)


def started(*extra: str) -> Population:
    cfg = load_config(None, [*BASE, *extra])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start()
    return pop


def test_fedpop_g_gives_the_worst_member_a_copy_of_a_top_members_federation() -> None:
    pop = started("tune.configs=3", "rounds=4", "tune.g_interval=0.5", "tune.fedpop_g=true")  # T_g = 2
    pop.play_round(1)
    assert all(m.parent is None for m in pop.members)  # round 1 is no FedPop-G round
    before = [dict(m.alpha) for m in pop.members]
    pop.play_round(2)
    children = [m for m in pop.members if m.parent is not None]
    assert len(children) == 1  # ceil(0.3 * 3)
    child, parent = children[0], pop.members[children[0].parent]
    assert parent.parent is None and child.born == 2 and child.history == [] and child.betas == []
    assert all(torch.equal(child.server.model[k], parent.server.model[k]) for k in parent.server.model)
    assert child.server.model is not parent.server.model  # a copy, not shared
    assert child.alpha != before[child.slot] and child.alpha != parent.alpha  # Evo of the parent's
    live_scores = {m.slot: m.history for m in pop.members if m is not child}
    assert all(len(h) == 2 for h in live_scores.values())


def test_fedpop_l_replaces_the_worst_local_vector_inside_its_window_only() -> None:
    pop = started("tune.fedpop_l=true", "rounds=20", "tune.configs=1", "tune.l_window=0.2")  # T_g 2: window 0.4
    pop.play_round(1)
    member, scores = pop.members[0], pop.last_scores[0]
    worst = max(range(2), key=lambda k: scores[k])
    pop2 = started("tune.fedpop_l=false", "rounds=20", "tune.configs=1")
    pop2.play_round(1)
    drawn = pop2.members[0].betas  # the same Delta-ball draw without FedPop-L
    assert drawn[1 - worst] == member.betas[1 - worst] and drawn[worst] != member.betas[worst]  # only the worst
    pop.play_round(2)  # rounds since init = 1 >= 0.2 T_g: the local search has stopped
    kept = [dict(b) for b in member.betas]
    pop.play_round(3)
    assert member.betas == kept


def test_finetuned_accuracy_trains_each_client_once_from_the_global_model() -> None:
    pop = population("tune.clients=fixed")
    member = pop.members[0]
    tuned, again = pop.finetuned(member, 3), pop.finetuned(member, 3)
    assert tuned == again and set(tuned) == {c.name for c in pop.exp.data.clients}
    global_ = pop.evaluate(member, 3, "test")
    assert any(tuned[name]["loss"] != global_[name]["loss"] for name in tuned)  # one Loc(beta0) pass moved it
    after = pop.evaluate(member, 3, "test")
    assert after == global_  # and nothing of it was kept


@pytest.mark.parametrize("runtime", ["inprocess", "batched"])  # batched: the clients' finetuning as lanes
def test_a_finetuning_that_diverges_keeps_the_global_model(runtime: str) -> None:
    wide = [*BASE[:-1], "tune.clients=fixed", "tune.space={client: {train.lr: {type: log_uniform, low: -2, high: 6}}}",
            f"run.runtime={runtime}", "run.batched_min_lanes=1"]
    cfg = load_config(None, wide)
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start([({}, {"train.lr": -1.5})])
    pop.play_round(1)
    member = pop.members[0]
    assert not any("diverged" in scores for scores in pop.finetuned(member, 1).values())
    global_ = pop.evaluate(member, 1, "test")
    member.beta0 = {"train.lr": 6.0}  # lr 1e6 for the finetuning pass only
    fallen = pop.finetuned(member, 1)
    assert set(fallen) == set(global_)
    assert all(fallen[n]["diverged"] == 1.0 and fallen[n]["accuracy"] == global_[n]["accuracy"] for n in fallen)


def test_a_diverging_configuration_scores_worst_and_stops_without_fedpop_g(tmp_path: Path) -> None:
    from fedhet.errors import FedhetError
    from fedhet.tune.run import run_tuning

    wide = [*BASE[:-1], "tune.clients=fixed", "tune.space={client: {train.lr: {type: log_uniform, low: -2, high: 6}}}"]
    cfg = load_config(None, wide)
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start([({}, {"train.lr": -1.5}), ({}, {"train.lr": 6.0})])  # lr 0.03 and lr 1e6
    pop.play_round(1)
    sane, wild = pop.members
    assert math.isfinite(sane.history[-1]) and sane.alive
    assert math.isinf(wild.history[-1]) and not wild.alive  # worst score; random search stops training it
    assert pop.tried.counts()[1] == 2  # the diverged vector was tried too (Table 1)
    pop.play_round(2)
    assert len(sane.history) == 2 and len(wild.history) == 1
    only_wild = [*wide[:-1], "tune.space={client: {train.lr: {type: log_uniform, low: 5, high: 6}}}"]
    with pytest.raises(FedhetError, match="every configuration's training diverged in round 1"):
        run_tuning(load_config(None, only_wild), tmp_path, progress=False)


def test_a_job_whose_every_configuration_diverges_after_learning_ends_with_its_results(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """Every configuration diverging in round 2 (after round 1 trained) ends tuning there: the final configuration
    is chosen among them in their last finite state, and summary.json says where it halted."""
    from fedhet.tune.run import run_tuning

    real = Population.train_round

    def train_round(self: Population, rnd: int) -> None:
        if rnd < 2:
            return real(self, rnd)
        for member in self.members:
            if member.alive:
                self.diverged(member, rnd, "forced")
        return None

    monkeypatch.setattr(Population, "train_round", train_round)
    result = run_tuning(load_config(None, [*BASE, "rounds=4"]), tmp_path, progress=False)
    summary = result.summary
    assert summary["halted"] == 2 and summary["rounds_completed"] == 2 == result.rounds_completed
    assert math.isfinite(summary["final"]["avg"]["loss"])  # the round-1 state, evaluated on test
    assert (result.run_dir / "tune" / "best_config.yaml").is_file()
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and max(r["round"] for r in rows) == 2  # the curve ends where tuning ended


def test_a_job_killed_after_halting_resumes_to_its_end_without_training_on(tmp_path: Path, monkeypatch) -> None:
    """The halting round's checkpoint says the job halted: a resume after a kill before `finish` finishes the job
    as it halted (round 2), rather than training the revived configurations on to round 4."""
    from fedhet.tune.run import TuningJob, run_tuning

    real_round, real_finish = Population.train_round, TuningJob.finish
    cfg = load_config(None, [*BASE, "rounds=4"])
    whole = _halting_at_2(monkeypatch, real_round, lambda: run_tuning(cfg, tmp_path / "whole", progress=False))

    def killed(self: TuningJob) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(TuningJob, "finish", killed)
    with pytest.raises(KeyboardInterrupt):
        _halting_at_2(monkeypatch, real_round, lambda: run_tuning(cfg, tmp_path / "killed", progress=False))
    monkeypatch.setattr(TuningJob, "finish", real_finish)
    monkeypatch.setattr(Population, "train_round", real_round)  # a resume that trained would now learn on
    resumed = run_tuning(cfg, tmp_path / "killed", progress=False, resume=True)
    assert resumed.summary["halted"] == 2 and resumed.rounds_completed == 2
    assert resumed.summary["final"] == whole.summary["final"]


def _halting_at_2(monkeypatch, real_round, job):  # type: ignore[no-untyped-def]
    """Run `job` with every live configuration diverging from round 2 on."""

    def train_round(self: Population, rnd: int) -> None:
        if rnd < 2:
            return real_round(self, rnd)
        for member in self.members:
            if member.alive:
                self.diverged(member, rnd, "forced")
        return None

    monkeypatch.setattr(Population, "train_round", train_round)
    return job()


def test_fedpop_l_ranks_local_vectors_by_their_discounted_losses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The official code's FedPop-L score: the 0.9-discounted mean of each local vector's losses since it was set
    (`tune.l_score: round`: this round's alone); a replaced vector starts a new list, a kept one extends its own."""
    import fedhet.tune.population as population_module

    seen: list[list[float]] = []
    real = population_module.fedpop_l

    def recording(betas, scores, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(scores))
        return real(betas, scores, *args, **kwargs)

    monkeypatch.setattr(population_module, "fedpop_l", recording)
    for rule in ("discounted", "round"):
        pop = started("tune.fedpop_l=true", "tune.clients=ball", "rounds=40", f"tune.l_score={rule}")  # window: 1
        member = pop.members[0]
        member.betas = [dict(member.beta0) for _ in range(3)]
        member.betas[2] = {**member.beta0, "train.lr": -1.9}
        member.beta_history = [[4.0, 1.0], [1.0, 1.0], [2.0]]  # old losses of slots 0-2
        pop.local_search(member, 1, [1.0, 3.0, 5.0])
        w2, w = 0.81, 0.9  # the newest loss weighted 1
        expected = ([(w2 * 4 + w * 1 + 1) / (w2 + w + 1), (w2 * 1 + w * 1 + 3) / (w2 + w + 1), (w * 2 + 5) / (w + 1)]
                    if rule == "discounted" else [1.0, 3.0, 5.0])
        assert seen[-1] == pytest.approx(expected)
        assert member.betas[2] != {**member.beta0, "train.lr": -1.9}  # the worst slot was replaced ...
        assert member.beta_history == [[4.0, 1.0, 1.0], [1.0, 1.0, 3.0], []]  # ... and its list restarts


def test_last_weighted_scores_a_member_by_its_last_rounds_validation_size_weighted_loss() -> None:
    """`tune.score: last_weighted` (the official code's FedPop-G score) weights each active client's validation
    loss by its validation-set size; `history` (the paper's scores) keeps the plain mean."""
    import dataclasses

    from torch.utils.data import TensorDataset

    from fedhet.core.messages import Message, Reply
    from fedhet.tune.fitting import CHECK_LOSS

    pop = started("tune.score=last_weighted")
    clients = list(pop.exp.data.clients)
    for cid, n in ((0, 1), (1, 3)):
        clients[cid] = dataclasses.replace(clients[cid], val=TensorDataset(torch.zeros(n, 1)))
    pop.exp = dataclasses.replace(pop.exp, data=dataclasses.replace(pop.exp.data, clients=clients))
    member = pop.members[0]
    replies = [Reply(cid, Message(scalars={CHECK_LOSS: loss, "check_accuracy": 0.5}), 10)
               for cid, loss in ((0, 1.0), (1, 3.0))]
    pop.after_training(member, 1, replies)
    assert member.history == [2.0] and member.weighted_last == pytest.approx((1 * 1.0 + 3 * 3.0) / 4)
    assert member_scores(pop.tune, pop.t_g, [member]) == [member.weighted_last]
    pop.tune.score = "last"
    assert member_scores(pop.tune, pop.t_g, [member]) == [2.0]

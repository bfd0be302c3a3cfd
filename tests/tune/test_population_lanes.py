"""A tuning population as lanes of the batched runtime (FedPop runner S12): every member's clients, each with its
own lr / momentum / weight decay / batch size / mu, trained in shared vectorized steps, give what the same
population gives in-process (float tolerance; the same FedPop decisions), a diverging member fails alone, and a
stopped lane job resumes bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tune_testing import played

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.batched.accumulate import AccumulatingRunner
from fedhet.runtimes.batched.runtime import FitJob
from fedhet.runtimes.inprocess import InProcessClients
from fedhet.tune.config import resolve_space, tune_config
from fedhet.tune.population import Population, plan_round
from fedhet.tune.run import run_tuning

SPACE = ("tune.space={client: {train.lr: {type: log_uniform, low: -2, high: -0.7}, "
         "train.momentum: {type: uniform, low: 0, high: 0.9}, train.weight_decay: {type: log_uniform, low: -4, "
         "high: -2}, train.batch_size: {type: choice, values: [8, 16]}, method_args.mu: {type: log_uniform, "
         "low: -3, high: -1}}, server: {server.lr: {type: log_uniform, low: -0.3, high: 0.3}}}")
BASE = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "train.local_steps=3",
        "method=fedprox", "rounds=4", "run.num_threads=1", "run.quiet=true", "server.fraction_fit=0.5",
        "eval.every=2", "tune.configs=3", "tune.g_interval=0.5", "run.batched_min_lanes=1", SPACE]
TOL = 1e-5


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(a[k], b[k], atol=TOL, rtol=TOL) for k in a)


@pytest.mark.parametrize("split", [False, True], ids=["grouped", "accumulate"])
def test_lanes_give_the_in_process_population_with_fedpop_l_and_g(monkeypatch: pytest.MonkeyPatch,
                                                                   split: bool) -> None:
    """`split`: run.batched_accumulate, the batch sizes 8 and 16 as one group of lanes (micro-batches of 8)."""
    accumulated: list[int] = []
    run = AccumulatingRunner.run
    monkeypatch.setattr(AccumulatingRunner, "run", lambda self, *a: (accumulated.append(self.lanes), run(self, *a))[1])
    seq = played(base=BASE)
    lanes = played("run.runtime=batched", f"run.batched_accumulate={str(split).lower()}", base=BASE)
    assert isinstance(lanes.runner, BatchedClients) and bool(accumulated) == split
    assert any(m.parent is not None for m in seq.members)  # FedPop-G copied a member (T_g = 2)
    for a, b in zip(seq.members, lanes.members, strict=True):
        # the decisions (FedPop-L's local vectors, FedPop-G's copies) depend on score ranks: they are equal
        assert (a.alpha, a.beta0, a.betas, a.parent, a.born) == (b.alpha, b.beta0, b.betas, b.parent, b.born)
        assert a.history == pytest.approx(b.history, rel=TOL)
        assert close(a.server.model, b.server.model)
    lrs = {beta["train.lr"] for m in seq.members for beta in m.betas}
    assert len(lrs) > 1  # the lanes really differed in lr (one vectorized step carried several values)
    # the finetuned accuracy: every client's Loc(beta^0) pass as one lane, on its own "finetune" stream
    want, got = seq.finetuned(seq.members[0], 4), lanes.finetuned(lanes.members[0], 4)
    assert set(got) == set(want) == {c.name for c in seq.exp.data.clients}
    for name, scores in want.items():
        assert got[name] == pytest.approx(scores, rel=TOL, abs=TOL), name


def test_one_step_of_lanes_with_their_own_hyperparameters_matches_each_client_alone() -> None:
    """Four clients of two members, with different lr / momentum / wd / batch size / mu, in one call."""
    cfg = load_config(None, [*BASE, "run.runtime=batched", "train.local_steps=4"])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start()
    plans = [plan_round(pop, member, 1, [0, 1]) for member in pop.members[:2]]
    jobs = [FitJob(plan.copies[cid], cid, msg, pop.exp.algorithm.init_client(cid)) for plan in plans
            for cid, msg in plan.messages.items()]
    assert len({(job.alg.train_cfg.lr, job.alg.params.mu, job.alg.train_cfg.batch_size) for job in jobs}) == 4
    runner = pop.runner
    assert isinstance(runner, BatchedClients)
    sequential = InProcessClients(pop.exp)
    sequential.check_split = "val"
    for job, out in zip(jobs, runner.fit_jobs(1, jobs), strict=True):
        alone = sequential.fit(1, {job.cid: job.msg}, algorithms={job.cid: job.alg})[0].message
        assert out.reply is not None and close(out.reply.arrays, alone.arrays)
        assert out.reply.scalars["check_loss"] == pytest.approx(alone.scalars["check_loss"], rel=TOL)
        assert out.reply.scalars["train_loss"] == pytest.approx(alone.scalars["train_loss"], rel=TOL)


def test_a_diverging_member_fails_alone() -> None:
    huge = ("tune.space={client: {train.lr: {type: choice, values: [0.05, 1.0e+6]}}, server: {server.lr: "
            "{type: choice, values: [1.0]}}}")
    cfg = load_config(None, [*BASE[:-1], huge, "method=fedavg", "tune.clients=fixed", "tune.fedpop_l=false",
                             "tune.fedpop_g=false", "tune.configs=2", "run.runtime=batched", "rounds=2"])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start([({"server.lr": 0}, {"train.lr": 0}), ({"server.lr": 0}, {"train.lr": 1})])
    pop.play_round(1)
    good, bad = pop.members
    assert bad.history == [math.inf] and not bad.alive
    assert good.alive and math.isfinite(good.history[0])


def test_a_stopped_lane_job_resumes_bit_for_bit(tmp_path: Path) -> None:
    cfg = load_config(None, [*BASE, "run.runtime=batched"])
    whole = run_tuning(cfg, tmp_path / "whole", progress=False)
    assert run_tuning(cfg, tmp_path / "parts", progress=False, stop_after=2).rounds_completed == 2
    resumed = run_tuning(cfg, tmp_path / "parts", progress=False, resume=True)
    assert resumed.summary["final"] == whole.summary["final"] and resumed.summary["tune"] == whole.summary["tune"]
    for name in ("metrics.jsonl", "tune/members.jsonl"):
        assert (tmp_path / "parts" / name).read_text() == (tmp_path / "whole" / name).read_text()

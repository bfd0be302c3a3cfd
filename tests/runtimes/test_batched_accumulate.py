"""`run.batched_accumulate`: lanes of different batch sizes split their batches into micro-batches and train as
one group (runtimes/batched/accumulate.py); equal to in-process up to float rounding."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from fedhet.algorithms import ALGORITHMS
from fedhet.algorithms.base import with_hparams
from fedhet.algorithms.fedavg import FedAvg
from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.launch.run import make_executor
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.batched.accumulate import AccumulatingRunner, micro_rows, splits_batches
from fedhet.runtimes.inprocess import InProcessClients

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8, norm: none}",
        "train.lr=0.05", "train.momentum=0.5", "train.weight_decay=0.001", "data.max_test_per_client=20",
        "run.quiet=true", "run.device=cpu", "run.num_threads=1", "data.augment=false", "run.runtime=batched",
        "run.batched_min_lanes=1", "run.batched_accumulate=true",
        # clients of 37-120 examples: every batch size leaves a short last batch somewhere
        "data.partition=dirichlet", "data.num_clients=6", "data.alpha=0.5", "data.fraction=0.3",
        "train.local_epochs=2"]
SIZES = (8, 16, 32, 8, 24, 16)  # gcd 8; 24 = 3 parts
LRS = (0.05, 0.02, 0.1, 0.03, 0.05, 0.08)


def fit_both(monkeypatch: pytest.MonkeyPatch, *overrides: str) -> tuple[list[Any], list[Any], list[int]]:
    """Round 1 of every client, each with its own batch size and lr, on both runtimes; and the lane counts of the
    accumulating passes."""
    exp = build_experiment(load_config(None, [*BASE, *overrides]))
    lanes, seq = make_executor(exp), InProcessClients(exp)
    assert isinstance(lanes, BatchedClients)
    alg = exp.algorithm
    copies = {cid: with_hparams(alg, dataclasses.replace(alg.train_cfg, batch_size=SIZES[cid], lr=LRS[cid]))
              for cid in range(len(SIZES))}
    msgs = {cid: alg.broadcast(alg.init_server(), exp.round_info(1), cid) for cid in copies}
    accumulated: list[int] = []
    run = AccumulatingRunner.run
    monkeypatch.setattr(AccumulatingRunner, "run",
                        lambda self, *a: (accumulated.append(self.lanes), run(self, *a))[1])
    return lanes.fit(1, msgs, copies), seq.fit(1, msgs, copies), accumulated


@pytest.mark.parametrize("overrides", [["method=fedavg"], ["method=fedprox", "method_args={mu: 0.5}"],
                                       ["method=feddyn", "method_args={alpha: 0.5}"],
                                       ["method=fedavg", "train.grad_clip=0.5"]],
                         ids=["fedavg", "fedprox", "feddyn", "clip"])
def test_split_batches_match_inprocess(monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> None:
    """All six clients (four batch sizes) train as one group of lanes; every reply's weights, loss and step count
    agree with in-process (a batch's gradient is the size-weighted mean of its parts')."""
    got, want, accumulated = fit_both(monkeypatch, *overrides)
    assert accumulated == [len(SIZES)]
    for a, b in zip(got, want, strict=True):
        assert a.client_id == b.client_id and a.message.scalars == pytest.approx(b.message.scalars, abs=1e-5)
        for k, v in b.message.arrays.items():
            assert torch.allclose(a.message.arrays[k], v, atol=1e-5), k


def test_batchnorm_trains_by_batch_size_groups_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """BatchNorm's statistics are per batch: its pass is not split (lanes.py's groups), and agrees as usual (with
    BatchNorm: input noise, few steps, 1e-4; test_batched_runtime.py's docstring says why)."""
    got, want, accumulated = fit_both(monkeypatch, "method=fedavg", "model.args={width: 8}", "data.input_noise_std=0.1",
                                      "train.local_steps=2")
    assert accumulated == []
    for a, b in zip(got, want, strict=True):
        for k, v in b.message.arrays.items():
            assert torch.allclose(a.message.arrays[k], v, atol=1e-4), k


class Overridden(FedAvg):
    name = "overridden_loss"

    def loss(self, work: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().loss(work, x, y) * x.shape[0]  # a sum: not a mean over the batch


def test_which_methods_split_their_batches() -> None:
    """FedAvg's loss and FedProx's (declared) split; a method overriding `loss` or `passes` without declaring
    it does not, nor do batch sizes sharing one size or a divisor below MIN_ROWS."""
    exp = build_experiment(load_config(None, [*BASE, "method=fedavg"]))
    made = {name: ALGORITHMS.get(name) for name in ("fedavg", "fedprox", "ditto", "moon", "fedrep")}
    assert {n: splits_batches(cls.__new__(cls)) for n, cls in made.items()} == {
        "fedavg": True, "fedprox": True, "ditto": False, "moon": False, "fedrep": False}
    assert not splits_batches(Overridden.__new__(Overridden))
    alg = exp.algorithm

    def sized(*sizes: int) -> list[Any]:
        return [with_hparams(alg, dataclasses.replace(alg.train_cfg, batch_size=b)) for b in sizes]

    assert micro_rows(sized(8, 16, 128)) == 8
    assert micro_rows(sized(24, 36)) == 12
    assert micro_rows(sized(16, 16)) is None  # one batch size: lanes.py's single group
    assert micro_rows(sized(8, 9)) is None  # gcd 1

"""Local mini-batches: counts per pass, and no batch of one sample (BatchNorm cannot train on it)."""

from __future__ import annotations

import pytest
import torch
from fedhet_testing import tiny_model
from torch import nn
from torch.utils.data import TensorDataset

from fedhet.config import TrainConfig
from fedhet.core.batches import num_steps
from fedhet.core.contract import LocalPass, OptimSpec, minimize
from fedhet.engine.batching import batches
from fedhet.engine.local import run_pass, train_local


def _data(n: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, 4), torch.arange(n) % 2)


@pytest.mark.parametrize("n, bs, epochs, sizes", [
    (10, 4, 1, [4, 4, 2]),
    (9, 4, 1, [4, 4]),          # 9 = 4 + 4 + 1: the batch of one is dropped
    (9, 4, 2, [4, 4, 4, 4]),
    (1, 4, 1, [1]),             # a single-sample dataset still trains (nothing else to use)
    (5, 8, 1, [5]),
])
def test_batches_per_pass(n: int, bs: int, epochs: int, sizes: list[int]) -> None:
    cfg = TrainConfig(batch_size=bs, local_epochs=epochs)
    got = [len(y) for _, y in batches(_data(n), cfg, generator=torch.Generator().manual_seed(0))]
    assert got == sizes and num_steps(n, cfg) == len(sizes)


def test_local_steps_cycle_without_singletons() -> None:
    cfg = TrainConfig(batch_size=4, local_steps=5)
    got = [len(y) for _, y in batches(_data(9), cfg, generator=torch.Generator().manual_seed(0))]
    assert got == [4] * 5 and num_steps(9, cfg) == 5


def test_batchnorm_model_trains_when_n_mod_batch_is_one() -> None:
    model = tiny_model(bn=True)
    stats = train_local(model, _data(9), TrainConfig(batch_size=4, local_epochs=1, lr=0.1), torch.device("cpu"))
    assert stats.steps == 2


def test_lr_schedule_scales_each_step() -> None:
    """OptimSpec.lr_schedule(t) multiplies lr at step t of the pass (here 1, 0, 0.5): plain SGD on the loss
    w·1 moves w by -lr·factor per step; without the schedule every step would move it by -lr."""
    w = nn.Parameter(torch.zeros(1))
    factors = [1.0, 0.0, 0.5]
    spec = OptimSpec([w], kind="sgd", lr=0.1, lr_schedule=lambda t: factors[t])
    cfg = TrainConfig(local_steps=3, batch_size=1)
    data = TensorDataset(torch.ones(3, 1), torch.zeros(3, dtype=torch.long))
    local_pass = LocalPass("local", minimize(lambda x, y: (w * x).sum()), {"model": spec}, cfg)
    stats, _ = run_pass(local_pass, {}, "test", data, torch.device("cpu"))
    assert stats.steps == 3 and torch.allclose(w.detach(), torch.tensor([-0.15]))

"""Aggregation and the server optimizer against hand computations."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedhet.config import ServerConfig
from fedhet.core.aggregation import ServerOptimizer, average, client_weights


def test_weighted_average_by_hand() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(2)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = average([a, b], client_weights([1, 3], "weighted"))
    # (1*1 + 3*3)/4 = 2.5 ; (1*2 + 3*6)/4 = 5 ; int buffer (2 + 15)/4 = 4.25 -> 4
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert out["n"].dtype == torch.int64 and out["n"].item() == 4


def test_the_mean_is_the_float64_sum_of_scaled_updates_bit_for_bit() -> None:
    """One reused float64 buffer per key (issue 42): the same bits as converting, scaling and summing each update."""
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(4, 300, generator=gen), "h": torch.randn(7, generator=gen).half(),
               "n": torch.randint(0, 9, (3,), generator=gen)} for _ in range(5)]
    weights = [3.0, 1.0, 7.0, 2.0, 5.0]
    out = average(states, weights)
    for key, ref in states[0].items():
        want = sum((s[key].to(torch.float64) * (w / 18.0) for s, w in zip(states, weights, strict=True)),
                   torch.zeros(ref.shape, dtype=torch.float64))
        want = want.round().to(ref.dtype) if not ref.is_floating_point() else want.to(ref.dtype)
        assert out[key].dtype == ref.dtype and torch.equal(out[key], want), key


def test_uniform_average_ignores_sizes() -> None:
    a, b = {"w": torch.tensor([0.0])}, {"w": torch.tensor([4.0])}
    out = average([a, b], client_weights([1, 100], "uniform"))
    assert out["w"].item() == pytest.approx(2.0)


def test_plain_fedavg_replaces_weights() -> None:
    opt = ServerOptimizer(ServerConfig())
    new, _ = opt.step({"w": torch.tensor([1.0])}, {"w": torch.tensor([0.4])}, {})
    assert new["w"].item() == pytest.approx(0.4)


def test_fedavgm_momentum_by_hand() -> None:
    opt = ServerOptimizer(ServerConfig(lr=0.5, momentum=0.9))
    cur = {"w": torch.tensor([1.0])}
    state: dict = {}
    # round 1: delta = 1 - 0.6 = 0.4, buf = 0.4, w = 1 - 0.5*0.4 = 0.8
    cur, state = opt.step(cur, {"w": torch.tensor([0.6])}, state)
    assert cur["w"].item() == pytest.approx(0.8)
    # round 2: delta = 0.8 - 0.7 = 0.1, buf = 0.9*0.4 + 0.1 = 0.46, w = 0.8 - 0.5*0.46 = 0.57
    cur, state = opt.step(cur, {"w": torch.tensor([0.7])}, state)
    assert cur["w"].item() == pytest.approx(0.57)


def test_fedadam_by_hand() -> None:
    opt = ServerOptimizer(ServerConfig(optimizer="adam", lr=0.1, betas=(0.9, 0.99), eps=1e-3))
    cur, _ = opt.step({"w": torch.tensor([1.0])}, {"w": torch.tensor([0.5])}, {})
    # delta = 0.5; m = 0.1*0.5 = 0.05; v = 0.01*0.25 = 0.0025; w = 1 - 0.1*0.05/(0.05 + 0.001)
    assert cur["w"].item() == pytest.approx(1 - 0.1 * 0.05 / (0.05 + 1e-3))


def test_server_lr_decays_per_step() -> None:
    opt = ServerOptimizer(ServerConfig(lr=1.0, lr_decay=0.5))  # StepLR(gamma 0.5): lr 1, 0.5, 0.25, ...
    w, state = {"w": torch.zeros(2)}, {}
    for want in (1.0, 1.5, 1.75):
        w, state = opt.step(w, {"w": w["w"] + 1.0}, state)
        assert torch.allclose(w["w"], torch.full((2,), want))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_buffers_take_the_average_unless_optimize_buffers(optimizer: str) -> None:
    """A BatchNorm running variance stepped with lr 2 and momentum would turn negative (NaN in eval mode): by
    default the model's buffers take the clients' average and only its parameters are stepped."""
    cfg = ServerConfig(optimizer=optimizer, lr=2.0, momentum=0.9 if optimizer == "sgd" else 0.0)
    keys = frozenset({"bn.running_var"})
    cur = {"w": torch.tensor([1.0]), "bn.running_var": torch.tensor([1.0])}
    avg = {"w": torch.tensor([0.2]), "bn.running_var": torch.tensor([0.2])}
    new, state = ServerOptimizer(cfg, keys).step(cur, avg, {})
    assert new["bn.running_var"].item() == pytest.approx(0.2)
    assert new["w"].item() != pytest.approx(0.2) and not any("running_var" in k for k in state)
    stepped, _ = ServerOptimizer(dataclasses.replace(cfg, optimize_buffers=True), keys).step(cur, avg, {})
    assert stepped["bn.running_var"].item() == pytest.approx(new["w"].item())  # the parameters' rule ...
    assert stepped["bn.running_var"].item() < 0  # ... which makes this variance negative


def test_a_method_steps_its_parameters_and_averages_its_batchnorm_buffers() -> None:
    """The buffer keys reach the server optimizer from the model (and survive `with_hparams` copies)."""
    from fedhet.algorithms.base import with_hparams
    from fedhet.config import load_config
    from fedhet.engine.experiment import build_experiment

    cfg = load_config(None, ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={norm: bn}",
                             "server.lr=1.5", "server.momentum=0.5", "run.quiet=true"])
    alg = build_experiment(cfg).algorithm
    for opt in (alg.server_opt, with_hparams(alg, server=cfg.server).server_opt):
        assert opt.buffers and all("running_" in k or "num_batches" in k for k in opt.buffers)

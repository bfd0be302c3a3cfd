"""All (the centralized oracle) and the embedding-noise baselines: the oracle's amount of work per round, the
embnoise loss against a hand computation, where its gradients go, and the noise distributions' moments."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import ALGORITHMS, Algorithm
from fedhet.algorithms.embedding_noise import EmbeddingNoise, sample_noise
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.core.messages import Message
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")


def make(name: str, bn: bool = False, **train: Any) -> Algorithm[Any, Any, Any, Any]:
    cls = ALGORITHMS.get(name)
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2, bn=bn)
    cfg = TrainConfig(**{"lr": 0.1, "momentum": 0.0, "batch_size": 4, "local_steps": 1, **train})
    return cls(cls.Params(), lambda: template, cfg, ServerConfig(), 2, CPU)


def ctx(num_clients: int = 1, n: int = 4) -> ClientContext:
    return ClientContext(client_id=0, info=RoundInfo(round=1, rounds=1, num_clients=num_clients, seed=0),
                         data=tiny_client(n=n, in_dim=2), device=CPU, num_classes=2)


def test_all_takes_local_steps_times_the_number_of_clients() -> None:
    alg = make("all")
    msg = alg.broadcast(alg.init_server(), ctx().info, 0)
    out, _ = fit_client(alg, msg, alg.init_client(0), ctx(num_clients=3))
    assert out.scalars["steps"] == 3  # 1 local step x 3 clients
    ref = make("fedavg", local_steps=3)  # the same three full-batch steps
    ref_out, _ = fit_client(ref, msg, ref.init_client(0), ctx(num_clients=3))
    assert all(torch.allclose(out.arrays[k], ref_out.arrays[k], atol=1e-6) for k in out.arrays)
    # with local_epochs the round is that many epochs over the pooled data, whatever the client count
    epochs = make("all", local_steps=None, local_epochs=2, batch_size=3)
    out_e, _ = fit_client(epochs, msg, epochs.init_client(0), ctx(num_clients=3, n=6))
    assert out_e.scalars["steps"] == 4


def test_embnoise_loss_by_hand_and_the_noise_reaches_the_head_only() -> None:
    alg = make("embnoise", bn=True)
    assert isinstance(alg, EmbeddingNoise) and alg.personalized
    assert not {k for k in alg.parts.shared if k.startswith("features.1.")}  # local BatchNorm (FedBN-style)
    work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx())
    model = work.model
    x, y = ctx().data.train.tensors
    torch.manual_seed(3)
    loss = alg.loss(work, x, y)
    with torch.no_grad():
        u = model.features(x)
        torch.manual_seed(3)
        noisy = u + sample_noise(u.shape, "gaussian", 0.1)
        want = torch.nn.functional.cross_entropy(model.head(u), y) + torch.nn.functional.cross_entropy(
            model.head(noisy), y)
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    body = list(model.features.parameters())
    g_all = torch.autograd.grad(loss, body)
    g_real = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), body)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_all, g_real, strict=True))  # detached u
    fedavg_like = ALGORITHMS.get("embnoise")(EmbeddingNoise.Params(local_bn=False), lambda: model, alg.train_cfg,
                                             ServerConfig(), 2, CPU)
    assert not fedavg_like.personalized and fedavg_like.parts.shared == set(model.state_dict())


@pytest.mark.parametrize(("distribution", "variance"), [("uniform", 1 / 3), ("laplace", 2.0), ("gaussian", 1.0)])
def test_noise_is_zero_mean_with_the_documented_variance(distribution: str, variance: float) -> None:
    torch.manual_seed(0)
    gamma = 0.5
    noise = sample_noise((200_000,), distribution, gamma)
    assert abs(noise.mean().item()) < 0.01
    assert noise.var().item() == pytest.approx(variance * gamma**2, rel=0.03)
    if distribution == "uniform":
        assert noise.abs().max().item() <= gamma
    if distribution == "laplace":  # E|X| = gamma for Laplace(0, gamma)
        assert noise.abs().mean().item() == pytest.approx(gamma, rel=0.02)
    assert math.isfinite(noise.abs().max().item())


def test_embnoise_params_are_validated() -> None:
    for bad in ({"distribution": "cauchy"}, {"gamma": 0.0}):
        with pytest.raises(ConfigError):
            EmbeddingNoise.Params(**bad).validate()
    with pytest.raises(ConfigError):
        sample_noise((2,), "cauchy", 0.1)

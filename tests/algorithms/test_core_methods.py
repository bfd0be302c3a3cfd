"""FedAvg, FedBN, Single and All: update rules against hand computations."""

from __future__ import annotations

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model
from torch import nn

from fedhet.algorithms import ALGORITHMS
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.core.messages import Reply
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")


def make(name: str, bn: bool = False, lr: float = 0.1, n: int = 4):
    cls = ALGORITHMS.get(name)
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2, bn=bn)
    train = TrainConfig(lr=lr, momentum=0.0, batch_size=n, local_steps=1)
    return cls(cls.Params(), lambda: template, train, ServerConfig(), 2, CPU)


def info(rnd: int = 1, num_clients: int = 2) -> RoundInfo:
    return RoundInfo(round=rnd, rounds=1, num_clients=num_clients, seed=0)


def ctx(cid: int, n: int = 4, seed: int = 0, num_clients: int = 2) -> ClientContext:
    return ClientContext(client_id=cid, info=info(1, num_clients),
                         data=tiny_client(n=n, in_dim=2, seed=seed, name=f"c{cid}"), device=CPU, num_classes=2)


def manual_sgd_step(state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
    """One full-batch SGD step on logits = (x W1^T + b1) W2^T + b2 with mean cross-entropy, written out."""
    w = {k: v.clone().requires_grad_(True) for k, v in state.items()}
    u = x @ w["features.0.weight"].T + w["features.0.bias"]
    logits = u @ w["head.weight"].T + w["head.bias"]
    logp = logits - logits.logsumexp(dim=1, keepdim=True)
    loss = -logp[torch.arange(len(y)), y].mean()
    grads = torch.autograd.grad(loss, list(w.values()))
    return {k: (v - lr * g).detach() for (k, v), g in zip(w.items(), grads, strict=True)}


def test_fedavg_round_by_hand() -> None:
    alg = make("fedavg")
    server = alg.init_server()
    replies, expected = [], []
    for cid, n in ((0, 4), (1, 2)):
        c = ctx(cid, n=n, seed=cid)
        alg.train_cfg.batch_size = n
        msg = alg.broadcast(server, info(), cid)
        out, _ = fit_client(alg, msg, alg.init_client(cid), c)
        replies.append(Reply(cid, out, n))
        x, y = c.data.train.tensors
        expected.append(manual_sgd_step(server.model, x, y, lr=0.1))
    new = alg.aggregate(server, replies, info()).model
    for key in new:
        want = (4 * expected[0][key] + 2 * expected[1][key]) / 6
        assert torch.allclose(new[key], want, atol=1e-6), key


def test_fedbn_on_a_model_without_batchnorm_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="has none.*fedavg"):
        make("fedbn", bn=False)


def test_fedbn_keeps_bn_local_and_shares_the_rest() -> None:
    alg = make("fedbn", bn=True)
    server = alg.init_server()
    bn = {"features.1.weight", "features.1.bias", "features.1.running_mean", "features.1.running_var",
          "features.1.num_batches_tracked"}
    assert not bn & set(server.model)
    out, state = fit_client(alg, alg.broadcast(server, info(), 0), alg.init_client(0), ctx(0))
    assert not bn & set(out.arrays)
    assert set(state.local) == bn
    assert state.local["features.1.num_batches_tracked"].item() == 1
    # the local BN statistics come back in the next round's model, not the initial ones
    model = alg.client_model(alg.broadcast(server, info(2), 0), state)
    assert torch.equal(model.features[1].running_mean, state.local["features.1.running_mean"])
    assert not torch.equal(model.features[1].running_mean, torch.zeros(2))


def test_single_communicates_nothing() -> None:
    alg = make("single")
    server = alg.init_server()
    msg = alg.broadcast(server, info(), 0)
    assert msg.arrays == {}
    out, state = fit_client(alg, msg, alg.init_client(0), ctx(0))
    assert out.arrays == {}
    assert alg.aggregate(server, [Reply(0, out, 4)], info()) is server
    x, y = ctx(0).data.train.tensors
    init = {k: v for k, v in alg.parts.init_state.items()}
    want = manual_sgd_step(init, x, y, lr=0.1)
    for key, value in want.items():
        assert torch.allclose(state.local[key], value, atol=1e-6)


def test_all_is_centralized() -> None:
    assert ALGORITHMS.get("all").centralized
    assert isinstance(make("all").parts.new(), nn.Module)


def test_all_scales_local_steps_by_client_count() -> None:
    alg = make("all", n=4)
    alg.train_cfg.batch_size = 2
    msg = alg.broadcast(alg.init_server(), info(), 0)
    out, _ = fit_client(alg, msg, alg.init_client(0), ctx(0, n=4, num_clients=3))
    assert out.scalars["steps"] == 3


def test_persisted_optimizer_state_is_not_mutated_by_the_next_fit() -> None:
    alg = make("fedavg")
    alg.train_cfg.momentum, alg.train_cfg.persist_optimizer = 0.9, True
    server = alg.init_server()
    _, first = fit_client(alg, alg.broadcast(server, info(), 0), alg.init_client(0), ctx(0))
    before = {k: v["momentum_buffer"].clone() for k, v in first.optim["model"]["state"].items()}
    _, second = fit_client(alg, alg.broadcast(server, info(2), 0), first, ctx(0))
    for k, buf in before.items():
        assert torch.equal(first.optim["model"]["state"][k]["momentum_buffer"], buf)
        assert not torch.equal(second.optim["model"]["state"][k]["momentum_buffer"], buf)

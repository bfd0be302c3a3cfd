"""SCAFFOLD: the corrected local step and option-II control variates against hand computations."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms.base import spec_of, with_hparams
from fedhet.algorithms.scaffold import Scaffold, ScaffoldClientState
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.core.messages import Message, Reply
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")
LR = 0.1


def make(steps: int = 1, bn: bool = False, num_clients: int | None = None, **server: object) -> Scaffold:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2, bn=bn)
    train = TrainConfig(lr=LR, momentum=0.0, batch_size=4, local_steps=steps)
    return Scaffold(Scaffold.Params(num_clients=num_clients), lambda: template, train, ServerConfig(**server), 2, CPU)


def info(rnd: int = 1, num_clients: int = 1) -> RoundInfo:
    return RoundInfo(round=rnd, rounds=2, num_clients=num_clients, seed=0)


def ctx(cid: int = 0, num_clients: int = 1) -> ClientContext:
    return ClientContext(client_id=cid, info=info(num_clients=num_clients), data=tiny_client(n=4, in_dim=2, seed=cid),
                         device=CPU, num_classes=2)


def grad(w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """d/dw of the mean cross-entropy of logits = (x W1^T + b1) W2^T + b2, written out."""
    w = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    logits = (x @ w["features.0.weight"].T + w["features.0.bias"]) @ w["head.weight"].T + w["head.bias"]
    loss = -(logits - logits.logsumexp(1, keepdim=True))[torch.arange(len(y)), y].mean()
    return dict(zip(w, torch.autograd.grad(loss, list(w.values())), strict=True))


def controls(alg: Scaffold, scale: float) -> dict[str, torch.Tensor]:
    return {k: scale * torch.arange(v.numel(), dtype=torch.float32).reshape(v.shape) / 10
            for k, v in alg.parts.init_state.items()}


def test_corrected_steps_and_option_two_control_variate() -> None:
    alg = make(steps=2)
    server = dataclasses.replace(alg.init_server(), c=controls(alg, 1.0))
    c_i = controls(alg, -0.5)
    msg = alg.broadcast(server, info(), 0)
    given = ScaffoldClientState(c=c_i)
    out, state = fit_client(alg, msg, given, ctx())
    assert isinstance(state, ScaffoldClientState) and given.c is c_i  # the caller's state keeps its c_i
    x_data, y_data = ctx().data.train.tensors
    x = dict(server.model)
    g0 = grad(x, x_data, y_data)  # full batch, so both steps see the same data
    y1 = {k: x[k] - LR * (g0[k] + server.c[k] - c_i[k]) for k in x}
    g1 = grad(y1, x_data, y_data)
    y2 = {k: y1[k] - LR * (g1[k] + server.c[k] - c_i[k]) for k in x}
    for k in x:
        assert torch.allclose(out.arrays["dy/" + k], y2[k] - x[k], atol=1e-6), k
        # option II with K=2: c_i+ = c_i - c + (x - y)/(2 lr) = (g(x) + g(y1)) / 2
        assert torch.allclose(state.c[k], (g0[k] + g1[k]) / 2, atol=1e-5), k
        assert torch.allclose(out.arrays["dc/" + k], state.c[k] - c_i[k], atol=1e-6), k


def test_server_update_of_model_and_control_variate() -> None:
    alg = make(num_clients=4, aggregation="uniform")
    server = dataclasses.replace(alg.init_server(), c=controls(alg, 1.0))
    keys = list(server.model)
    replies = [Reply(cid, Message(arrays={**{"dy/" + k: torch.full_like(v, float(cid + 1)) for k, v in
                                             server.model.items()},
                                          **{"dc/" + k: torch.full_like(v, 2.0 * cid) for k, v in
                                             server.model.items()}}), 10 * (cid + 1))
               for cid in (0, 1)]
    new = alg.aggregate(server, replies, info())
    for k in keys:
        assert torch.allclose(new.model[k], server.model[k] + 1.5)  # x + 1.0 * mean(1, 2)
        assert torch.allclose(new.c[k], server.c[k] + (2 / 4) * 1.0)  # c + |S|/N * mean(0, 2)
    assert new.seen == (0, 1)
    # server.lr is the global step size lr_g
    alg_g = make(num_clients=4, aggregation="uniform", lr=0.5)
    new_g = alg_g.aggregate(server, replies, info())
    assert torch.allclose(new_g.model[keys[0]], server.model[keys[0]] + 0.75)
    # the control variate's step size and per-round decay (FedEx / FedPop's lr_control, gamma_control)
    tuned = with_hparams(alg, params=Scaffold.Params(num_clients=4, control_lr=0.5, control_decay=0.5))
    later = tuned.aggregate(server, replies, info(rnd=3))
    assert torch.allclose(later.c[keys[0]], server.c[keys[0]] + 0.5 * 0.5 ** 2 * (2 / 4) * 1.0)


def test_number_of_clients_comes_from_the_replies() -> None:
    alg = make()
    server = alg.init_server()
    out, _ = fit_client(alg, alg.broadcast(server, info(), 3), alg.init_client(3), ctx(3, num_clients=8))
    assert out.scalars["num_clients"] == 8  # the client's ctx.num_clients
    dc = out.arrays["dc/head.bias"]
    assert torch.allclose(alg.aggregate(server, [Reply(3, out, 4)], info()).c["head.bias"], dc / 8)
    out.scalars.pop("num_clients")  # no report: distinct clients seen so far (here one)
    after = alg.aggregate(server, [Reply(3, out, 4)], info())
    assert torch.allclose(after.c["head.bias"], dc) and after.seen == (3,)
    # seen accumulates over rounds: a second client makes N = 2, so its dc counts half
    later = alg.aggregate(after, [Reply(5, out, 4)], info(2))
    assert later.seen == (3, 5) and torch.allclose(later.c["head.bias"], dc + dc / 2)


def test_communication_layout_and_persistent_client_control_variate() -> None:
    alg = make(bn=True)
    server = alg.init_server()
    params = {"features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias", "head.weight",
              "head.bias"}
    buffers = {"features.1.running_mean", "features.1.running_var", "features.1.num_batches_tracked"}
    msg = alg.broadcast(server, info(), 0)
    assert set(msg.arrays) == params | buffers | {"c/" + k for k in params}
    out, state = fit_client(alg, msg, alg.init_client(0), ctx())
    assert set(out.arrays) == {"dy/" + k for k in params | buffers} | {"dc/" + k for k in params}
    assert alg.reply_layout(msg) == spec_of(out.arrays)  # what the Flower server checks replies against
    assert alg.reply_layout(msg)["dy/features.1.num_batches_tracked"] == ((), torch.int64)
    assert set(state.c) == params
    # round 2 starts from the stored c_i: the correction c - c_i changes the first step
    server = alg.aggregate(server, [Reply(0, out, 4)], info())
    msg2 = alg.broadcast(server, info(2), 0)
    before = copy.deepcopy(state)
    out_fresh, _ = fit_client(alg, msg2, alg.init_client(0), ctx())
    out_kept, state2 = fit_client(alg, msg2, state, ctx())
    assert not torch.allclose(out_fresh.arrays["dy/head.bias"], out_kept.arrays["dy/head.bias"])
    assert set(state2.c) == params
    assert all(torch.equal(state.c[k], before.c[k]) for k in params)  # fit does not modify its input state


def test_rejects_adam_and_bad_num_clients() -> None:
    with pytest.raises(ConfigError):
        Scaffold(Scaffold.Params(), lambda: tiny_model(), TrainConfig(optimizer="adam"), ServerConfig(), 2, CPU)
    with pytest.raises(ConfigError):
        Scaffold.Params(num_clients=0).validate()

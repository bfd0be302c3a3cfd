"""MOON: the model-contrastive loss and one local step against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms.moon import Moon, MoonState, contrastive_loss
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo, ServerState
from fedhet.core.messages import Reply
from fedhet.engine.local import deployed_model, fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")
LR, MU, TAU = 0.1, 2.0, 0.5


def make(**params: object) -> Moon:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    train = TrainConfig(lr=LR, momentum=0.0, batch_size=4, local_steps=1)
    return Moon(Moon.Params(mu=MU, temperature=TAU, **params), lambda: template, train, ServerConfig(), 2, CPU)


def ctx(rnd: int = 1) -> ClientContext:
    info = RoundInfo(round=rnd, rounds=2, num_clients=1, seed=0)
    return ClientContext(client_id=0, info=info, data=tiny_client(n=4, in_dim=2), device=CPU, num_classes=2)


def info(rnd: int) -> RoundInfo:
    return ctx(rnd).info


def fit(alg: Moon, server: ServerState, state: MoonState, rnd: int) -> tuple:
    reply, new = fit_client(alg, alg.broadcast(server, info(rnd), 0), state, ctx(rnd))
    assert isinstance(new, MoonState)
    return reply, new


def test_contrastive_loss_value() -> None:
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 1.0]])  # cos 1 and 1/sqrt(2)
    z_prev = torch.tensor([[0.0, 3.0], [0.0, 1.0]])  # cos 0 and 1
    want = [-math.log(math.exp(1 / TAU) / (math.exp(1 / TAU) + math.exp(0.0))),
            -math.log(math.exp(2 ** -0.5 / TAU) / (math.exp(2 ** -0.5 / TAU) + math.exp(1 / TAU)))]
    assert contrastive_loss(z, z_glob, z_prev, TAU).item() == pytest.approx(sum(want) / 2, rel=1e-6)


def manual_step(w: dict, glob: dict, prev: dict | None, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One SGD step on CE + mu * l_con, every formula written out (z = features = x W1^T + b1)."""
    def feats(p: dict) -> torch.Tensor:
        return x @ p["features.0.weight"].T + p["features.0.bias"]

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    w = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    z = feats(w)
    logits = z @ w["head.weight"].T + w["head.bias"]
    loss = -(logits - logits.logsumexp(1, keepdim=True))[torch.arange(len(y)), y].mean()
    if prev is not None:
        pos, neg = torch.exp(cos(z, feats(glob)) / TAU), torch.exp(cos(z, feats(prev)) / TAU)
        loss = loss + MU * (-torch.log(pos / (pos + neg))).mean()
    grads = torch.autograd.grad(loss, list(w.values()))
    return {k: (v - LR * g).detach() for (k, v), g in zip(w.items(), grads, strict=True)}


def test_first_round_is_plain_ce_then_contrastive_with_the_previous_model() -> None:
    alg = make()
    server = alg.init_server()
    x, y = ctx().data.train.tensors
    out1, state = fit(alg, server, alg.init_client(0), 1)
    want1 = manual_step(server.model, server.model, None, x, y)
    assert state.prev is not None
    for k, v in want1.items():
        assert torch.allclose(out1.arrays[k], v, atol=1e-6), k
        assert torch.allclose(state.prev[k], v, atol=1e-6), k
    # a new global model (as if other clients had moved it), then round 2 uses z_glob and z_prev
    glob = {k: v + 0.3 * torch.randn_like(v) for k, v in server.model.items()}
    state_copy = {k: v.clone() for k, v in state.prev.items()}
    out2, state2 = fit(alg, ServerState(model=glob), state, 2)
    assert all(torch.equal(state.prev[k], v) for k, v in state_copy.items())  # the input state is not modified
    want2 = manual_step(glob, glob, want1, x, y)
    assert state2.prev is not None
    for k, v in want2.items():
        assert torch.allclose(out2.arrays[k], v, atol=1e-5), k
        assert torch.allclose(state2.prev[k], v, atol=1e-5), k
    assert not torch.allclose(want2["features.0.weight"], manual_step(glob, glob, None, x, y)["features.0.weight"])


def test_communication_is_the_whole_model_and_server_is_fedavg() -> None:
    alg = make()
    server = alg.init_server()
    out, state = fit(alg, server, alg.init_client(0), 1)
    assert set(out.arrays) == set(alg.parts.init_state)
    assert state.local == {} and state.prev is not None and set(state.prev) == set(alg.parts.init_state)
    new = alg.aggregate(server, [Reply(0, out, 4)], info(1)).model
    assert all(torch.allclose(new[k], out.arrays[k]) for k in new)


def test_projection_head_is_shared_seeded_and_off_the_classifier_path() -> None:
    alg, again = make(projection_dim=3), make(projection_dim=3)
    keys = set(alg.parts.init_state)
    assert {"projection.0.weight", "projection.2.weight"} <= keys
    assert all(torch.equal(alg.parts.init_state[k], again.parts.init_state[k]) for k in keys)
    server = alg.init_server()
    out, state = fit(alg, server, alg.init_client(0), 1)
    assert set(out.arrays) == keys
    assert torch.equal(out.arrays["projection.2.weight"], server.model["projection.2.weight"])  # round 1: CE only
    glob = {k: v + 0.3 * torch.randn_like(v) for k, v in out.arrays.items()}  # global != previous model
    out2, _ = fit(alg, ServerState(model=glob), state, 2)
    assert not torch.equal(out2.arrays["projection.2.weight"], glob["projection.2.weight"])  # trained by l_con
    model, _ = deployed_model(alg, alg.broadcast(server, info(2), 0), alg.init_client(0), ctx(2))
    x = ctx().data.test.tensors[0]
    assert model(x).shape == (4, 2)


def test_params_are_validated() -> None:
    for bad in ({"mu": -1.0}, {"temperature": 0.0}, {"projection_dim": 0}):
        with pytest.raises(ConfigError):
            Moon.Params(**bad).validate()

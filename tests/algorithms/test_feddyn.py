"""FedDyn (Acar et al., ICLR 2021, Alg. 1): the client's objective, its gradient state and the server's h and
theta against hand computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms.feddyn import FedDyn, FedDynClientState, FedDynServerState
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.core.messages import Message, Reply
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")


def make(alpha: float = 0.5, **server: object) -> FedDyn:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    train = TrainConfig(lr=0.1, momentum=0.0, batch_size=4, local_steps=2)
    return FedDyn(FedDyn.Params(alpha=alpha), lambda: template, train, ServerConfig(**server), 2, CPU)


def ctx(num_clients: int = 4) -> ClientContext:
    return ClientContext(client_id=0, info=RoundInfo(round=1, rounds=2, num_clients=num_clients, seed=0),
                         data=tiny_client(n=4, in_dim=2), device=CPU, num_classes=2)


def filled(alg: FedDyn, value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in alg.parts.init_state.items()}


def test_local_objective_is_ce_minus_linear_term_plus_proximal_term() -> None:
    """With theta - theta^{t-1} = 0.3 and grad L_k(theta_k^{t-1}) = 0.2 on every entry of the 12 parameters
    (2x2 + 2 + 2x2 + 2): loss = CE - 0.2 * sum(theta) + (0.5 / 2) * 12 * 0.3^2."""
    alg = make(alpha=0.5)
    msg = alg.broadcast(alg.init_server(), ctx().info, 0)
    work = alg.start(msg, FedDynClientState(grad=filled(alg, 0.2)), ctx())
    with torch.no_grad():
        for p in work.model.parameters():
            p.add_(0.3)
    x, y = ctx().data.train.tensors
    ce = F.cross_entropy(work.model(x), y)
    total = sum(float(p.detach().sum()) for p in work.model.parameters())
    want = float(ce.detach()) - 0.2 * total + 0.25 * 12 * 0.3 ** 2
    assert float(alg.loss(work, x, y)) == pytest.approx(want, abs=1e-6)


def test_gradient_state_after_a_fit() -> None:
    """grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}), on the trained weights."""
    alg = make(alpha=0.5)
    msg = alg.broadcast(alg.init_server(), ctx().info, 0)
    before = filled(alg, 0.2)
    out, state = fit_client(alg, msg, FedDynClientState(grad=before), ctx())
    assert isinstance(state, FedDynClientState) and set(state.grad) == set(before)
    for k, g in state.grad.items():
        moved = out.arrays[k] - msg.arrays[k]
        assert moved.abs().max() > 0, k
        assert torch.allclose(g, 0.2 - 0.5 * moved, atol=1e-7), k


def test_server_h_and_model_by_hand_over_two_rounds() -> None:
    """theta^0 = 1, alpha = 0.5, m = 4, uniform mean. Round 1: clients at 3 and 2:
    h^1 = 0 - 0.5 / 4 * ((3 - 1) + (2 - 1)) = -0.375;  theta^1 = 2.5 + 0.375 / 0.5 = 3.25.
    Round 2: one client at 4.25: h^2 = -0.375 - 0.5 / 4 * 1 = -0.5;  theta^2 = 4.25 + 0.5 / 0.5 = 5.25."""
    alg = make(alpha=0.5, aggregation="uniform")
    server = FedDynServerState(model=filled(alg, 1.0), h=alg.init_server().h)  # h^0 = 0
    info = RoundInfo(round=1, rounds=2, num_clients=4, seed=0)
    replies = [Reply(i, Message(arrays=filled(alg, v)), 10 * (i + 1)) for i, v in enumerate((3.0, 2.0))]
    server = alg.aggregate(server, replies, info)
    for k in server.model:
        assert torch.allclose(server.h[k], torch.full_like(server.h[k], -0.375)), k
        assert torch.allclose(server.model[k], torch.full_like(server.model[k], 3.25)), k
    server = alg.aggregate(server, [Reply(0, Message(arrays=filled(alg, 4.25)), 10)], info)
    for k in server.model:
        assert torch.allclose(server.h[k], torch.full_like(server.h[k], -0.5)), k
        assert torch.allclose(server.model[k], torch.full_like(server.model[k], 5.25)), k


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="alpha must be > 0"):
        FedDyn.Params(alpha=0.0).validate()
    with pytest.raises(ConfigError, match="server.optimizer=sgd, server.lr=1"):
        make(lr=0.5)

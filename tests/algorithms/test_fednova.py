"""FedNova (Wang et al., NeurIPS 2020, Sec. 4): ||a_i||_1 of local (momentum) SGD and the normalized average,
against hand computations."""

from __future__ import annotations

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms.fednova import FedNova, a_norm
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo, ServerState
from fedhet.core.messages import Message, Reply
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")
INFO = RoundInfo(round=1, rounds=1, num_clients=2, seed=0)


def make(momentum: float = 0.0, steps: int = 3, optimizer: str = "sgd", **server: object) -> FedNova:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    train = TrainConfig(lr=0.1, momentum=momentum, batch_size=2, local_steps=steps, optimizer=optimizer)
    return FedNova(FedNova.Params(), lambda: template, train, ServerConfig(**server), 2, CPU)


def filled(alg: FedNova, value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in alg.parts.init_state.items()}


def test_a_norm_of_sgd_and_momentum_sgd() -> None:
    """Plain SGD: tau. Momentum 0.5, constant gradient g over 2 steps: buf = g, then 1.5 g, so the model moves by
    lr (1 + 1.5) g: ||a||_1 = 2.5 = [2 - 0.5 (1 - 0.25) / 0.5] / 0.5. Three steps: 1 + 1.5 + 1.75 = 4.25."""
    assert a_norm(3, 0.0) == 3.0
    assert a_norm(2, 0.5) == pytest.approx(2.5)
    assert a_norm(3, 0.5) == pytest.approx(4.25)
    assert a_norm(0, 0.9) == pytest.approx(0.0)


def test_clients_reply_the_norm_of_the_steps_they_took() -> None:
    alg = make(momentum=0.5, steps=3)
    data = tiny_client(n=8, in_dim=2)
    context = ClientContext(client_id=0, info=INFO, data=data, device=CPU, num_classes=2)
    out, _ = fit_client(alg, alg.broadcast(alg.init_server(), INFO, 0), alg.init_client(0), context)
    assert out.scalars["steps"] == 3 and out.scalars["a_norm"] == pytest.approx(4.25)


def test_normalized_average_by_hand() -> None:
    """x = 0; client 1: 1 example, 2 steps, y = -2; client 2: 3 examples, 1 step, y = -3 (p = 1/4, 3/4).
    sum p_i Delta_i / a_i = 0.25 * (-1) + 0.75 * (-3) = -2.5; tau_eff = 0.25 * 2 + 0.75 * 1 = 1.25;
    x' = 1.25 * -2.5 = -3.125 (FedAvg: 0.25 * -2 + 0.75 * -3 = -2.75)."""
    alg = make()
    server = ServerState(model=filled(alg, 0.0))
    replies = [Reply(0, Message(arrays=filled(alg, -2.0), scalars={"steps": 2, "a_norm": 2.0}), 1),
               Reply(1, Message(arrays=filled(alg, -3.0), scalars={"steps": 1, "a_norm": 1.0}), 3)]
    new = alg.aggregate(server, replies, INFO)
    for k, v in new.model.items():
        assert torch.allclose(v, torch.full_like(v, -3.125)), k
    same = [Reply(i, Message(arrays=filled(alg, -2.0 - i), scalars={"a_norm": 2.0}), 1 + 2 * i) for i in range(2)]
    for k, v in alg.aggregate(server, same, INFO).model.items():  # equal steps: FedAvg
        assert torch.allclose(v, torch.full_like(v, -2.75)), k


def test_a_client_without_steps_adds_nothing_and_adam_is_refused() -> None:
    alg = make()
    server = ServerState(model=filled(alg, 1.0))
    replies = [Reply(0, Message(arrays=filled(alg, 1.0), scalars={"a_norm": 0.0}), 1),
               Reply(1, Message(arrays=filled(alg, 2.0), scalars={"a_norm": 1.0}), 1)]
    for k, v in alg.aggregate(server, replies, INFO).model.items():  # 1 + 0.5 * (0.5 * 0 + 0.5 * 1) = 1.25
        assert torch.allclose(v, torch.full_like(v, 1.25)), k
    with pytest.raises(ConfigError, match="train.optimizer=sgd"):
        make(optimizer="adam")

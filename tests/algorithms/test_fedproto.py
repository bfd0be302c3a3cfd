"""FedProto: count-weighted prototype aggregation, the regulariser and one local step by hand."""

from __future__ import annotations

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import ClientContext
from fedhet.algorithms.fedproto import FedProto, proto_regularizer
from fedhet.config import ServerConfig, TrainConfig
from fedhet.engine.messages import Message, Reply
from fedhet.errors import ConfigError

CPU = torch.device("cpu")
LR, LAM = 0.1, 0.5


def make(**params: object) -> FedProto:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    train = TrainConfig(lr=LR, momentum=0.0, batch_size=4, local_steps=1)
    return FedProto(FedProto.Params(**{"lam": LAM, **params}), lambda: template, train, ServerConfig(), 2, CPU)


def ctx() -> ClientContext:
    return ClientContext(0, 1, tiny_client(n=4, in_dim=2), CPU, 2, {"rounds": 2})


def proto_reply(cid: int, proto: list, count: list) -> Reply:
    return Reply(cid, Message(arrays={"proto": torch.tensor(proto), "proto_count": torch.tensor(count)}), 1)


def test_aggregation_weights_prototypes_by_class_counts() -> None:
    alg = make()
    server = alg.init_server()
    assert server["proto"].shape == (2, 2) and not server["proto_count"].any()
    replies = [proto_reply(0, [[1.0, 0.0], [9.0, 9.0]], [2.0, 0.0]),  # lacks class 1: its row is skipped
               proto_reply(1, [[4.0, 0.0], [0.0, 4.0]], [1.0, 3.0])]
    new = alg.aggregate(server, replies)
    assert torch.allclose(new["proto"], torch.tensor([[2.0, 0.0], [0.0, 4.0]]))  # (2*1 + 1*4)/3 = 2
    assert torch.equal(new["proto_count"], torch.tensor([3.0, 3.0]))
    # a class no replying client holds keeps its previous prototype
    newer = alg.aggregate(new, [proto_reply(0, [[5.0, 5.0], [0.0, 0.0]], [1.0, 0.0])])
    assert torch.allclose(newer["proto"], torch.tensor([[5.0, 5.0], [0.0, 4.0]]))
    assert torch.equal(newer["proto_count"], torch.tensor([1.0, 3.0]))


def test_regularizer_value() -> None:
    u = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 0.0]])
    y = torch.tensor([0, 1, 2])
    proto = torch.tensor([[0.0, 0.0], [1.0, 1.0], [7.0, 7.0]])
    count = torch.tensor([2.0, 1.0, 0.0])  # class 2 has no global prototype: contributes zero
    want = ((1 + 4) + (4 + 1) + 0) / (3 * 2)
    assert proto_regularizer(u, y, proto, count).item() == pytest.approx(want)


def manual_step(w: dict, proto: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict:
    w = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    u = x @ w["features.0.weight"].T + w["features.0.bias"]
    logits = u @ w["head.weight"].T + w["head.bias"]
    ce = -(logits - logits.logsumexp(1, keepdim=True))[torch.arange(len(y)), y].mean()
    loss = ce + LAM * ((u - proto[y]) ** 2).mean()
    grads = torch.autograd.grad(loss, list(w.values()))
    return {k: (v - LR * g).detach() for (k, v), g in zip(w.items(), grads, strict=True)}


def test_local_step_prototypes_and_what_is_communicated() -> None:
    alg = make()
    server = alg.init_server()
    server = {"proto": torch.tensor([[0.5, -1.0], [2.0, 1.0]]), "proto_count": torch.tensor([3.0, 1.0])}
    msg = alg.broadcast(server, 2, 0)
    assert set(msg.arrays) == {"proto", "proto_count"}
    out, state = alg.fit(msg, {}, ctx())
    x, y = ctx().data.train.tensors
    want = manual_step(alg._init_state, server["proto"], x, y)
    for k, v in want.items():
        assert torch.allclose(state["local"][k], v, atol=1e-6), k
    assert set(out.arrays) == {"proto", "proto_count"}  # no network weights leave the client
    u = x @ want["features.0.weight"].T + want["features.0.bias"]
    for c in (0, 1):
        assert torch.allclose(out.arrays["proto"][c], u[y == c].mean(0), atol=1e-6)
    assert torch.equal(out.arrays["proto_count"], torch.tensor([2.0, 2.0]))


def test_round_one_is_plain_ce_and_local_model_persists() -> None:
    alg, alg_ce = make(lam=100.0), make(lam=0.0)
    server = alg.init_server()  # no global prototype yet: the regulariser is off whatever lam is
    _, state1 = alg.fit(alg.broadcast(server, 1, 0), {}, ctx())
    _, state_ce = alg_ce.fit(alg_ce.broadcast(server, 1, 0), {}, ctx())
    assert all(torch.allclose(state1["local"][k], state_ce["local"][k]) for k in state_ce["local"])
    _, state2 = alg.fit(alg.broadcast(server, 2, 0), state1, ctx())  # continues from its own model
    _, restart = alg.fit(alg.broadcast(server, 2, 0), {}, ctx())
    assert torch.allclose(restart["local"]["head.weight"], state1["local"]["head.weight"])
    assert not torch.allclose(state2["local"]["head.weight"], state1["local"]["head.weight"])


def test_prototype_inference_is_nearest_global_prototype() -> None:
    alg = make(inference="prototype")
    x, y = ctx().data.test.tensors
    w = alg._init_state
    u = x @ w["features.0.weight"].T + w["features.0.bias"]
    proto = torch.stack([u[y == 0].mean(0), u[y == 1].mean(0)])
    server = {"proto": proto, "proto_count": torch.tensor([2.0, 2.0])}
    metrics = alg.evaluate(alg.broadcast(server, 1, 0), {}, ctx(), ctx().data.test)
    pred = torch.cdist(u, proto).argmin(1)
    assert metrics["accuracy"] == pytest.approx((pred == y).float().mean().item())
    head = make(inference="head").evaluate(alg.broadcast(server, 1, 0), {}, ctx(), ctx().data.test)
    logits = u @ w["head.weight"].T + w["head.bias"]
    assert head["accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item())


def test_params_are_validated() -> None:
    for bad in ({"lam": -1.0}, {"inference": "knn"}):
        with pytest.raises(ConfigError):
            FedProto.Params(**bad).validate()

"""FedProto: count-weighted prototype aggregation, the regulariser and one local step by hand."""

from __future__ import annotations

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms.fedproto import FedProto, ProtoServerState, PrototypeClassifier, proto_regularizer
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, ClientState, RoundInfo
from fedhet.core.messages import Message, Reply
from fedhet.engine.local import deployed_model, evaluate_client, fit_client
from fedhet.errors import ConfigError, FedhetError

CPU = torch.device("cpu")
LR, LAM = 0.1, 0.5


def make(**params: object) -> FedProto:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    train = TrainConfig(lr=LR, momentum=0.0, batch_size=4, local_steps=1)
    return FedProto(FedProto.Params(**{"lam": LAM, **params}), lambda: template, train, ServerConfig(), 2, CPU)


def ctx(rnd: int = 1) -> ClientContext:
    info = RoundInfo(round=rnd, rounds=2, num_clients=2, seed=0)
    return ClientContext(client_id=0, info=info, data=tiny_client(n=4, in_dim=2), device=CPU, num_classes=2)


def info(rnd: int) -> RoundInfo:
    return ctx(rnd).info


def server_with(proto: torch.Tensor, count: torch.Tensor) -> ProtoServerState:
    return ProtoServerState(proto=proto, proto_count=count)


def fit(alg: FedProto, server: ProtoServerState, state: ClientState, rnd: int) -> tuple[Message, ClientState]:
    return fit_client(alg, alg.broadcast(server, info(rnd), 0), state, ctx(rnd))


def proto_reply(cid: int, proto: list, count: list) -> Reply:
    return Reply(cid, Message(arrays={"proto": torch.tensor(proto), "proto_count": torch.tensor(count)}), 1)


def test_aggregation_weights_prototypes_by_class_counts() -> None:
    alg = make()
    server = alg.init_server()
    assert server.proto.shape == (2, 2) and not server.proto_count.any() and server.model == {}
    replies = [proto_reply(0, [[1.0, 0.0], [9.0, 9.0]], [2.0, 0.0]),  # lacks class 1: its row is skipped
               proto_reply(1, [[4.0, 0.0], [0.0, 4.0]], [1.0, 3.0])]
    new = alg.aggregate(server, replies, info(1))
    assert torch.allclose(new.proto, torch.tensor([[2.0, 0.0], [0.0, 4.0]]))  # (2*1 + 1*4)/3 = 2
    assert torch.equal(new.proto_count, torch.tensor([3.0, 3.0]))
    assert not server.proto_count.any()  # the input state is not modified
    # a class no replying client holds keeps its previous prototype
    newer = alg.aggregate(new, [proto_reply(0, [[5.0, 5.0], [0.0, 0.0]], [1.0, 0.0])], info(2))
    assert torch.allclose(newer.proto, torch.tensor([[5.0, 5.0], [0.0, 4.0]]))
    assert torch.equal(newer.proto_count, torch.tensor([1.0, 3.0]))


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
    server = server_with(torch.tensor([[0.5, -1.0], [2.0, 1.0]]), torch.tensor([3.0, 1.0]))
    msg = alg.broadcast(server, info(2), 0)
    assert set(msg.arrays) == {"proto", "proto_count"}
    out, state = fit_client(alg, msg, alg.init_client(0), ctx(2))
    x, y = ctx().data.train.tensors
    want = manual_step(alg.parts.init_state, server.proto, x, y)
    for k, v in want.items():
        assert torch.allclose(state.local[k], v, atol=1e-6), k
    assert set(out.arrays) == {"proto", "proto_count"}  # no network weights leave the client
    u = x @ want["features.0.weight"].T + want["features.0.bias"]
    for c in (0, 1):
        assert torch.allclose(out.arrays["proto"][c], u[y == c].mean(0), atol=1e-6)
    assert torch.equal(out.arrays["proto_count"], torch.tensor([2.0, 2.0]))


def test_round_one_is_plain_ce_and_local_model_persists() -> None:
    alg, alg_ce = make(lam=100.0), make(lam=0.0)
    server = alg.init_server()  # no global prototype yet: the regulariser is off whatever lam is
    _, state1 = fit(alg, server, alg.init_client(0), 1)
    _, state_ce = fit(alg_ce, server, alg_ce.init_client(0), 1)
    assert all(torch.allclose(state1.local[k], state_ce.local[k]) for k in state_ce.local)
    _, state2 = fit(alg, server, state1, 2)  # continues from its own model
    _, restart = fit(alg, server, alg.init_client(0), 2)
    assert torch.allclose(restart.local["head.weight"], state1.local["head.weight"])
    assert not torch.allclose(state2.local["head.weight"], state1.local["head.weight"])


def test_prototype_inference_is_nearest_global_prototype() -> None:
    alg = make(inference="prototype")
    x, y = ctx().data.test.tensors
    w = alg.parts.init_state
    u = x @ w["features.0.weight"].T + w["features.0.bias"]
    proto = torch.stack([u[y == 0].mean(0), u[y == 1].mean(0)])
    msg = alg.broadcast(server_with(proto, torch.tensor([2.0, 2.0])), info(1), 0)
    metrics = evaluate_client(alg, msg, alg.init_client(0), ctx(), ctx().data.test)
    pred = torch.cdist(u, proto).argmin(1)
    assert metrics["accuracy"] == pytest.approx((pred == y).float().mean().item())
    model, batch_size = deployed_model(alg, msg, alg.init_client(0), ctx())
    assert isinstance(model, PrototypeClassifier) and batch_size == 256  # FedProto's evaluation batch size
    head_alg = make(inference="head")
    head = evaluate_client(head_alg, msg, head_alg.init_client(0), ctx(), ctx().data.test)
    logits = u @ w["head.weight"].T + w["head.bias"]
    assert head["accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert head["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-6)
    # no global prototype yet: prototype inference falls back to the head
    empty = alg.broadcast(alg.init_server(), info(1), 0)
    assert not isinstance(deployed_model(alg, empty, alg.init_client(0), ctx())[0], PrototypeClassifier)


def test_a_message_without_prototypes_is_refused() -> None:
    alg = make()
    with pytest.raises(FedhetError, match="no global prototypes"):
        fit_client(alg, Message(arrays={}), alg.init_client(0), ctx())


def test_params_are_validated() -> None:
    for bad in ({"lam": -1.0}, {"inference": "knn"}):
        with pytest.raises(ConfigError):
            FedProto.Params(**bad).validate()

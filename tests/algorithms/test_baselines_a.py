"""FedProx, pFedAvg, FedBABU, FedRep and Ditto: update rules against hand computations, what is communicated,
what stays on the client, and (pFedAvg, FedBABU) fine-tuning at evaluation time.

The hand computations use a closed-form gradient of the mean cross-entropy of the tiny linear-linear model
(logits = (x W1^T + b1) W2^T + b2), written out below, not the library's training loop. Every test uses a
full batch (batch_size = n), so the data order drawn by the loader does not matter.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model
from torch import nn

from fedhet.algorithms import ALGORITHMS, Algorithm
from fedhet.algorithms.ditto import Ditto, DittoState, DittoWork
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, ClientState, RoundInfo
from fedhet.core.messages import Message
from fedhet.engine.evaluation import evaluate
from fedhet.engine.local import deployed_model, evaluate_client, fit_client
from fedhet.errors import ConfigError
from fedhet.losses.classification import cross_entropy

CPU = torch.device("cpu")
N = 4
W0 = {  # hand-set initial weights of tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    "features.0.weight": torch.tensor([[0.5, -0.2], [0.1, 0.3]]),
    "features.0.bias": torch.tensor([0.0, 0.1]),
    "head.weight": torch.tensor([[0.2, -0.4], [0.3, 0.1]]),
    "head.bias": torch.tensor([0.05, -0.05]),
}
BODY = {"features.0.weight", "features.0.bias"}
HEAD = {"head.weight", "head.bias"}
W = dict[str, torch.Tensor]
AnyAlg = Algorithm[Any, Any, Any, Any]


def model_fn() -> Any:
    model = tiny_model(in_dim=2, feat_dim=2, num_classes=2)
    model.load_state_dict(W0)
    return model


def make(name: str, lr: float = 0.1, steps: int | None = 1, momentum: float = 0.0, weight_decay: float = 0.0,
         **params: Any) -> AnyAlg:
    cls = ALGORITHMS.get(name)
    train = TrainConfig(lr=lr, momentum=momentum, weight_decay=weight_decay, batch_size=N, local_steps=steps)
    return cls(cls.Params(**params), model_fn, train, ServerConfig(), 2, CPU)


def info(rnd: int = 1) -> RoundInfo:
    return RoundInfo(round=rnd, rounds=10, num_clients=1, seed=0)


def ctx(rnd: int = 1) -> ClientContext:
    return ClientContext(client_id=0, info=info(rnd), data=tiny_client(n=N, in_dim=2), device=CPU, num_classes=2)


def fit(alg: AnyAlg, msg: Message, state: ClientState | None = None, rnd: int = 1) -> tuple[Message, Any]:
    """The engine's fit of client 0 (a fresh client state when `state` is None)."""
    return fit_client(alg, msg, alg.init_client(0) if state is None else state, ctx(rnd))


def deploy(alg: AnyAlg, msg: Message, state: ClientState | None = None, rnd: int = 1) -> nn.Module:
    """The engine's deployed model of client 0 (after the deployment's passes)."""
    return deployed_model(alg, msg, alg.init_client(0) if state is None else state, ctx(rnd))[0]


def xy() -> tuple[torch.Tensor, torch.Tensor]:
    return ctx().data.train.tensors


def grads(w: W) -> W:
    """Closed-form gradients of mean CE on the client's data at weights w."""
    x, y = xy()
    u = x @ w["features.0.weight"].T + w["features.0.bias"]
    z = u @ w["head.weight"].T + w["head.bias"]
    d = (torch.softmax(z, dim=1) - torch.nn.functional.one_hot(y, 2).float()) / len(y)  # dL/dz
    du = d @ w["head.weight"]
    return {"head.weight": d.T @ u, "head.bias": d.sum(0), "features.0.weight": du.T @ x,
            "features.0.bias": du.sum(0)}


def sgd(w: W, g: W, lr: float = 0.1, keys: set[str] | None = None) -> W:
    """w - lr * g on `keys` (default all); other entries unchanged."""
    return {k: v - lr * g[k] if keys is None or k in keys else v.clone() for k, v in w.items()}


def add(a: W, b: W, scale: float = 1.0) -> W:
    return {k: a[k] + scale * b[k] for k in a}


def close(got: W, want: W, keys: set[str] | None = None) -> None:
    for k in keys if keys is not None else want:
        assert torch.allclose(got[k], want[k], atol=1e-6), (k, got[k], want[k])


def msg_of(w: W) -> Message:
    return Message(arrays={k: v.clone() for k, v in w.items()})


def same(a: Any, b: Any) -> bool:
    """Equal values, tensors bit for bit, through dataclasses (client states) and dicts."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return torch.equal(a, b) if torch.is_tensor(a) else a == b


# ---------------------------------------------------------------------------------------------------- FedProx
def test_fedprox_two_steps_by_hand() -> None:
    mu, lr = 0.5, 0.1
    alg = make("fedprox", lr=lr, steps=2, mu=mu)
    out, _ = fit(alg, alg.broadcast(alg.init_server(), info(), 0))
    w1 = sgd(W0, grads(W0), lr)  # at the anchor the proximal gradient mu (w - w0) is zero
    w2 = sgd(w1, add(grads(w1), add(w1, W0, -1.0), mu), lr)  # g + mu (w1 - w0)
    assert set(out.arrays) == BODY | HEAD
    close(out.arrays, w2)
    plain = sgd(w1, grads(w1), lr)
    assert not torch.allclose(out.arrays["head.weight"], plain["head.weight"], atol=1e-6)


def test_fedprox_mu_zero_is_fedavg_and_bad_mu_rejected() -> None:
    out, _ = fit(make("fedprox", steps=3, mu=0.0), Message(arrays=dict(W0)))
    ref, _ = fit(make("fedavg", steps=3), Message(arrays=dict(W0)))
    close(out.arrays, ref.arrays)
    with pytest.raises(ConfigError):
        ALGORITHMS.get("fedprox").Params(mu=-0.1).validate()


# ---------------------------------------------------------------------------------------------------- pFedAvg
def test_pfedavg_trains_and_communicates_as_fedavg() -> None:
    alg = make("pfedavg")
    assert alg.personalized
    out, state = fit(alg, msg_of(W0))
    ref, ref_state = fit(make("fedavg"), msg_of(W0))
    assert set(out.arrays) == set(ref.arrays) == BODY | HEAD
    close(out.arrays, sgd(W0, grads(W0)))
    assert same(state, ref_state)


@pytest.mark.parametrize("part", ["all", "head"])
def test_pfedavg_evaluate_finetunes_a_copy_by_hand(part: str) -> None:
    alg = make("pfedavg", lr=0.1, finetune_lr=0.3, finetune_part=part)
    _, state = fit(alg, msg_of(W0))
    glob = {k: v + 0.05 for k, v in W0.items()}  # the next round's global model
    msg, before = msg_of(glob), copy.deepcopy(state)
    deployed = {k: v.detach().clone() for k, v in deploy(alg, msg, state, 2).state_dict().items()}
    want = sgd(glob, grads(glob), 0.3, keys=None if part == "all" else HEAD)  # one full-batch epoch
    close(deployed, want)
    assert not torch.allclose(deployed["head.weight"], glob["head.weight"])
    metrics = evaluate_client(alg, msg, state, ctx(2), ctx().data.test)
    hand = model_fn()
    hand.load_state_dict(want)
    assert metrics["loss"] == pytest.approx(evaluate(hand, ctx().data.test, CPU)["loss"], abs=1e-6)
    assert same(state, before)  # the client state is untouched
    assert same(msg.arrays, glob)  # and so is the received message
    assert all(p.requires_grad for p in alg.parts.new().parameters())


def test_pfedavg_zero_finetune_epochs_and_validation() -> None:
    alg = make("pfedavg", finetune_epochs=0)
    close(deploy(alg, msg_of(W0)).state_dict(), W0)
    Params = ALGORITHMS.get("pfedavg").Params
    for bad in ({"finetune_epochs": -1}, {"finetune_part": "body"}, {"finetune_lr": 0.0}):
        with pytest.raises(ConfigError):
            Params(**bad).validate()


# ---------------------------------------------------------------------------------------------------- FedBABU
def test_fedbabu_trains_the_body_only_by_hand() -> None:
    alg = make("fedbabu", lr=0.1)
    server = alg.init_server()
    assert set(server.model) == BODY
    out, state = fit(alg, alg.broadcast(server, info(), 0))
    assert set(out.arrays) == BODY  # the head is never sent
    close(out.arrays, sgd(W0, grads(W0), 0.1, keys=BODY), keys=BODY)
    assert set(state.local) == HEAD  # kept as local keys: the initial head, unchanged
    close(state.local, W0, keys=HEAD)


def test_fedbabu_head_never_changes_during_fit() -> None:
    alg = make("fedbabu", lr=0.5, steps=3, momentum=0.9, weight_decay=0.1)
    msg, state = msg_of({k: W0[k] for k in BODY}), alg.init_client(0)
    for rnd in (1, 2):
        out, state = fit(alg, msg, state, rnd)
        model = alg.client_model(msg, state)
        assert torch.equal(model.head.weight, W0["head.weight"]) and torch.equal(model.head.bias, W0["head.bias"])
        assert not torch.allclose(out.arrays["features.0.weight"], msg.arrays["features.0.weight"])
        msg = out


@pytest.mark.parametrize("part", ["all", "head"])
def test_fedbabu_evaluate_finetunes_from_the_init_head(part: str) -> None:
    alg = make("fedbabu", finetune_part=part)
    _, state = fit(alg, msg_of({k: W0[k] for k in BODY}))
    body = {k: W0[k] - 0.1 for k in BODY}  # the next round's global body
    before = copy.deepcopy(state)
    deployed = deploy(alg, msg_of(body), state, 2).state_dict()
    start = {**body, **{k: W0[k] for k in HEAD}}  # global body + initial head
    close(deployed, sgd(start, grads(start), 0.1, keys=None if part == "all" else HEAD))
    assert not torch.allclose(deployed["head.weight"], W0["head.weight"])
    assert same(state, before)
    out, _ = fit(alg, msg_of(body), state, 2)  # evaluation left the next fit's head at its init
    close(out.arrays, sgd(start, grads(start), 0.1, keys=BODY), keys=BODY)


# ---------------------------------------------------------------------------------------------------- FedRep
def test_fedrep_head_then_body_by_hand() -> None:
    alg = make("fedrep", lr=0.1, head_epochs=1)  # one full-batch epoch = one head step, then one body step
    out, state = fit(alg, alg.broadcast(alg.init_server(), info(), 0))
    w_head = sgd(W0, grads(W0), 0.1, keys=HEAD)
    w_body = sgd(w_head, grads(w_head), 0.1, keys=BODY)  # body gradient at the *updated* head
    assert set(out.arrays) == BODY
    close(out.arrays, w_body, keys=BODY)
    assert set(state.local) == HEAD
    close(state.local, w_head, keys=HEAD)


def test_fedrep_personal_head_persists_and_is_never_sent() -> None:
    alg = make("fedrep", lr=0.1, head_epochs=2)
    _, state = fit(alg, msg_of({k: W0[k] for k in BODY}))
    head1 = {k: v.clone() for k, v in state.local.items()}
    assert not torch.allclose(head1["head.weight"], W0["head.weight"])
    alg.params.head_epochs = 0  # second round: body only, so the head must be exactly the stored one
    body = {k: W0[k] + 0.2 for k in BODY}
    out, state2 = fit(alg, msg_of(body), state, 2)
    assert not HEAD & set(out.arrays)
    close(state2.local, head1)
    start = {**body, **head1}
    close(out.arrays, sgd(start, grads(start), 0.1, keys=BODY), keys=BODY)
    close(deploy(alg, out, state2, 2).state_dict(), head1, keys=HEAD)
    with pytest.raises(ConfigError):
        ALGORITHMS.get("fedrep").Params(head_epochs=-1).validate()


# ---------------------------------------------------------------------------------------------------- Ditto
def test_ditto_global_then_personal_two_rounds_by_hand() -> None:
    lam, lr = 0.5, 0.1
    alg = make("ditto", lr=lr, lam=lam)
    assert alg.personalized
    assert same(deploy(alg, msg_of(W0)).state_dict(), W0)  # no personal model yet
    out1, state = fit(alg, msg_of(W0))
    w1 = sgd(W0, grads(W0), lr)
    close(out1.arrays, w1)  # w: exactly FedAvg
    close(state.personal, w1)  # v starts at w^1, where the proximal term has zero gradient
    glob = {k: v * 0.5 for k, v in W0.items()}  # round 2's global model w^2
    out2, state2 = fit(alg, msg_of(glob), state, 2)
    v2 = sgd(w1, add(grads(w1), add(w1, glob, -1.0), lam), lr)  # v - lr (g(v) + lam (v - w^2))
    close(out2.arrays, sgd(glob, grads(glob), lr))  # what is sent is w, never v
    assert not torch.allclose(out2.arrays["head.weight"], v2["head.weight"], atol=1e-4)
    close(state2.personal, v2)
    assert all(t.device.type == "cpu" for t in state2.personal.values())
    close(deploy(alg, msg_of(glob), state2, 2).state_dict(), v2)  # deployed model = v


def test_ditto_tandem_and_personal_epochs_by_hand() -> None:
    lam, lr = 2.0, 0.1
    glob = {k: v * 0.5 for k, v in W0.items()}
    for schedule, steps, pe in (("tandem", 2, None), ("global_then_personal", 1, 2)):
        alg = make("ditto", lr=lr, steps=steps, lam=lam, schedule=schedule, personal_epochs=pe)
        out, state = fit(alg, msg_of(glob), DittoState(personal=dict(W0)))
        w = glob
        for _ in range(steps):
            w = sgd(w, grads(w), lr)
        v = dict(W0)
        for _ in range(2):  # v takes two steps in both configurations
            v = sgd(v, add(grads(v), add(v, glob, -1.0), lam), lr)
        close(out.arrays, w)
        close(state.personal, v)


def test_ditto_personal_loss_is_the_extension_point() -> None:
    class CEOnly(Ditto):
        def personal_loss(self, work: DittoWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            assert not any(p.requires_grad for p in work.reference.parameters()) and not work.reference.training
            return cross_entropy(work.personal, x, y)

    train = TrainConfig(lr=0.1, momentum=0.0, batch_size=N, local_steps=1)
    alg = CEOnly(CEOnly.Params(lam=100.0), model_fn, train, ServerConfig(), 2, CPU)
    glob = {k: v * 0.5 for k, v in W0.items()}
    _, state = fit(alg, msg_of(glob), DittoState(personal=dict(W0)))
    close(state.personal, sgd(W0, grads(W0), 0.1))  # lam ignored: the override replaced the objective


def test_ditto_validation() -> None:
    Params = ALGORITHMS.get("ditto").Params
    for bad in ({"lam": -1.0}, {"schedule": "personal_first"}, {"personal_epochs": 0},
                {"schedule": "tandem", "personal_epochs": 2}):
        with pytest.raises(ConfigError):
            Params(**bad).validate()


# ---------------------------------------------------------------------------------------------------- FedPer
def test_fedper_trains_jointly_and_keeps_the_head() -> None:
    alg = make("fedper", lr=0.1)
    out, state = fit(alg, alg.broadcast(alg.init_server(), info(), 0))
    joint = sgd(W0, grads(W0), 0.1)  # one step on base and head together (not FedRep's phases)
    assert set(out.arrays) == BODY
    close(out.arrays, joint, keys=BODY)
    close(state.local, joint, keys=HEAD)
    body = {k: W0[k] + 0.2 for k in BODY}
    out2, state2 = fit(alg, msg_of(body), state, 2)  # round 2 starts from the kept head, not the init head
    start = {**body, **{k: joint[k] for k in HEAD}}
    close(out2.arrays, sgd(start, grads(start), 0.1), keys=BODY)
    with pytest.raises(ConfigError, match="no submodule 'classifier'"):
        make("fedper", personal=["classifier"]).init_server()
    with pytest.raises(ConfigError):
        ALGORITHMS.get("fedper").Params(personal=[]).validate()

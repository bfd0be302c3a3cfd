"""FedD3 (fedhet.algorithms.fedd3): KIP's kernel ridge loss by hand, the distillation descends it, the upload is
`per_class` instances of each local class and nothing else, and the server trains on exactly their union. Broken
variants checked: a KIP loss without the ridge solve, a KIP pass that does not step, a server that drops an upload."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fedhet_testing import first_round_reply

import fedhet.algorithms.fedd3 as fedd3_module
from fedhet.algorithms.fedd3 import kip_loss, rbf
from fedhet.config import load_config
from fedhet.core.messages import Reply
from fedhet.engine.experiment import Experiment, build_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.batch_size=16",
        "train.lr=0.05", "data.max_test_per_client=20", "run.quiet=true", "run.device=cpu", "run.num_threads=1",
        "method=fedd3", "data.domains=[clean, inverted]", "rounds=1", "data.max_train_per_client=40",
        "method_args.server_epochs=2"]


def experiment(*overrides: str) -> Experiment:
    return build_experiment(load_config(None, [*BASE, *overrides]))



def test_kip_loss_by_hand() -> None:
    s, t = torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 4.0], [0.0, 0.0]])  # ‖t0 − s‖² = 25
    y_s, y_t = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    k = math.exp(-25 / (2 * 12.5))  # h² = 12.5: e^-1
    assert torch.allclose(rbf(t, s, 12.5), torch.tensor([[k], [1.0]]))
    ridge = 0.5  # K_ss = 1, λ = 0.5: prediction k_ts / 1.5
    expected = ((k / 1.5) ** 2 + 1) + ((1 / 1.5 - 1) ** 2)
    assert math.isclose(float(kip_loss(s, y_s, t, y_t, 12.5, ridge)), expected / 2, rel_tol=1e-6)


def test_the_upload_is_the_distilled_instances_and_kip_descends() -> None:
    exp = experiment("method_args.per_class=2", "method_args.kip_epochs=5", "method_args.kip_lr=0.05")
    reply = first_round_reply(exp)
    start = first_round_reply(experiment("method_args.per_class=2", "method_args.kip_epochs=0"))  # same initial draw
    assert set(reply.arrays) == {"images", "labels"} and set(reply.scalars) == {"steps", "dim0", "dim1", "dim2"}
    train = exp.data.clients[0].train_eval
    x = torch.stack([x for x, _ in train]).flatten(1)
    y = torch.tensor([int(y) for _, y in train])
    classes = sorted(set(y.tolist()))
    assert reply.arrays["labels"].tolist() == [c for c in classes for _ in range(2)]
    assert torch.equal(start.arrays["labels"], reply.arrays["labels"]) and reply.scalars["steps"] > 0
    # the start is real images; the distilled instances are not, and fit the client's data better (KIP's loss)
    assert all(any(torch.equal(row, r) for r in x) for row in start.arrays["images"])
    h2 = float(torch.pdist(x).square().mean()) / 2
    y_t = torch.nn.functional.one_hot(y, exp.algorithm.num_classes).float()

    def loss(r: Any) -> float:
        y_s = torch.nn.functional.one_hot(r.arrays["labels"], exp.algorithm.num_classes).float()
        return float(kip_loss(r.arrays["images"], y_s, x, y_t, h2, exp.algorithm.params.ridge))

    assert loss(reply) < loss(start) - 1e-3


def test_the_server_trains_on_exactly_the_union(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = experiment()
    alg = exp.algorithm
    replies = [Reply(c, first_round_reply(exp, c), 1) for c in (0, 1)]
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = fedd3_module.train_on_tensors
    monkeypatch.setattr(fedd3_module, "train_on_tensors", lambda m, x, y, *a, **k: seen.append((x, y)) or real(
        m, x, y, *a, **k))
    server = alg.aggregate(alg.init_server(), replies, exp.round_info(1))
    (x, y), = seen
    assert torch.equal(y, torch.cat([r.message.arrays["labels"] for r in replies])) and server.distilled == len(y)
    assert torch.equal(x.flatten(1), torch.cat([r.message.arrays["images"] for r in replies]))
    assert x.shape[1:] == exp.data.clients[0].train[0][0].shape
    assert alg.broadcast(server, exp.round_info(1), 0).arrays  # afterwards every client gets the trained model

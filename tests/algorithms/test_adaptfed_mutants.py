"""Tests added after the mutation pass (docs/results/mutation.md): AdaptFED's gradient clipping and its refusal of
a round in which a client replies twice."""

from __future__ import annotations

import pytest

pytest.importorskip("timm")

import torch  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.core.messages import Message, Reply  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.models.hypernet_update import _clipped  # noqa: E402

BASE = ["data.dataset=offline_digits", "model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}",
        "train.local_steps=1", "run.num_threads=1", "run.quiet=true", "method=adaptfed", "data.partition=iid",
        "data.num_clients=4"]


def test_clipping_scales_the_joint_norm_down_to_the_limit() -> None:
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0, 4.0]])]  # joint norm 5
    clipped = _clipped(grads, 1.0)
    norm = torch.sqrt(sum((g ** 2).sum() for g in clipped))
    assert float(norm) == pytest.approx(1.0, abs=1e-5) and torch.allclose(clipped[0], torch.tensor([0.6, 0.0]),
                                                                           atol=1e-5)
    assert torch.equal(_clipped(grads, 10.0)[1], grads[1])  # under the limit: unchanged


def test_a_client_replying_twice_in_a_round_is_refused() -> None:
    exp = build_experiment(load_config(None, BASE))
    alg, info = exp.algorithm, exp.round_info(1)
    server = alg.init_server()
    sent = alg.broadcast(server, info, 1)
    reply = Reply(1, Message(arrays=dict(sent.arrays)), 10)
    with pytest.raises(Exception, match="each participating client once"):
        alg.aggregate(server, [reply, Reply(1, Message(arrays=dict(sent.arrays)), 10)], info)

"""AdaptFED's hypernetwork step is routed by client id, not by a reply's position: with non-contiguous client ids
replying in shuffled order, each z_i moves by -lr_R w_i (dP_i/dz_i)^T Delta_i with client i's own Delta_i (computed
here directly with autograd), and the rows of absent clients do not move. lr_R is the lr scaled to the run's
rounds (lr sqrt(1500 / R)); a FocalNet-T-sized P makes the heads warn with their size."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("timm")

from fedhet.algorithms.adaptfed import warn_heads  # noqa: E402
from fedhet.algorithms.adaptfed_params import AdaptFEDParams  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.core.messages import Message, Reply  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.models.hypernet_update import HyperUpdateConfig, scaled_lr  # noqa: E402

BASE = ["data.dataset=offline_digits", "model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}",
        "train.local_steps=2", "train.batch_size=16", "run.num_threads=1", "run.quiet=true", "method=adaptfed",
        "data.partition=iid", "data.num_clients=8", "rounds=60", "method_args.update.momentum=0",
        "method_args.update.weight_decay=0"]


def test_lr_scales_with_the_square_root_of_the_schedule() -> None:
    assert scaled_lr(0.01, 1500, 60) == pytest.approx(0.05)  # 0.01 sqrt(25)
    assert scaled_lr(0.01, 1500, 1500) == pytest.approx(0.01)  # the paper's / FedTP's schedule: unchanged
    assert HyperUpdateConfig(schedule_rounds=None).lr_for(60) == 0.01
    with pytest.raises(Exception, match="schedule_rounds"):
        HyperUpdateConfig(schedule_rounds=0)


def test_each_embedding_steps_on_its_own_clients_delta_whatever_the_reply_order() -> None:
    exp = build_experiment(load_config(None, BASE))
    alg, info = exp.algorithm, exp.round_info(1)
    server, p = alg.init_server(), alg.partition.p
    ids, sizes, shifts = [5, 2, 7], {5: 30, 2: 10, 7: 20}, {5: 1.0, 2: -2.0, 7: 0.5}
    sent = {cid: alg.broadcast(server, info, cid) for cid in ids}
    replies = [Reply(cid, Message(arrays={k: v + shifts[cid] if k in p else v for k, v in sent[cid].arrays.items()}),
                     sizes[cid]) for cid in (7, 5, 2)]  # shuffled: positions 0, 1, 2 are clients 7, 5, 2
    hnet = alg.hypernet(server)
    z = hnet.embeddings.weight
    lr = 0.01 * math.sqrt(1500 / 60)  # the default lr at this run's 60 rounds
    want = z.detach().clone()
    for cid in ids:  # Delta_i = P_sent - P_returned = -shift (pFedHN's sign), weight m_i / sum m
        out = hnet(cid)
        (grad,) = torch.autograd.grad([out[k] for k in p], [z], grad_outputs=[torch.full_like(out[k], -shifts[cid])
                                                                               for k in p])
        want[cid] -= lr * sizes[cid] / 60 * grad[cid]
    got = alg.hypernet(alg.aggregate(server, replies, info)).embeddings.weight.detach()
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().amax(dim=1)
    assert torch.equal(got[[0, 1, 3, 4, 6]], z.detach()[[0, 1, 3, 4, 6]])  # absent clients' rows never move


def test_a_focalnet_t_sized_generator_warns_with_its_size(caplog: pytest.LogCaptureFixture) -> None:
    focalnet_t = SimpleNamespace(shapes=lambda: {"f.weight": (6_500_000,)})  # FocalNet-T's f and h: ~6.5M values
    with caplog.at_level(logging.WARNING, logger="fedhet.algorithms.adaptfed"):
        warn_heads(focalnet_t, AdaptFEDParams())  # type: ignore[arg-type]
    assert "656,500,000" in caplog.text and "rank" in caplog.text
    caplog.clear()
    warn_heads(focalnet_t, AdaptFEDParams(rank=8))  # type: ignore[arg-type]
    assert not caplog.text

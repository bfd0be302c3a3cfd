"""DENSE (fedhet.algorithms.dense): the distillation KL, the adversarial term and the BN-statistics term by hand,
the generator's loss is their weighted sum, the teacher is the ensemble of the uploaded models (mean logits, not
the averaged model), the upload is the locally trained model, and the server distils on a pool that grows by one
generated batch per epoch. Broken variants checked (each made once, each failed here): the KL's arguments swapped,
the BN term dropped from the generator loss, the client models averaged instead of ensembled, the pool replaced
by the last batch, the client's model not trained."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from fedhet_testing import first_round_reply
from torch import nn

from fedhet.algorithms.dense import Dense
from fedhet.algorithms.dense_parts import BNStatistics, adversarial_loss, kd_loss
from fedhet.config import load_config
from fedhet.core.messages import Reply
from fedhet.engine.experiment import Experiment, build_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.batch_size=16",
        "train.lr=0.05", "data.max_test_per_client=20", "run.quiet=true", "run.device=cpu", "run.num_threads=1",
        "method=dense", "data.domains=[clean, inverted]", "rounds=1", "data.max_train_per_client=40",
        "method_args.local_epochs=2", "method_args.server_epochs=2", "method_args.g_steps=2",
        "method_args.synthesis_batch_size=8", "method_args.kd_batch_size=8", "method_args.nz=8", "method_args.ngf=4"]


def experiment(*overrides: str) -> Experiment:
    return build_experiment(load_config(None, [*BASE, *overrides]))



@pytest.fixture(scope="module")
def fitted() -> tuple[Experiment, list[Reply]]:
    """The default tiny experiment and both clients' uploads (shared: the fits are the slow part)."""
    exp = experiment()
    return exp, [Reply(c, first_round_reply(exp, c), 1) for c in (0, 1)]


def test_kd_loss_is_kl_teacher_to_student_times_t_squared() -> None:
    s, t = torch.tensor([[0.0, 0.0]]), torch.tensor([[2 * math.log(3.0), 0.0]])  # at T = 2: p_t = (3/4, 1/4)
    expected = 4 * (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5))  # KL(p_t ‖ p_s) · T²
    assert math.isclose(float(kd_loss(s, t, 2.0)), expected, rel_tol=1e-6)
    assert not math.isclose(float(kd_loss(t, s, 2.0)), expected, rel_tol=1e-2)  # KL is not symmetric


def test_adversarial_term_counts_only_disagreements() -> None:
    s = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    t = torch.tensor([[2.0, 0.0], [0.0, math.log(3.0)]])  # sample 0 agrees (masked), sample 1 does not
    kl = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert math.isclose(float(adversarial_loss(s, t)), -kl / 2, rel_tol=1e-6)


def test_bn_statistics_by_hand() -> None:
    bn = nn.BatchNorm2d(2)
    bn.running_mean.copy_(torch.tensor([1.0, 0.0]))
    bn.running_var.copy_(torch.tensor([1.0, 4.0]))
    x = torch.tensor([[[[0.0, 2.0]], [[1.0, 3.0]]]])  # channel means (1, 2), variances (1, 1)
    stats = BNStatistics(nn.Sequential(bn).eval())
    bn(x)
    assert math.isclose(float(stats.loss()), math.hypot(0.0, 2.0) + math.hypot(0.0, 3.0), rel_tol=1e-6)
    stats.remove()


def test_the_generator_loss_is_the_weighted_sum_with_the_bn_term(fitted: tuple[Experiment, list[Reply]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    exp, replies = fitted
    alg: Dense = exp.algorithm
    for name, weight in (("oh", 1.5), ("bn", 0.5), ("adv", 2.0)):
        monkeypatch.setattr(alg.params, name, weight)
    teacher, student = alg.teacher(replies), alg.parts.new().train()
    x = torch.randn(6, 3, 28, 28)
    targets = torch.tensor([0, 1, 2, 3, 4, 5])
    stats = BNStatistics(teacher)
    terms = alg.generator_step(teacher, student, x, targets, stats)
    stats.remove()
    manual = BNStatistics(teacher)
    t_out = teacher(x)
    r_bn = manual.loss()
    manual.remove()
    assert float(r_bn) > 0 and torch.allclose(terms["bn"], r_bn)
    assert torch.allclose(terms["oh"], F.cross_entropy(t_out, targets))
    assert torch.allclose(terms["total"], 1.5 * terms["oh"] + 0.5 * r_bn + 2 * terms["adv"])


def test_the_teacher_is_the_ensemble_of_the_uploads_not_their_average(fitted: tuple[Experiment, list[Reply]]
                                                                       ) -> None:
    exp, replies = fitted
    alg: Dense = exp.algorithm
    models = [alg.parts.assemble(alg.parts.new(), r.message.arrays, {}).eval() for r in replies]
    x = torch.randn(5, 3, 28, 28)
    with torch.no_grad():
        expected = (models[0](x) + models[1](x)) / 2
        averaged = alg.parts.assemble(alg.parts.new(), {k: (replies[0].message.arrays[k].float()
                                                           + replies[1].message.arrays[k].float()) / 2
                                                        for k in replies[0].message.arrays}, {}).eval()
        got = alg.teacher(replies)(x)
        assert torch.allclose(got, expected, atol=1e-5)
        assert not torch.allclose(got, averaged(x), atol=1e-3)


def test_the_upload_is_the_trained_model(fitted: tuple[Experiment, list[Reply]]) -> None:
    exp, replies = fitted
    reply = replies[0].message
    init = exp.algorithm.parts.init_state
    assert set(reply.arrays) == set(init)
    assert reply.scalars["steps"] == 2 * math.ceil(len(exp.data.clients[0].train) / 16)
    assert (reply.scalars["channels"], reply.scalars["height"], reply.scalars["width"]) == (3, 28, 28)
    assert not torch.equal(reply.arrays["features.0.weight"], init["features.0.weight"])
    assert not torch.equal(reply.arrays["features.1.running_mean"], init["features.1.running_mean"])


def test_the_server_distils_on_a_growing_pool(fitted: tuple[Experiment, list[Reply]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    exp, replies = fitted
    alg: Dense = exp.algorithm
    sizes: list[int] = []
    real = Dense.distill
    monkeypatch.setattr(Dense, "distill", lambda self, s, t, pool, *a: sizes.append(len(pool)) or real(
        self, s, t, pool, *a))
    server = alg.aggregate(alg.init_server(), replies, exp.round_info(1))
    assert sizes == [8, 16] and server.synthetic == 16 and server.losses["kd"] > 0
    assert not torch.equal(server.model["features.0.weight"], alg.parts.init_state["features.0.weight"])
    assert alg.broadcast(server, exp.round_info(1), 0).arrays is server.model  # every client deploys the student


def test_the_table_config_keeps_common_yaml_setting() -> None:
    """configs/fedbip/dense.yaml copies common.yaml's data, model, training and run settings (it cannot extend it:
    it would inherit FedBiP's method_args), so DENSE's Table 1 row stands on FedBiP's setting."""
    folder = Path(__file__).parents[2] / "configs" / "fedbip"
    dense, common = (yaml.safe_load((folder / f).read_text()) for f in ("dense.yaml", "common.yaml"))
    for key in ("name", "seed", "rounds", "data", "model", "train", "run"):
        assert dense[key] == common[key], key

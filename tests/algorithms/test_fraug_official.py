"""FRAug's official-code switches (issue 37; docs/fraug.md, "Paper vs official code vs fedhet"), by hand values.

Presets and their precedence, the official set distances (mean + covariance, the 5-kernel MMD), U[0, 1) noise,
BatchNorm affine shared with the running statistics local, sample-weighted aggregation, the stage-1 CE mix,
the label-balanced rotation of the fake labels (generator included), and one official stage-2 step.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import fraug_losses as fl
from fedhet.algorithms.fraug import GEN, Draws, FRAug
from fedhet.config import ServerConfig, TrainConfig, from_dict
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.core.messages import Message, Reply
from fedhet.engine.local import PassOptimizers, fit_client
from fedhet.errors import ConfigError
from fedhet.losses.feature_distance import mean_cov_distance, multi_kernel_mmd
from fedhet.models.fraug_nets import RTNet

CPU = torch.device("cpu")
T = torch.tensor
BN_AFFINE, BN_STATS = {"features.1.weight", "features.1.bias"}, {
    "features.1.running_mean", "features.1.running_var", "features.1.num_batches_tracked"}


def make(classes: int = 2, aggregation: str = "uniform", batch: int = 4, steps: int = 2, **params: Any) -> FRAug:
    torch.manual_seed(0)
    template = tiny_model(in_dim=4, feat_dim=3, num_classes=classes, bn=True)
    p = FRAug.Params(**{"z_dim": 4, "eta_g": 0.1, "eta_m": 0.1, **params})
    p.validate()
    train = TrainConfig(lr=0.1, momentum=0.5, batch_size=batch, local_steps=steps)
    return FRAug(p, lambda: template, train, ServerConfig(aggregation=aggregation), classes, CPU)


def ctx(cid: int = 0, rnd: int = 1, rounds: int = 4, n: int = 8, classes: int = 2) -> ClientContext:
    return ClientContext(client_id=cid, info=RoundInfo(round=rnd, rounds=rounds, num_clients=2, seed=0),
                         data=tiny_client(n=n, in_dim=4, seed=cid, name=f"c{cid}", num_classes=classes), device=CPU,
                         num_classes=classes)


def test_presets_and_their_precedence() -> None:
    p = FRAug.Params()
    assert (p.preset, p.noise, p.bn_share, p.aggregation, p.gen_distance, p.rt_distance, p.b_syn) == (
        "official", "uniform", "affine", "weighted", "l2", "mmd_multi", 0)
    assert (p.proto_init, p.r0_frac, p.lambda_syn_rate, p.syn_mix_rate, p.rt_scale, p.rt_form) == (
        "zeros", 0.0, 0.0, 0.002, "none", "batch")
    paper = FRAug.Params(preset="paper")
    assert (paper.noise, paper.bn_share, paper.aggregation, paper.eta_g, paper.beta, paper.syn_mix_rate) == (
        "normal", "none", "server", 0.005, 1.5, None)
    assert FRAug.Params(preset="paper", noise="uniform", beta=2.0).noise == "uniform"  # a given key wins
    assert FRAug.Params(preset="paper", noise="uniform", beta=2.0).beta == 2.0
    pacs = from_dict(FRAug.Params, {"preset": "official-pacs", "eta_m": 0.01}, "method_args")
    assert (pacs.alpha, pacs.beta, pacs.eta_g, pacs.eta_m, pacs.gen_distance, pacs.rt_distance) == (
        10.0, 1.0, 0.05, 0.01, "mmd_multi", "l2")
    replaced = dataclasses.replace(pacs, beta=3.0)  # with_hparams: every field given, the preset not re-applied
    assert (replaced.alpha, replaced.beta, replaced.eta_m) == (10.0, 3.0, 0.01)
    with pytest.raises(ConfigError, match="preset must be one of"):
        FRAug.Params(preset="authors")
    with pytest.raises(ConfigError, match="gen_distance must be one of"):
        FRAug.Params(gen_distance="l1").validate()
    with pytest.raises(ConfigError, match="b_syn must be >= 2"):
        FRAug.Params(b_syn=1).validate()
    with pytest.raises(ConfigError, match="syn_mix_rate must be >= 0"):
        FRAug.Params(syn_mix_rate=-1.0).validate()


def test_mean_cov_distance_by_hand() -> None:
    # means (1, 0) and (1, 2): mean sq diff (0 + 4) / 2 = 2; covariances diag(2, 0) and diag(0, 2): (4 + 4) / 4 = 2
    x, y = T([[0.0, 0.0], [2.0, 0.0]]), T([[1.0, 1.0], [1.0, 3.0]])
    assert float(mean_cov_distance(x, y)) == pytest.approx(4.0)
    assert float(fl.distance("mean_cov", x, y)) == pytest.approx(4.0)


def test_multi_kernel_mmd_by_hand() -> None:
    x, y = T([[0.0], [1.0]]), T([[3.0]])
    # pooled squared distances 1, 9, 4: mean over the 6 off-diagonal entries 28 / 6, divided by 2^(5 // 2)
    b = [28 / 6 / 4 * 2**i for i in range(5)]

    def k(d: float) -> float:
        return sum(math.exp(-d / bi) for bi in b)

    want = (2 * k(0) + 2 * k(1)) / 4 + k(0) - 2 * (k(9) + k(4)) / 2
    assert float(multi_kernel_mmd(x, y)) == pytest.approx(want, rel=1e-5)
    assert float(fl.distance("mmd_multi", x, y)) == pytest.approx(want, rel=1e-5)
    assert float(fl.distance("l2", x, y)) == pytest.approx((9 + 4) / 2)  # one target row: broadcast


def test_official_noise_is_uniform_on_0_1_and_reaches_the_draws() -> None:
    alg = make()
    work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx())
    torch.manual_seed(0)
    draws, _ = alg.augment(work, torch.randn(64, 3), torch.arange(64) % 2)
    assert draws.z is not None and draws.z.shape == (64, 4) and len(draws.labels_c) == 64  # b_syn 0: the batch
    for z in (draws.z, draws.z2):
        assert float(z.min()) >= 0.0 and float(z.max()) < 1.0 and abs(float(z.mean()) - 0.5) < 0.1
    paper, _ = make(preset="paper", b_syn=4).augment(work, torch.randn(64, 3), torch.arange(64) % 2)
    assert paper.z is not None and float(paper.z.min()) < 0.0


def test_bn_affine_is_shared_and_running_statistics_stay_local() -> None:
    alg = make()
    assert BN_AFFINE <= alg.parts.shared and not BN_STATS & alg.parts.shared
    assert not (BN_AFFINE | BN_STATS) & make(bn_share="none").parts.shared  # FedBN
    server, state = alg.init_server(), alg.init_client(0)
    out, state = fit_client(alg, alg.broadcast(server, ctx().info, 0), state, ctx())
    assert BN_AFFINE <= set(out.arrays) and not BN_STATS & set(out.arrays)
    assert set(state.local) == BN_STATS and float(state.local["features.1.running_mean"].abs().sum()) > 0
    sent = {k: v + 1.0 if k in BN_AFFINE else v for k, v in server.model.items()}
    model = alg.client_model(Message(arrays=sent), state)
    assert torch.equal(model.state_dict()["features.1.weight"], sent["features.1.weight"])
    assert torch.equal(model.state_dict()["features.1.running_mean"], state.local["features.1.running_mean"])


def test_official_aggregation_weights_by_sample_count_whatever_the_server_config() -> None:
    alg = make(aggregation="uniform")  # Params.aggregation weighted overrides server.aggregation uniform
    server = alg.init_server()
    replies = []
    for cid, n in ((0, 8), (1, 2)):
        out, _ = fit_client(alg, alg.broadcast(server, ctx().info, cid), alg.init_client(cid), ctx(cid))
        replies.append(Reply(cid, out, n))
    key = GEN + "net.0.weight"
    new = alg.aggregate(server, replies, ctx().info).model
    a, b = replies[0].message.arrays[key], replies[1].message.arrays[key]
    assert torch.allclose(new[key], 0.8 * a + 0.2 * b)
    uniform = make(aggregation="uniform", preset="paper").aggregate(server, replies, ctx().info).model
    assert torch.allclose(uniform[key], (a + b) / 2)


def test_mix_weight_and_interpolation_schedules_by_hand() -> None:
    assert fl.mix_weight(1, 300, 0.002) == 0.5  # Digits: exp(-0.6) = 0.55 capped at 0.5
    assert fl.mix_weight(1, 200, 0.01) == pytest.approx(math.exp(-2.0))  # PACS, 0-based round 0
    assert fl.mix_weight(101, 200, 0.01) == pytest.approx(math.exp(-1.0))
    assert fl.mix_weight(200, 200, 0.01) == 0.5
    assert fl.lambda_syn(1, 200, 0.0) == 1.0  # official Digits: no feature interpolation


def test_stage1_loss_is_the_official_mix() -> None:
    """(1 - w) CE(h(u), y) + w (CE(h(u_hat), y) + CE(h(u_hat_c), c)) / 2 (user_FRAug.py:182-185)."""
    alg = make()
    work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx())
    work.mix = 0.3
    x, y = torch.randn(4, 4), T([0, 1, 0, 1])
    want_real = F.cross_entropy(copy.deepcopy(work.model)(x), y).detach()
    alg.augment = lambda w, u, yy: (Draws(yy[:0], None, yy[:0]), torch.tensor(2.0))  # type: ignore[method-assign]
    alg.stage2 = lambda *a: torch.zeros(6)  # type: ignore[method-assign]
    optimizers = PassOptimizers(alg.passes(work)[0].optimizers, {}, "test")
    loss = alg.step(work, x, y, optimizers)
    assert float(loss.detach()) == pytest.approx(0.7 * float(want_real) + 0.3 * 1.0, rel=1e-6)


def test_fake_labels_rotate_label_balanced_and_train_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step s of a client uses labels (s B + i) mod C, i < B (user_FRAug.py:153-155, 202-204), zero prototypes
    for every class from the start; the generator's CE and L2 use the same labels and their prototypes."""
    alg = make(classes=3, batch=4, steps=3)
    syn: list[torch.Tensor] = []
    gen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original_syn, original_gen = fl.synthetic_loss, fl.generator_loss
    monkeypatch.setattr(fl, "synthetic_loss", lambda *a: syn.append(a[5].clone()) or original_syn(*a))
    monkeypatch.setattr(fl, "generator_loss", lambda *a: gen.append((a[2].clone(), a[3].clone()))
                        or original_gen(*a))
    state = alg.init_client(0)
    for rnd in (1, 2):
        torch.manual_seed(rnd)
        server = alg.init_server()
        _, state = fit_client(alg, alg.broadcast(server, ctx().info, 0), state, ctx(rnd=rnd, n=12, classes=3))
    assert [s.tolist() for s in syn] == [[(s * 4 + i) % 3 for i in range(4)] for s in range(6)]
    assert [g[0].tolist() for g in gen] == [s.tolist() for s in syn]
    assert all(t.shape == (4, 3) for _, t in gen)  # l2 targets: the prototypes of those labels


def test_rtnet_takes_the_label_as_input() -> None:
    rt = RTNet(3, 4, num_classes=2)
    assert rt.net[0].in_features == 5
    v = torch.randn(4, 3)
    with torch.no_grad():
        assert not torch.allclose(rt(v, T([0, 0, 1, 1])), rt(v, T([1, 1, 0, 0])))
    with pytest.raises(ValueError, match="needs the labels"):
        rt(v)


def _ent(z: torch.Tensor) -> torch.Tensor:
    p = z.softmax(1)
    return -(p * p.log()).sum(1).mean()


def test_official_stage2_step_by_hand() -> None:
    """g on the rotated labels: CE(h(g(z', c)), c) - alpha mean((g(z', c) - u_bar_c)^2); m, with g in eval mode:
    u_hat = u + m([g(z, y), y]), u_hat_c = u_bar_c + m([g(z', c), c]), unscaled although lam_syn = 0.7;
    L_FT = mean over the two branches of -Ent(h(.)) + beta mean((. - target)^2)."""
    alg = make(aux_momentum=0.0, alpha=1.5, beta=1.25, eta_m=0.2, rt_distance="l2")
    torch.manual_seed(0)
    work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx(n=6))
    work.protos, work.lam_syn = torch.randn(2, 3), 0.7
    gen, rt, head = work.gen, work.rt, work.model.head
    assert gen is not None and rt is not None
    gen0, rt0 = copy.deepcopy(gen), copy.deepcopy(rt)
    u, y, z, z2 = torch.randn(6, 3), T([0, 1, 0, 1, 0, 1]), torch.rand(6, 4), torch.rand(4, 4)
    protos, labels_c = work.protos, T([0, 1, 0, 1])
    alg.stage2(work, u, y, Draws(labels_c, z, z2), PassOptimizers(alg.passes(work)[0].optimizers, {}, "test"))
    gen0(z, y)  # the train-mode forwards move g's running statistics before m's eval-mode inputs
    v_c = gen0(z2, labels_c)
    l_gen = F.cross_entropy(head(v_c), labels_c) - 1.5 * ((v_c - protos[labels_c]) ** 2).mean()
    gen0.eval()
    with torch.no_grad():
        src, src_c = gen0(z, y), gen0(z2, labels_c)
    u_hat, u_hat_c = u + rt0(src, y), protos[labels_c] + rt0(src_c, labels_c)
    l_rt = ((-_ent(head(u_hat)) + 1.25 * ((u_hat - u) ** 2).mean())
            + (-_ent(head(u_hat_c)) + 1.25 * ((u_hat_c - protos[labels_c]) ** 2).mean())) / 2
    gen0.train()
    for net, before, loss, lr in ((gen, gen0, l_gen, 0.1), (rt, rt0, l_rt, 0.2)):
        grads = torch.autograd.grad(loss, list(before.parameters()))
        for new, old, g in zip(net.parameters(), before.parameters(), grads, strict=True):
            assert torch.allclose(new, old - lr * g, atol=1e-6)


def test_features_eval_uses_running_statistics_and_restores_train_mode() -> None:
    model = tiny_model(in_dim=4, feat_dim=3, num_classes=2, bn=True)
    x = torch.randn(5, 4)
    before = copy.deepcopy(model.state_dict())
    u = fl.features_eval(model, x)
    assert model.training and all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    model.eval()
    assert torch.allclose(u, model.features(x))


def test_stage1_runs_g_and_m_in_eval_mode() -> None:
    """Official stage 1 (user_FRAug.py:137-138): g and m on their running statistics, which it leaves alone;
    `aux_eval: false` (paper preset) uses batch statistics and moves them."""
    for aux_eval in (True, False):
        alg = make(aux_eval=aux_eval)
        work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx())
        assert work.gen is not None and work.rt is not None
        before = [b.clone() for net in (work.gen, work.rt) for b in net.buffers()]
        alg.augment(work, torch.randn(8, 3), torch.arange(8) % 2)
        after = [b for net in (work.gen, work.rt) for b in net.buffers()]
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)) == aux_eval
        assert work.gen.training and work.rt.training

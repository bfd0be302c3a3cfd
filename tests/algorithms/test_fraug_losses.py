"""FRAug's losses by hand (Eqs. 2, 5, 6), the MMD bandwidth, the prototype-label draw, and stage 2's updates."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import fraug_losses as fl
from fedhet.algorithms.fraug import Draws, FRAug
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.core.messages import Message
from fedhet.engine.local import PassOptimizers

T = torch.tensor
CPU = torch.device("cpu")


def head_2x3() -> torch.nn.Linear:
    """h(u) = W u + b with fixed weights: 2-d embeddings, 3 classes."""
    head = torch.nn.Linear(2, 3)
    with torch.no_grad():
        head.weight.copy_(T([[1.0, -0.5], [0.2, 0.8], [-1.0, 0.3]]))
        head.bias.copy_(T([0.1, 0.0, -0.2]))
    return head


def logits(u: list[float]) -> list[float]:
    w, b = [[1.0, -0.5], [0.2, 0.8], [-1.0, 0.3]], [0.1, 0.0, -0.2]
    return [w[j][0] * u[0] + w[j][1] * u[1] + b[j] for j in range(3)]


def ce(u: list[float], y: int) -> float:
    z = logits(u)
    return -z[y] + math.log(sum(math.exp(v) for v in z))


def ent(u: list[float]) -> float:
    z = logits(u)
    s = sum(math.exp(v) for v in z)
    return -sum(math.exp(v) / s * math.log(math.exp(v) / s) for v in z)


def mmd(xs: list[list[float]], ys: list[list[float]], sigma: float) -> float:
    """Biased MMD^2 with k(a, b) = exp(-|a - b|^2 / (2 sigma^2)), written out."""
    def k_mean(a: list[list[float]], b: list[list[float]]) -> float:
        total = sum(math.exp(-sum((p - q) ** 2 for p, q in zip(s, t, strict=True)) / (2 * sigma**2))
                    for s in a for t in b)
        return total / (len(a) * len(b))
    return k_mean(xs, xs) + k_mean(ys, ys) - 2 * k_mean(xs, ys)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


U = [[0.5, 1.0], [1.5, -0.5], [-1.0, 0.5], [0.0, 2.0]]
Y = [0, 0, 1, 1]


def test_generator_loss_eq5_by_hand() -> None:
    v, y, alpha, sigma = [[2.0, 0.0], [0.0, -1.0], [1.0, 1.0]], [0, 1, 2], 1.5, 1.0
    distance = mmd(v, U, sigma)
    assert alpha * distance > 0.1  # the MMD term matters: a flipped sign of alpha cannot pass
    want = mean([ce(v[i], y[i]) for i in range(3)]) - alpha * distance
    got = fl.generator_loss(head_2x3(), T(v), T(y), T(U), alpha, torch.tensor(sigma))
    assert got.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_rtnet_loss_eq6_by_hand(reduction: str) -> None:
    u_hat = [[1.0, 1.5], [2.5, -1.0], [-0.5, 0.0], [0.5, 3.0]]
    protos = [[0.5, 0.5], [0.0, 1.0], [-1.0, -1.0]]
    labels_c, u_hat_c = [0, 0, 2], [[1.0, 0.0], [0.0, 1.5], [-2.0, 0.0]]
    beta, sigma = 1.25, 1.0
    per_c = {c: -mean([ent(u_hat_c[i]) for i in range(3) if labels_c[i] == c])
             + beta * mmd([u_hat_c[i] for i in range(3) if labels_c[i] == c], [protos[c]], sigma) for c in (0, 2)}
    assert beta * mmd(u_hat, U, sigma) > 0.1 and min(per_c.values()) < -0.1 < 0.1 < max(per_c.values())
    reduce = sum if reduction == "sum" else mean
    want = -mean([ent(x) for x in u_hat]) + beta * mmd(u_hat, U, sigma) + reduce(list(per_c.values()))
    got = fl.rtnet_loss(head_2x3(), T(U), T(Y), T(u_hat), T(protos), T(labels_c), T(u_hat_c), beta,
                        torch.tensor(sigma), "prototype", reduction)
    assert got.item() == pytest.approx(want, rel=1e-5)
    # proto_mmd="real": class c's MMD against the batch's real class-c embeddings (class 2 has none: prototype)
    per_c[0] = -mean([ent(u_hat_c[0]), ent(u_hat_c[1])]) + beta * mmd(u_hat_c[:2], U[:2], sigma)
    want_real = -mean([ent(x) for x in u_hat]) + beta * mmd(u_hat, U, sigma) + reduce(list(per_c.values()))
    got_real = fl.rtnet_loss(head_2x3(), T(U), T(Y), T(u_hat), T(protos), T(labels_c), T(u_hat_c), beta,
                             torch.tensor(sigma), "real", reduction)
    assert got_real.item() == pytest.approx(want_real, rel=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_synthetic_loss_eq2_by_hand(reduction: str) -> None:
    res, lam = [[1.0, 0.0], [0.0, 1.0], [-1.0, 1.0], [0.5, 0.5]], 0.5
    protos = [[0.5, 0.5], [0.0, 1.0], [-1.0, -1.0]]
    labels_c, res_c = [0, 0, 0, 1], [[1.0, 0.0], [0.0, -2.0], [2.0, 2.0], [1.0, 1.0]]
    u_hat = [[a + lam * r for a, r in zip(u, rr, strict=True)] for u, rr in zip(U, res, strict=True)]
    u_hat_c = [[a + lam * r for a, r in zip(protos[c], rr, strict=True)] for c, rr in zip(labels_c, res_c, strict=True)]
    class0, class1 = mean([ce(u_hat_c[i], 0) for i in range(3)]), ce(u_hat_c[3], 1)
    terms = class0 + class1 if reduction == "sum" else (class0 + class1) / 2
    want = mean([ce(u_hat[i], Y[i]) for i in range(4)]) + terms
    got = fl.synthetic_loss(head_2x3(), T(U), T(Y), T(res), T(protos), T(labels_c), T(res_c), lam, 3, reduction)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_bandwidth_real_is_the_median_distance_among_u_and_sees_the_residual_scale() -> None:
    dists = sorted(math.dist(U[i], U[j]) for i in range(4) for j in range(i + 1, 4))
    assert fl.mmd_bandwidth(T(U), "real", None).item() == pytest.approx((dists[2] + dists[3]) / 2)
    assert fl.mmd_bandwidth(T(U), "fixed", 2.5).item() == 2.5 and fl.mmd_bandwidth(T(U), "pooled", None) is None
    torch.manual_seed(0)
    u, r = torch.randn(32, 16), torch.randn(32, 16)
    s = fl.mmd_bandwidth(u, "real", None)
    real = [fl.gaussian_mmd(u + k * r, u, s).item() for k in (0.5, 1.0, 2.0, 4.0)]
    pooled = [fl.gaussian_mmd(u + k * r, u).item() for k in (0.5, 1.0, 2.0, 4.0)]
    assert real == sorted(real) and real[-1] > 3 * pooled[-1]  # a big residual costs more with u's bandwidth
    # the pooled median heuristic is invariant to the common scale of both samples (residual and u alike)
    assert fl.gaussian_mmd(10 * (u + r), 10 * u).item() == pytest.approx(fl.gaussian_mmd(u + r, u).item(), rel=1e-4)


def test_proto_labels_rotate_covers_every_class_evenly() -> None:
    classes, labels, cursor = torch.arange(65), [], 0
    for _ in range(12):
        step, cursor = fl.proto_labels(classes, 16, False, "rotate", cursor)
        labels.append(step)
    counts = torch.bincount(torch.cat(labels), minlength=65)
    assert counts.min() >= 2 and counts.max() - counts.min() <= 1  # 192 labels over 65 classes: 2 or 3 each
    torch.manual_seed(0)
    drawn = torch.cat([fl.proto_labels(classes, 16, False, "random", 0)[0] for _ in range(60)])
    assert set(drawn.tolist()) == set(range(65))
    per_class = fl.proto_labels(T([1, 4]), 3, True, "rotate", 0)[0]
    assert per_class.tolist() == [1, 1, 1, 4, 4, 4]


def test_pick_real_draws_a_real_embedding_of_the_same_class() -> None:
    y, labels_c = T([0, 1, 0, 2, 0]), T([0, 2, 1, 3, 0])
    torch.manual_seed(0)
    picks = torch.stack([fl.pick_real(y, labels_c, True) for _ in range(50)])
    assert set(picks[:, 0].tolist()) == {0, 2, 4} and (picks[:, 1] == 3).all() and (picks[:, 2] == 1).all()
    assert (picks[:, 3] == -1).all()  # class 3 is not in the batch: the prototype
    assert (fl.pick_real(y, labels_c, False) == -1).all()
    u, protos = torch.arange(10.0).reshape(5, 2), -torch.ones(4, 2)
    assert fl.rt_source_c(u, protos, T([1, 3]), T([1, -1])).tolist() == [[2.0, 3.0], [-1.0, -1.0]]


def _hand_mmd(x: torch.Tensor, y: torch.Tensor, sigma: float) -> torch.Tensor:
    k = lambda a, b: torch.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / (2 * sigma**2)).mean()  # noqa: E731
    return k(x, x) + k(y, y) - 2 * k(x, y)


def _hand_ent(z: torch.Tensor) -> torch.Tensor:
    p = z.softmax(1)
    return -(p * p.log()).sum(1).mean()


@pytest.mark.parametrize(("use_generator", "route"), [(True, False), (False, False), (True, True)])
def test_stage2_steps_g_and_m_down_the_hand_gradients_of_eq5_and_eq6(use_generator: bool, route: bool) -> None:
    """One stage-2 step: omega -= eta_g grad(Eq. 5), phi -= eta_m grad(Eq. 6), both gradients taken at the
    step's start (simultaneous); the head is left alone. Without the generator the RTNet maps the real
    embeddings u (and for u_hat_c the picked ones or u_bar_c). `rt_grad_to_generator`: omega follows
    grad(Eq. 5 + Eq. 6), the RTNet's input not detached."""
    p = FRAug.Params(preset="paper", z_dim=4, b_syn=4, eta_g=0.1, eta_m=0.2, aux_momentum=0.0, alpha=1.5, beta=1.25,
                     mmd_bandwidth="fixed", mmd_sigma=2.0, use_generator=use_generator, rt_grad_to_generator=route)
    p.validate()
    alg = FRAug(p, lambda: tiny_model(4, 3, 2, bn=True), TrainConfig(), ServerConfig(), 2, CPU)
    torch.manual_seed(0)
    ctx = ClientContext(client_id=0, info=RoundInfo(round=1, rounds=1, num_clients=1, seed=0),
                        data=tiny_client(n=6, in_dim=4), device=CPU, num_classes=2)
    work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx)
    work.protos, work.lam_syn = torch.randn(2, 3), 0.7
    gen, rt, head = work.gen, work.rt, work.model.head
    assert (gen is not None) == use_generator and rt is not None
    gen0, rt0, head0 = copy.deepcopy(gen), copy.deepcopy(rt), copy.deepcopy(head)
    u, y, z = torch.randn(6, 3), T([0, 1, 0, 1, 0, 1]), torch.randn(6, 4)
    protos, labels_c, lam = work.protos, T([0, 1, 0, 1]), 0.7
    # z' for the generator; without it the picked real class-c embeddings (-1: the prototype)
    z2 = torch.randn(4, 4) if use_generator else T([2, -1, 0, 5])
    optimizers = PassOptimizers(alg.passes(work)[0].optimizers, {}, "test")
    alg.stage2(work, u, y, Draws(labels_c, z if use_generator else None, z2), optimizers)
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), head0.parameters(), strict=True))
    assert all(q.grad is None for q in head.parameters())
    keep = (lambda t: t) if route else (lambda t: t.detach())  # noqa: E731
    src = keep(gen0(z, y)) if gen0 else u
    src_c = keep(gen0(z2, labels_c)) if gen0 else torch.stack([u[2], protos[1], u[0], u[5]])
    u_hat, u_hat_c = u + lam * rt0(src), protos[labels_c] + lam * rt0(src_c)
    classes = [(-_hand_ent(head(u_hat_c[labels_c == c])) + 1.25 * _hand_mmd(u_hat_c[labels_c == c], protos[c:c + 1],
                                                                           2.0)) for c in (0, 1)]
    l_rt = -_hand_ent(head(u_hat)) + 1.25 * _hand_mmd(u_hat, u, 2.0) + (classes[0] + classes[1]) / 2
    assert isinstance(rt, torch.nn.Module)
    for net, before, loss, lr in ((rt, rt0, l_rt, 0.2), (gen, gen0, None, 0.1)):
        if net is None:
            continue
        if loss is None:  # Eq. (5), plus Eq. (6) when routed
            v = gen0(z, y)
            loss = F.cross_entropy(head(v), y) - 1.5 * _hand_mmd(v, u, 2.0) + (l_rt if route else 0.0)
        grads = torch.autograd.grad(loss, list(before.parameters()), retain_graph=True)
        for new, old, g in zip(net.parameters(), before.parameters(), grads, strict=True):
            assert torch.allclose(new, old - lr * g, atol=1e-6)

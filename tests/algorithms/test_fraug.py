"""FRAug: schedules, prototypes and their labels, routing, messages, typed state, optimizers, ablations.

The losses by hand (Eqs. 2, 5, 6) and stage 2's updates: test_fraug_losses.py; learning: test_fraug_learning.py.
The embedding-noise baselines: test_oracle_and_noise.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import ALGORITHMS, fraug_losses
from fedhet.algorithms.fraug import GEN, FRAug, FRAugState, lambda_c, lambda_syn, update_prototypes
from fedhet.config import ServerConfig, TrainConfig, from_dict
from fedhet.core.contract import ClientContext, RoundInfo, ServerState
from fedhet.core.messages import Message, Reply
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")
BN = {"features.1.weight", "features.1.bias", "features.1.running_mean", "features.1.running_var",
      "features.1.num_batches_tracked"}


def make(aggregation: str = "weighted", persist: bool = False, **params: Any) -> FRAug:
    torch.manual_seed(0)
    template = tiny_model(in_dim=4, feat_dim=3, num_classes=2, bn=True)
    p = FRAug.Params(**{"preset": "paper", "z_dim": 4, "b_syn": 4, "eta_g": 0.1, "eta_m": 0.1, **params})
    p.validate()
    train = TrainConfig(lr=0.1, momentum=0.5, batch_size=4, local_steps=2, persist_optimizer=persist)
    return FRAug(p, lambda: template, train, ServerConfig(aggregation=aggregation), 2, CPU)


def ctx(cid: int = 0, rnd: int = 1, rounds: int = 4) -> ClientContext:
    return ClientContext(client_id=cid, info=RoundInfo(round=rnd, rounds=rounds, num_clients=2, seed=0),
                         data=tiny_client(n=8, in_dim=4, seed=cid, name=f"c{cid}"), device=CPU, num_classes=2)


def fit(alg: FRAug, state: FRAugState | None = None, rnd: int = 1, cid: int = 0,
        server: ServerState | None = None) -> tuple[ServerState, Message, FRAugState]:
    torch.manual_seed(rnd)
    server = server or alg.init_server()
    context = ctx(cid, rnd)
    out, new = fit_client(alg, alg.broadcast(server, context.info, cid), state or alg.init_client(cid), context)
    assert isinstance(new, FRAugState)
    return server, out, new


def test_schedules_by_hand() -> None:
    # R = 200: r0 = 10 rounds; lambda_c = 0.3 exp(-5 (1 - r / 10)) before, 0.3 from round 10 on
    assert lambda_c(1, 200) == pytest.approx(0.3 * math.exp(-4.5))
    assert lambda_c(5, 200) == pytest.approx(0.3 * math.exp(-2.5))
    assert lambda_c(10, 200) == lambda_c(150, 200) == 0.3
    assert lambda_c(1, 3) == 0.3  # r0 = 0.15 < 1: no ramp left
    assert lambda_syn(1, 200) == pytest.approx(math.exp(-1.99))
    assert lambda_syn(100, 200) == pytest.approx(math.exp(-1.0))
    assert lambda_syn(200, 200) == 1.0


def test_the_work_takes_its_schedules_from_the_round_info() -> None:
    alg = make(r0_frac=0.5)
    work = alg.start(Message(arrays=alg.init_server().model), alg.init_client(0), ctx(rnd=1, rounds=4))
    assert work.lam_c == pytest.approx(0.3 * math.exp(-2.5)) and work.lam_syn == pytest.approx(math.exp(-0.03))


def test_ema_prototypes_by_hand() -> None:
    protos, seen = torch.ones(3, 2), torch.tensor([True, True, True])
    u, y = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.tensor([0, 0, 1])
    new, _ = update_prototypes(protos, seen, u, y, lam=0.5, eps=0.0)
    assert torch.allclose(new, torch.tensor([[0.5 + 0.5 * 2.0, 0.5 + 0.5 * 3.0], [0.5 + 2.5, 0.5 + 3.0], [1.0, 1.0]]))
    literal, _ = update_prototypes(protos, seen, u, y, lam=0.5, eps=0.0, skip_absent=False)
    assert torch.allclose(literal[2], torch.tensor([0.5, 0.5]))  # Eq. (4) as printed: absent class decays
    # a class seen for the first time takes its batch mean; never-seen classes stay unseen
    first, seen2 = update_prototypes(torch.zeros(3, 2), torch.zeros(3, dtype=torch.bool), u, y, lam=0.1)
    assert torch.allclose(first[:2], torch.tensor([[2.0, 3.0], [5.0, 6.0]])) and seen2.tolist() == [True, True, False]


def test_synthetic_loss_reaches_the_head_only() -> None:
    alg = make()
    model = tiny_model(in_dim=4, feat_dim=3, num_classes=2, bn=True)
    x, y = torch.randn(6, 4), torch.tensor([0, 1] * 3)
    u = model.features(x)
    labels_c = torch.tensor([0, 1, 0, 1])
    loss = fraug_losses.synthetic_loss(model.head, u, y, torch.randn(6, 3), torch.randn(2, 3), labels_c,
                                       torch.randn(4, 3), 0.5, alg.num_classes, alg.params.class_reduction)
    loss.backward()
    assert all(p.grad is None for p in model.features.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())


def test_messages_carry_classifier_and_generator_never_rtnet_or_bn() -> None:
    alg = make()
    server, out, state = fit(alg)
    assert not BN & set(server.model) and not BN & set(out.arrays)
    gen_keys = {GEN + k for k in alg.new_generator().state_dict()}
    assert set(out.arrays) == {"features.0.weight", "features.0.bias", "head.weight", "head.bias"} | gen_keys
    assert set(alg.broadcast(server, ctx().info, 0).arrays) == set(out.arrays)
    assert not any("rt" in k.split("/")[0] for k in out.arrays)
    assert state.rtnet is not None and state.protos is not None and state.proto_seen is not None
    assert set(state.local) == BN and set(state.rtnet) == set(alg.new_rtnet().state_dict())
    assert state.protos.shape == (2, 3) and state.proto_seen.all()
    assert math.isfinite(float(out.scalars["train_loss"])) and out.scalars["steps"] == 2


def test_state_persists_across_two_fits_without_mutation(monkeypatch: pytest.MonkeyPatch) -> None:
    alg = make()
    calls = []
    original = alg.new_rtnet
    monkeypatch.setattr(alg, "new_rtnet", lambda: calls.append(1) or original())
    _, _, s1 = fit(alg, rnd=1)
    assert len(calls) == 1 and s1.rtnet is not None and s1.protos is not None  # RTNet born at the first round
    frozen = {k: v.clone() for k, v in s1.rtnet.items()}, s1.protos.clone(), dict(s1.local)
    _, _, s2 = fit(alg, s1, rnd=2)
    assert len(calls) == 1 and s2.rtnet is not None
    assert all(torch.equal(frozen[0][k], s1.rtnet[k]) for k in frozen[0]) and torch.equal(frozen[1], s1.protos)
    assert s1.local == frozen[2]
    assert not torch.equal(s2.rtnet["net.0.weight"], s1.rtnet["net.0.weight"])  # trained further
    assert not torch.equal(s2.protos, s1.protos)
    assert s2.local["features.1.num_batches_tracked"].item() == 4


@pytest.mark.parametrize("persist", [False, True])
def test_only_the_classifier_optimizer_is_persisted(persist: bool) -> None:
    """train.persist_optimizer keeps the classifier's momentum under "model"; g's and m's optimizers are fresh
    every round (their state is never stored)."""
    alg = make(persist=persist)
    _, _, s1 = fit(alg)
    assert set(s1.optim) == ({"model"} if persist else set())
    if persist:  # momentum buffers of the classifier's 6 trainable tensors (linear, BN and head weight, bias)
        assert len(s1.optim["model"]["state"]) == 6
        _, _, s2 = fit(alg, s1, rnd=2)
        assert set(s2.optim) == {"model"}


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], prefix: str = "") -> bool:
    return any(not torch.equal(before[prefix + k], v) for k, v in after.items() if prefix + k in before)


@pytest.mark.parametrize("switch", ["use_generator", "use_rtnet", "use_ema"])
def test_ablation_switches_change_what_is_trained(switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    alg = make(**{switch: False})
    born, labels = [], []
    original, synthetic = alg.new_rtnet, fraug_losses.synthetic_loss

    def spy() -> torch.nn.Module:
        net = original()
        born.append({k: v.clone() for k, v in net.state_dict().items()})
        return net

    monkeypatch.setattr(alg, "new_rtnet", spy)
    monkeypatch.setattr(fraug_losses, "synthetic_loss", lambda *a: labels.append(a[5]) or synthetic(*a))
    server, out, state = fit(alg)
    gen_out = {k[len(GEN):]: v for k, v in out.arrays.items() if k.startswith(GEN)}
    assert bool(gen_out) == (switch != "use_generator")
    if gen_out:
        assert _changed(server.model, gen_out, GEN)  # the generator was trained
    assert (state.rtnet is not None) == (switch != "use_rtnet")
    if state.rtnet is not None:  # the RTNet was trained: it moved away from its random initialisation
        assert _changed(born[0], state.rtnet)
    else:
        assert not born
    assert (state.protos is not None) == (switch != "use_ema")
    assert len(labels) == 2 and all((len(c) == 0) == (switch == "use_ema") for c in labels)  # u_hat_c terms
    with pytest.raises(ConfigError):
        FRAug.Params(use_generator=False, use_rtnet=False).validate()


def test_stage2_gradient_routing() -> None:
    literal_alg, routed_alg = make(), make(rt_grad_to_generator=True)
    literal_alg.train_cfg.local_steps = routed_alg.train_cfg.local_steps = 1
    _, literal, _ = fit(literal_alg)
    _, routed, _ = fit(routed_alg)
    key = GEN + "net.0.weight"
    assert not torch.equal(literal.arrays[key], routed.arrays[key])  # L_rt reaches omega only when routed


def test_recomputed_stage2_features_leave_the_bn_statistics_alone() -> None:
    model = tiny_model(in_dim=4, feat_dim=3, num_classes=2, bn=True).train()
    before = [b.clone() for b in model.buffers()]
    x = torch.randn(6, 4)
    u = fraug_losses.features_keep_bn(model, x)
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True))
    assert torch.allclose(u, model.features(x))  # and it is f(x) in train mode (batch statistics)


def test_prototype_labels_cover_every_class_when_c_exceeds_b_syn(monkeypatch: pytest.MonkeyPatch) -> None:
    """OfficeHome-like C = 65 > B_syn = 16: over the steps of one round (5 x 16 = 80 labels) every class gets a
    prototype term, and the next round continues the rotation (the old `arange(B_syn) % C` gave classes 0-15)."""
    p = FRAug.Params(preset="paper", z_dim=4, b_syn=16, proto_init="zeros")
    template = tiny_model(in_dim=4, feat_dim=3, num_classes=65, bn=True)
    train = TrainConfig(lr=0.1, momentum=0.0, batch_size=8, local_steps=5)
    alg = FRAug(p, lambda: template, train, ServerConfig(), 65, CPU)
    seen: list[torch.Tensor] = []
    original = fraug_losses.synthetic_loss
    monkeypatch.setattr(fraug_losses, "synthetic_loss", lambda *a: seen.append(a[5].clone()) or original(*a))
    data = tiny_client(n=130, in_dim=4, num_classes=65)
    server, state = alg.init_server(), alg.init_client(0)
    for rnd in (1, 2):
        torch.manual_seed(rnd)
        context = ClientContext(client_id=0, info=RoundInfo(round=rnd, rounds=2, num_clients=1, seed=0), data=data,
                                device=CPU, num_classes=65)
        _, state = fit_client(alg, alg.broadcast(server, context.info, 0), state, context)
        if rnd == 1:
            assert set(torch.cat(seen).tolist()) == set(range(65))
            assert isinstance(state, FRAugState) and state.proto_cursor == 80 % 65  # the rotation is kept
    counts = torch.bincount(torch.cat(seen), minlength=65)
    assert counts.max() - counts.min() <= 1  # 160 labels over two rounds: 2 or 3 per class


@pytest.mark.parametrize("source", ["batch", "prototype"])
def test_without_the_generator_the_rtnet_transforms_the_real_embeddings(source: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Table 5 rows 1-2: u_hat = u + lam m(u); u_hat_c = u_bar_c + lam m(u_i) with u_i a real class-c embedding
    of the batch (`rt_input_c: batch`) or m(u_bar_c) ("prototype"); never m of Gaussian noise."""
    alg = make(use_generator=False, rt_input_c=source)
    picks, checked = [], []
    pick_real = fraug_losses.pick_real
    monkeypatch.setattr(fraug_losses, "pick_real", lambda *a: picks.append(pick_real(*a)) or picks[-1])
    original = fraug_losses.synthetic_loss

    def spy(head: Any, u: torch.Tensor, y: torch.Tensor, res: torch.Tensor, protos: torch.Tensor,
            labels_c: torch.Tensor, res_c: torch.Tensor, lam: float, *rest: Any) -> torch.Tensor:
        rt, pick = alg._nets["rt"], picks[-1]  # this step's RTNet, before stage 2 moves it
        assert (pick >= 0).all() == (source == "batch") and (y[pick[pick >= 0]] == labels_c[pick >= 0]).all()
        base_c = torch.where((pick >= 0)[:, None], u[pick.clamp_min(0)], protos[labels_c])
        with torch.no_grad():  # same batch -> same BN statistics
            assert torch.allclose(res, rt(u.detach()), atol=1e-6)
            assert torch.allclose(res_c, rt(base_c.detach()), atol=1e-6)
        checked.append(1)
        return original(head, u, y, res, protos, labels_c, res_c, lam, *rest)

    monkeypatch.setattr(fraug_losses, "synthetic_loss", spy)
    fit(alg)
    assert len(checked) == 2


def test_params_validation() -> None:
    cls = ALGORITHMS.get("fraug")
    assert cls is FRAug
    with pytest.raises(ConfigError):
        from_dict(FRAug.Params, {"alpah": 1.0}, "method_args")
    with pytest.raises(ConfigError):
        FRAug.Params(stage2_features="later").validate()
    with pytest.raises(ConfigError, match="mmd_bandwidth fixed needs mmd_sigma"):
        FRAug.Params(mmd_bandwidth="fixed").validate()
    with pytest.raises(ConfigError, match="mmd_sigma is used only with mmd_bandwidth: fixed"):
        FRAug.Params(mmd_sigma=2.0).validate()
    with pytest.raises(ConfigError, match="proto_labels must be one of rotate, random"):
        FRAug.Params(proto_labels="cycle").validate()
    with pytest.raises(ConfigError, match="rt_input_c must be one of batch, prototype"):
        FRAug.Params(rt_input_c="noise").validate()
    p = FRAug.Params(preset="paper")
    assert (p.z_dim, p.eta_g, p.eta_m, p.alpha, p.beta, p.b_syn, p.lambda0, p.r0_frac) == (
        256, 0.005, 0.005, 1.0, 1.5, 64, 0.3, 0.05)
    assert (p.class_reduction, p.proto_labels, p.mmd_bandwidth, p.rt_input_c) == ("mean", "rotate", "pooled", "batch")


def test_uniform_aggregation_averages_the_generator() -> None:
    alg = make(aggregation="uniform")
    server = alg.init_server()
    replies = []
    for cid, n in ((0, 8), (1, 2)):
        _, out, _ = fit(alg, rnd=1, cid=cid, server=server)
        replies.append(Reply(cid, out, n))
    new = alg.aggregate(server, replies, ctx().info).model
    key = GEN + "net.0.weight"
    assert torch.allclose(new[key], (replies[0].message.arrays[key] + replies[1].message.arrays[key]) / 2)


def test_a_fit_does_not_depend_on_what_this_process_fitted_before() -> None:
    """Client 1's round-1 fit is the same in a fresh process (Flower: one process per client) and after client
    0's fit in the same process (in-process): building the reused generator / RTNet objects must not draw from
    the fit's random stream."""
    fresh = make()
    server = fresh.init_server()
    _, alone, _ = fit(fresh, cid=1, server=server)
    warm = make()
    fit(warm, cid=0, server=server)
    _, after, _ = fit(warm, cid=1, server=server)
    assert alone.scalars == after.scalars
    for key, value in alone.arrays.items():
        assert torch.equal(value, after.arrays[key]), key

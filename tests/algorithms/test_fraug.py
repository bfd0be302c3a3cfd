"""FRAug and the embedding-noise baselines: schedules, prototypes, gradient routing, messages, state, ablations."""

from __future__ import annotations

import math

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import ALGORITHMS, ClientContext
from fedhet.algorithms.embedding_noise import sample_noise
from fedhet.algorithms.fraug import GEN, lambda_c, lambda_syn, update_prototypes
from fedhet.config import ServerConfig, TrainConfig, from_dict
from fedhet.engine.messages import Reply
from fedhet.errors import ConfigError
from fedhet.losses import softmax_entropy

CPU = torch.device("cpu")
BN = {"features.1.weight", "features.1.bias", "features.1.running_mean", "features.1.running_var",
      "features.1.num_batches_tracked"}


def make(name: str = "fraug", aggregation: str = "weighted", **params):
    cls = ALGORITHMS.get(name)
    torch.manual_seed(0)
    template = tiny_model(in_dim=4, feat_dim=3, num_classes=2, bn=True)
    defaults = {"z_dim": 4, "b_syn": 4, "eta_g": 0.1, "eta_m": 0.1} if name == "fraug" else {}
    p = cls.Params(**{**defaults, **params})
    p.validate()
    train = TrainConfig(lr=0.1, momentum=0.0, batch_size=4, local_steps=2)
    return cls(p, lambda: template, train, ServerConfig(aggregation=aggregation), 2, CPU)


def ctx(cid: int = 0, rnd: int = 1, rounds: int = 4) -> ClientContext:
    return ClientContext(cid, rnd, tiny_client(n=8, in_dim=4, seed=cid, name=f"c{cid}"), CPU, 2, {"rounds": rounds})


def fit(alg, state=None, rnd: int = 1, cid: int = 0):
    torch.manual_seed(rnd)
    server = alg.init_server()
    return server, *alg.fit(alg.broadcast(server, rnd, cid), state or {}, ctx(cid, rnd))


def test_schedules_by_hand() -> None:
    # R = 200: r0 = 10 rounds; lambda_c = 0.3 exp(-5 (1 - r / 10)) before, 0.3 from round 10 on
    assert lambda_c(1, 200) == pytest.approx(0.3 * math.exp(-4.5))
    assert lambda_c(5, 200) == pytest.approx(0.3 * math.exp(-2.5))
    assert lambda_c(10, 200) == lambda_c(150, 200) == 0.3
    assert lambda_c(1, 3) == 0.3  # r0 = 0.15 < 1: no ramp left
    assert lambda_syn(1, 200) == pytest.approx(math.exp(-1.99))
    assert lambda_syn(100, 200) == pytest.approx(math.exp(-1.0))
    assert lambda_syn(200, 200) == 1.0


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


def test_entropy_term_sign() -> None:
    assert softmax_entropy(torch.zeros(1, 4)).item() == pytest.approx(math.log(4))
    assert softmax_entropy(torch.tensor([[10.0, 0.0, 0.0, 0.0]])).item() < 0.01
    alg = make(beta=0.0)
    head = torch.nn.Linear(3, 2)
    u, y = torch.randn(6, 3), torch.tensor([0, 1] * 3)
    u_hat = torch.randn(6, 3, requires_grad=True)
    loss = alg.rtnet_loss(head, u, y, u_hat, torch.zeros(2, 3), torch.zeros(0, dtype=torch.long), None)
    assert loss.item() == pytest.approx(-softmax_entropy(head(u_hat)).item())  # minimising L_rt maximises entropy
    before = softmax_entropy(head(u_hat)).item()
    (g,) = torch.autograd.grad(loss, u_hat)
    assert softmax_entropy(head(u_hat - 0.1 * g)).item() > before
    u_hat_c, labels_c = torch.randn(4, 3), torch.tensor([0, 1, 1, 1])
    with_c = alg.rtnet_loss(head, u, y, u_hat, torch.zeros(2, 3), labels_c, u_hat_c)
    by_hand = -softmax_entropy(head(u_hat)) - softmax_entropy(head(u_hat_c[:1])) - softmax_entropy(head(u_hat_c[1:]))
    assert with_c.item() == pytest.approx(by_hand.item(), rel=1e-5)  # Eq. (6): -Ent(u_hat) - sum_c Ent(u_hat_c)


def test_synthetic_loss_reaches_the_head_only() -> None:
    alg = make()
    model = tiny_model(in_dim=4, feat_dim=3, num_classes=2, bn=True)
    x, y = torch.randn(6, 4), torch.tensor([0, 1] * 3)
    u = model.features(x)
    labels_c = torch.tensor([0, 1, 0, 1])
    loss = alg.synthetic_loss(model.head, u, y, torch.randn(6, 3), torch.randn(2, 3), labels_c, torch.randn(4, 3), 0.5)
    loss.backward()
    assert all(p.grad is None for p in model.features.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())


def test_messages_carry_classifier_and_generator_never_rtnet_or_bn() -> None:
    alg = make()
    server, out, state = fit(alg)
    assert not BN & set(server["global"]) and not BN & set(out.arrays)
    gen_keys = {GEN + k for k in alg.new_generator().state_dict()}
    assert set(out.arrays) == {"features.0.weight", "features.0.bias", "head.weight", "head.bias"} | gen_keys
    assert set(alg.broadcast(server, 1, 0).arrays) == set(out.arrays)
    assert not any("rt" in k.split("/")[0] for k in out.arrays)
    assert set(state["local"]) == BN and set(state["rtnet"]) == set(alg.new_rtnet().state_dict())
    assert state["protos"].shape == (2, 3) and state["proto_seen"].all()
    assert math.isfinite(out.scalars["train_loss"]) and out.scalars["steps"] == 2


def test_state_persists_across_two_fits_without_mutation(monkeypatch: pytest.MonkeyPatch) -> None:
    alg = make()
    calls = []
    original = alg.new_rtnet
    monkeypatch.setattr(alg, "new_rtnet", lambda: calls.append(1) or original())
    _, _, s1 = fit(alg, rnd=1)
    assert len(calls) == 1  # RTNet randomly initialised at the client's first round only
    frozen = {k: v.clone() for k, v in s1["rtnet"].items()}, s1["protos"].clone()
    _, _, s2 = fit(alg, s1, rnd=2)
    assert len(calls) == 1
    assert all(torch.equal(frozen[0][k], s1["rtnet"][k]) for k in frozen[0]) and torch.equal(frozen[1], s1["protos"])
    assert not torch.equal(s2["rtnet"]["net.0.weight"], s1["rtnet"]["net.0.weight"])  # trained further
    assert not torch.equal(s2["protos"], s1["protos"])
    assert s2["local"]["features.1.num_batches_tracked"].item() == 4


def _changed(before: dict, after: dict, prefix: str = "") -> bool:
    return any(not torch.equal(before[prefix + k], v) for k, v in after.items() if prefix + k in before)


@pytest.mark.parametrize("switch", ["use_generator", "use_rtnet", "use_ema"])
def test_ablation_switches_change_what_is_trained(switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    alg = make(**{switch: False})
    born = []
    original = alg.new_rtnet

    def spy():
        net = original()
        born.append({k: v.clone() for k, v in net.state_dict().items()})
        return net

    monkeypatch.setattr(alg, "new_rtnet", spy)
    server, out, state = fit(alg)
    gen_out = {k[len(GEN):]: v for k, v in out.arrays.items() if k.startswith(GEN)}
    assert bool(gen_out) == (switch != "use_generator")
    if gen_out:
        assert _changed(server["global"], gen_out, GEN)  # the generator was trained
    assert ("rtnet" in state) == (switch != "use_rtnet")
    if "rtnet" in state:  # the RTNet was trained: it moved away from its random initialisation
        assert _changed(born[0], state["rtnet"])
    else:
        assert not born
    assert ("protos" in state) == (switch != "use_ema")
    if switch == "use_ema":
        assert len(alg._proto_labels(torch.ones(2, dtype=torch.bool))) == 0  # no u_hat_c terms
    with pytest.raises(ConfigError):
        alg.Params(use_generator=False, use_rtnet=False).validate()


def test_stage2_gradient_routing() -> None:
    literal_alg, routed_alg = make(), make(rt_grad_to_generator=True)
    literal_alg.train_cfg.local_steps = routed_alg.train_cfg.local_steps = 1
    _, literal, _ = fit(literal_alg)
    _, routed, _ = fit(routed_alg)
    key = GEN + "net.0.weight"
    assert not torch.equal(literal.arrays[key], routed.arrays[key])  # L_rt reaches omega only when routed
    assert torch.equal(literal.arrays["head.weight"], routed.arrays["head.weight"])  # stage 2 leaves h alone


def test_stage2_options_run() -> None:
    for kwargs in ({"rt_grad_to_generator": True}, {"stage2_features": "recompute", "proto_mmd": "real"},
                   {"b_syn_per_class": True, "class_reduction": "mean", "proto_init": "zeros"}):
        _, out, state = fit(make(**kwargs))
        assert math.isfinite(out.scalars["rt_loss"]) and math.isfinite(out.scalars["gen_loss"])


def test_params_validation() -> None:
    cls = ALGORITHMS.get("fraug")
    with pytest.raises(ConfigError):
        from_dict(cls.Params, {"alpah": 1.0}, "method_args")
    with pytest.raises(ConfigError):
        cls.Params(stage2_features="later").validate()
    with pytest.raises(ConfigError):
        ALGORITHMS.get("embnoise").Params(distribution="cauchy").validate()
    p = cls.Params()
    assert (p.z_dim, p.eta_g, p.eta_m, p.alpha, p.beta, p.b_syn, p.lambda0, p.r0_frac) == (
        256, 0.005, 0.005, 1.0, 1.5, 64, 0.3, 0.05)


def test_uniform_aggregation_averages_the_generator() -> None:
    alg = make(aggregation="uniform")
    server = alg.init_server()
    replies = []
    for cid, n in ((0, 8), (1, 2)):
        torch.manual_seed(cid)
        out, _ = alg.fit(alg.broadcast(server, 1, cid), {}, ctx(cid))
        replies.append(Reply(cid, out, n))
    new = alg.aggregate(server, replies)["global"]
    key = GEN + "net.0.weight"
    assert torch.allclose(new[key], (replies[0].message.arrays[key] + replies[1].message.arrays[key]) / 2)


@pytest.mark.parametrize(("dist", "var"), [("uniform", 1 / 3), ("laplace", 2.0), ("gaussian", 1.0)])
def test_embnoise_noise_statistics(dist: str, var: float) -> None:
    gamma = 0.5
    torch.manual_seed(0)
    noise = sample_noise((200_000,), dist, gamma)
    assert abs(noise.mean().item()) < 0.01
    assert noise.var().item() == pytest.approx(var * gamma**2, rel=0.03)
    if dist == "uniform":
        assert noise.abs().max().item() <= gamma
    if dist == "laplace":
        assert noise.abs().mean().item() == pytest.approx(gamma, rel=0.02)


def test_embnoise_trains_head_on_noisy_embeddings_and_keeps_bn_local() -> None:
    alg = make("embnoise", distribution="uniform", gamma=0.2)
    server = alg.init_server()
    assert not BN & set(server["global"])
    torch.manual_seed(0)
    out, state = alg.fit(alg.broadcast(server, 1, 0), {}, ctx())
    assert not BN & set(out.arrays) and set(state["local"]) == BN
    model = tiny_model(in_dim=4, feat_dim=3, num_classes=2)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 0, 1])
    torch.manual_seed(1)
    loss = alg.loss(model, x, y, ctx())
    u = model.features(x)
    torch.manual_seed(1)
    noise = sample_noise(u.shape, "uniform", 0.2)
    want = torch.nn.functional.cross_entropy(model.head(u), y) + torch.nn.functional.cross_entropy(
        model.head(u + noise), y)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert make("embnoise", local_bn=False).personalized is False


@pytest.mark.parametrize("method", ["fraug", "embnoise"])
def test_learns_on_the_offline_default_benchmark(tmp_path, method: str) -> None:
    """A short FRAug run on the built-in real digits (4 style domains, 10 classes) beats chance (10%) widely."""
    from fedhet.config import load_config
    from fedhet.engine.loop import run_experiment

    cfg = load_config(None, ["data.dataset=offline_digits", "model.name=small_cnn", "rounds=8", "train.local_epochs=1",
                             "train.batch_size=32", "train.lr=0.01", "train.momentum=0.5", "data.augment=false",
                             "server.aggregation=uniform", f"method={method}"])
    avg = run_experiment(cfg, tmp_path / method, progress=False).final["avg"]["accuracy"]
    assert avg > 0.4, f"{method}: average accuracy {avg:.3f} after 8 rounds is not far above chance (0.1)"

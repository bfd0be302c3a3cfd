"""Client-level DP (core/dp.py) by hand: clipping, the noise's std, what is noised, adaptive clipping, Flower's
formulas; the accountant against dp-accounting itself."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.config.privacy import AdaptiveClipConfig, DPConfig
from fedhet.core.contract import ServerState
from fedhet.core.dp import CLIP, STEPS, clip_update, model_noise_multiplier, next_clip, privatize
from fedhet.core.dp_accountant import PrivacyLedger, epsilon
from fedhet.core.messages import Message, Reply
from fedhet.core.seeding import torch_generator
from fedhet.errors import ConfigError

dp_accounting = pytest.importorskip("dp_accounting")


def dp(**kw: object) -> DPConfig:
    cfg = DPConfig(**{"mode": "server", **kw})  # type: ignore[arg-type]
    cfg.validate()
    return cfg


def reply(cid: int, **arrays: list[float]) -> Reply:
    return Reply(cid, Message({k: torch.tensor(v) for k, v in arrays.items()}), num_examples=10 * (cid + 1))


def test_clipping_by_hand() -> None:
    clipped, within = clip_update({"a": torch.tensor([3.0]).double(), "b": torch.tensor([0.0, 4.0]).double()}, 1.0)
    assert not within and torch.allclose(clipped["a"], torch.tensor([0.6], dtype=torch.float64))
    assert torch.allclose(clipped["b"], torch.tensor([0.0, 0.8], dtype=torch.float64))  # one norm over all keys
    same, within = clip_update({"a": torch.tensor([0.3, 0.4])}, 1.0)
    assert within and torch.equal(same["a"], torch.tensor([0.3, 0.4]))


def test_the_update_is_clipped_not_the_state() -> None:
    """Global (10, 0), client (13, 4): the update (3, 4) has norm 5 and is clipped to (0.6, 0.8) around the global
    model; the reply is reweighted to 1 (equal weights under DP)."""
    server = ServerState(model={"w": torch.tensor([10.0, 0.0])})
    out, state = privatize(dp(clip=1.0, noise_multiplier=1e-9), server, [reply(0, w=[13.0, 4.0])], 0, 1)
    assert torch.allclose(out[0].message.arrays["w"], torch.tensor([10.6, 0.8]), atol=1e-6)
    assert out[0].num_examples == 1 and state[STEPS] == 1 and float(state[CLIP]) == 1.0


def test_server_noise_std_is_sigma_c_over_m() -> None:
    """Four clients with a zero update: every reply carries the same noise, of std sigma * C / m."""
    n, m, sigma, clip = 20_000, 4, 2.0, 0.5
    server = ServerState(model={"w": torch.zeros(n)})
    out, _ = privatize(dp(clip=clip, noise_multiplier=sigma), server, [reply(c, w=[0.0] * n) for c in range(m)], 3, 7)
    noise = out[0].message.arrays["w"].double()
    assert all(torch.equal(r.message.arrays["w"], out[0].message.arrays["w"]) for r in out)
    assert float(noise.std()) == pytest.approx(sigma * clip / m, rel=0.03)
    assert abs(float(noise.mean())) < 4 * sigma * clip / m / math.sqrt(n)
    again, _ = privatize(dp(clip=clip, noise_multiplier=sigma), server, [reply(c, w=[0.0] * n) for c in range(m)], 3, 7)
    assert torch.equal(again[0].message.arrays["w"], out[0].message.arrays["w"])  # the (seed, round) stream


def test_local_noise_is_each_clients_own_of_std_sigma_c() -> None:
    n, sigma, clip = 20_000, 1.5, 0.4
    server = ServerState(model={"w": torch.zeros(n)})
    out, _ = privatize(dp(mode="local", clip=clip, noise_multiplier=sigma), server,
                       [reply(c, w=[0.0] * n) for c in range(3)], 0, 1)
    assert not torch.equal(out[0].message.arrays["w"], out[1].message.arrays["w"])
    for r in out:
        assert float(r.message.arrays["w"].double().std()) == pytest.approx(sigma * clip, rel=0.03)


@pytest.mark.parametrize("mode", ["server", "local"])
def test_only_the_shared_floating_keys_are_touched(mode: str) -> None:
    """A reply's arrays outside the global model (what the server does not average) and integer counters pass
    through as sent (local mode: the client's own step, core.dp.local_message, the same)."""
    server = ServerState(model={"w": torch.zeros(3), "count": torch.tensor(5)})
    sent = Reply(0, Message({"w": torch.zeros(3), "count": torch.tensor(7), "bn.weight": torch.ones(3)}), 4)
    out, _ = privatize(dp(mode=mode, noise_multiplier=1.0), server, [sent], 0, 1)
    assert torch.equal(out[0].message.arrays["bn.weight"], torch.ones(3))
    assert torch.equal(out[0].message.arrays["count"], torch.tensor(7))
    assert not torch.equal(out[0].message.arrays["w"], torch.zeros(3))


def test_adaptive_clip_moves_towards_the_quantile() -> None:
    """All updates within C, gamma 0.5, lr 0.2, count noise ~0: C * exp(-0.2 * (1 - 0.5))."""
    cfg = dp(adaptive=AdaptiveClipConfig(enabled=True, target_quantile=0.5, lr=0.2, count_noise_std=1e-12))
    assert next_clip(cfg, 2.0, 4, 4, torch_generator(0, 1)) == pytest.approx(2.0 * math.exp(-0.1))
    assert next_clip(cfg, 2.0, 0, 4, torch_generator(0, 1)) == pytest.approx(2.0 * math.exp(0.1))


def test_equal_to_flowers_formulas() -> None:
    flower = pytest.importorskip("flwr.supercore.differential_privacy")
    assert flower.compute_stdv(1.3, 0.7, 5) == pytest.approx(1.3 * 0.7 / 5)
    cfg = dp(noise_multiplier=0.8, adaptive=AdaptiveClipConfig(enabled=True))
    _, theirs = flower.compute_adaptive_noise_params(0.8, 40, None)
    assert model_noise_multiplier(cfg, 40) == pytest.approx(theirs)
    with pytest.raises(ConfigError, match="count_noise_std"):
        model_noise_multiplier(cfg, 8)  # sigma_b = 0.4: z must be < 0.8


@pytest.mark.parametrize(("accountant", "q", "sigma", "steps"), [("rdp", 0.1, 1.1, 50), ("rdp", 0.4, 2.0, 7),
                                                                   ("rdp", 1.0, 3.0, 10), ("pld", 0.3, 2.0, 4)])
def test_epsilon_equals_dp_accounting(accountant: str, q: float, sigma: float, steps: int) -> None:
    from dp_accounting import dp_event, pld, rdp

    event = dp_event.GaussianDpEvent(sigma)
    acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, event) if q < 1 else event, steps)
    assert epsilon(q, sigma, steps, 1e-5, accountant) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize(("m", "n", "sigma", "steps"), [(10, 100, 1.1, 50), (4, 10, 2.0, 7)])
def test_epsilon_equals_flowers_rdp_accountant(m: int, n: int, sigma: float, steps: int) -> None:
    """The same (q = m / N, sigma, T) in Flower's own accountant (Poisson sampling, add-or-remove-one)."""
    pa = pytest.importorskip("flwr.supercore.privacy_accounting")
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    config = pa.PrivacyConfig(target_delta=1e-5, population_size=n,
                              neighboring_relation=pa.NeighboringRelation.ADD_OR_REMOVE_ONE,
                              sampling_method=pa.SamplingMethod.POISSON)
    flower = RdpAccountant(config)
    flower.compose(pa.GaussianPrivacyEvent(noise_multiplier=sigma, sample_size=m, population_size=n), steps)
    assert epsilon(m / n, sigma, steps, 1e-5) == pytest.approx(flower.get_epsilon(1e-5), rel=1e-6)


def test_ledger_samples_at_rate_m_over_n_and_refuses_before_the_round() -> None:
    cfg = dp(noise_multiplier=1.0, delta=0.01, max_epsilon=2.6)
    ledger = PrivacyLedger.for_run(cfg, 5, 2)
    assert ledger.q == pytest.approx(0.4)
    assert ledger.refusal(1) is None  # epsilon(2 rounds) = 2.33
    assert "round 3" in str(ledger.refusal(2))  # epsilon(3 rounds) = 2.84 > 2.6
    assert PrivacyLedger.for_run(dp(mode="local", delta=0.01), 5, 2).q == 1.0


@pytest.mark.parametrize(("kw", "match"), [({"noise_multiplier": 0.0}, "noise_multiplier"),
                                           ({"noise_multiplier": -1.0}, "noise_multiplier"),
                                           ({"clip": 0.0}, "clip"), ({"clip": -2.0}, "clip"),
                                           ({"delta": 1.0}, "delta"), ({"accountant": "moments"}, "accountant")])
def test_bad_values_are_one_clear_error(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        dp(**kw)


def test_delta_must_be_below_one_over_n() -> None:
    with pytest.raises(ConfigError, match="1/N = 1/10"):
        PrivacyLedger.for_run(dp(delta=0.1), 10, 10)
    PrivacyLedger.for_run(dp(delta=0.099), 10, 10)


def test_a_missing_dp_accounting_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install fedhet\[privacy\]"):
        epsilon.__wrapped__(0.5, 1.0, 3, 1e-5, "rdp")

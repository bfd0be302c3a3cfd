"""The AdaptFED server hypernetwork h(phi; z_i) and its VJP update (spec §2.2, §2.4, §2.6), on tiny sizes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from fedhet.errors import ConfigError, FedhetError, TrainingDivergedError
from fedhet.models.hypernet import HyperNetwork, HyperNetworkError, hypernet_param_count
from fedhet.models.hypernet_update import ClientUpdate, HyperNetworkUpdater, HyperUpdateConfig

TARGETS = {"blocks.0.mod.f.weight": (3, 4), "blocks.0.mod.f.bias": (3,), "blocks.1.mod.h.weight": (4, 2, 1, 1)}
VARIANTS = {"full": {}, "low_rank": {"rank": 2}, "task_aware": {"descriptor_dim": 3, "task_dim": 2}}


def make(seed: int = 0, **kwargs: object) -> HyperNetwork:
    torch.manual_seed(seed)
    hnet = HyperNetwork(TARGETS, 4, embedding_dim=3, hidden_dim=5, **kwargs).double()  # type: ignore[arg-type]
    if hnet.descriptor_dim is not None:
        hnet.set_descriptors(torch.rand(4, hnet.descriptor_dim, dtype=torch.float64))
    return hnet


def plain(**switches: str | bool | float) -> HyperUpdateConfig:
    """Plain SGD (no momentum, no weight decay), lr 0.1, so one step is exactly -lr * gradient."""
    return HyperUpdateConfig(lr=0.1, momentum=0.0, weight_decay=0.0, **switches)  # type: ignore[arg-type]


def change(seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in TARGETS.items()}


def snapshot(hnet: HyperNetwork) -> list[Tensor]:
    return [p.detach().clone() for p in [*hnet.phi_parameters(), hnet.embeddings.weight]]


def finite_difference(f: Callable[[], Tensor], params: list[Tensor], eps: float = 1e-6) -> list[Tensor]:
    """Central differences of the scalar f() with respect to every element of `params`."""
    grads = []
    with torch.no_grad():
        for p in params:
            g = torch.zeros_like(p)
            for k in range(p.numel()):
                old = p.view(-1)[k].item()
                p.view(-1)[k] = old + eps
                up = f()
                p.view(-1)[k] = old - eps
                down = f()
                p.view(-1)[k] = old
                g.view(-1)[k] = (up - down) / (2 * eps)
            grads.append(g)
    return grads


@pytest.mark.parametrize("variant", VARIANTS)
def test_vjp_step_equals_finite_difference_sgd_step(variant: str) -> None:
    """phi, z_i <- phi, z_i - lr d/d(phi, z) <h(phi; z_i), P_init - P_final>: fails on a flipped sign."""
    hnet, i, delta = make(**VARIANTS[variant]), 2, change(1)

    def inner() -> Tensor:  # <P_i, Delta> with the pFedHN Delta = P_init - P_final = -change
        return sum(((hnet(i)[n] * -delta[n]).sum() for n in TARGETS), torch.zeros((), dtype=torch.float64))

    expected = [p - 0.1 * g for p, g in zip(snapshot(hnet), finite_difference(inner, [
        *hnet.phi_parameters(), hnet.embeddings.weight]), strict=True)]
    HyperNetworkUpdater(hnet, plain()).step([ClientUpdate(i, 7, delta)])
    for got, want in zip(snapshot(hnet), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def test_pfedhn_sign_moves_p_toward_the_local_result_and_paper_sign_away() -> None:
    sent = {n: t.detach() for n, t in make()(0).items()}
    returned = {n: t + 0.1 * change(3)[n] for n, t in sent.items()}
    distance = {}
    for sign in ("pfedhn", "paper"):
        hnet = make()
        HyperNetworkUpdater(hnet, HyperUpdateConfig(sign=sign, lr=0.01)).step(
            [ClientUpdate.from_params(0, 5, sent, returned)])
        distance[sign] = math.sqrt(sum(float(((hnet(0)[n].detach() - returned[n]) ** 2).sum()) for n in TARGETS))
    before = math.sqrt(sum(float(((sent[n] - returned[n]) ** 2).sum()) for n in TARGETS))
    assert distance["pfedhn"] < before < distance["paper"]


def test_paper_sign_is_the_exact_opposite_step() -> None:
    moves = {}
    for sign in ("pfedhn", "paper"):
        hnet = make()
        before = snapshot(hnet)
        HyperNetworkUpdater(hnet, plain(sign=sign)).step([ClientUpdate(1, 3, change(2))])
        moves[sign] = [a - b for a, b in zip(snapshot(hnet), before, strict=True)]
    assert any(float(m.abs().max()) > 1e-4 for m in moves["pfedhn"])
    for a, b in zip(moves["pfedhn"], moves["paper"], strict=True):
        torch.testing.assert_close(a, -b)


@pytest.mark.parametrize("aggregation", ["sum", "sequential"])
def test_only_the_participants_own_embedding_rows_move(aggregation: str) -> None:
    """Default optimizer (momentum, weight decay), rows update: absent rows never move, z_1 ignores client 2."""
    rows = []
    for other in (5, 6):
        hnet = make()
        updater = HyperNetworkUpdater(hnet, HyperUpdateConfig(aggregation=aggregation))
        start = hnet.embeddings.weight.detach().clone()
        updater.step([ClientUpdate(1, 4, change(4)), ClientUpdate(2, 4, change(other))])
        after_first = hnet.embeddings.weight.detach().clone()
        updater.step([ClientUpdate(1, 4, change(7))])  # client 2's momentum must not carry it on
        table = hnet.embeddings.weight.detach()
        assert torch.equal(table[[0, 3]], start[[0, 3]]) and torch.equal(table[2], after_first[2])
        assert not torch.equal(after_first[1], start[1]) and not torch.equal(after_first[2], start[2])
        rows.append(after_first[1])
    torch.testing.assert_close(rows[0], rows[1], rtol=0, atol=0)


def test_dense_embedding_update_decays_absent_rows_like_fedtp() -> None:
    hnet = make()
    start = hnet.embeddings.weight.detach().clone()
    HyperNetworkUpdater(hnet, HyperUpdateConfig(embedding_update="dense")).step([ClientUpdate(1, 4, change(4))])
    torch.testing.assert_close(hnet.embeddings.weight.detach()[0], start[0] * (1 - 0.01 * 1e-3))


@pytest.mark.parametrize("weighting,weight_embedding,w", [("sample_fraction", True, (0.75, 0.25)),
                                                          ("uniform", True, (0.5, 0.5)),
                                                          ("sample_fraction", False, (0.75, 0.25))])
def test_weighting_scales_each_clients_step(weighting: str, weight_embedding: bool, w: tuple[float, float]) -> None:
    hnet = make()
    updates = [ClientUpdate(0, 3, change(8)), ClientUpdate(3, 1, change(9))]
    updater = HyperNetworkUpdater(hnet, plain(weighting=weighting, weight_embedding=weight_embedding))
    (ga, za), (gb, zb) = (updater.client_gradients(u) for u in updates)
    before = snapshot(hnet)
    updater.step(updates)
    for p, old, a, b in zip(hnet.phi_parameters(), before[:-1], ga, gb, strict=True):
        torch.testing.assert_close(p.detach(), old - 0.1 * (w[0] * a + w[1] * b))
    zw = w if weight_embedding else (1.0, 1.0)
    torch.testing.assert_close(hnet.embeddings.weight.detach()[0], before[-1][0] - 0.1 * zw[0] * za)
    torch.testing.assert_close(hnet.embeddings.weight.detach()[3], before[-1][3] - 0.1 * zw[1] * zb)


def test_sequential_takes_one_unit_step_per_client_under_uniform_weights() -> None:
    moves = {}
    for aggregation in ("sum", "sequential"):
        hnet = make()
        before = snapshot(hnet)
        HyperNetworkUpdater(hnet, plain(aggregation=aggregation, weighting="uniform")).step(
            [ClientUpdate(0, 3, change(8)), ClientUpdate(3, 1, change(9))])
        moves[aggregation] = [a - b for a, b in zip(snapshot(hnet)[:-1], before[:-1], strict=True)]
    for seq, one in zip(moves["sequential"], moves["sum"], strict=True):
        torch.testing.assert_close(seq, 2 * one)


@pytest.mark.parametrize("variant,left", [("full", 0.05), ("low_rank", 0.5)])  # rank 2 cannot fit 4 random P*_i
def test_rounds_fit_each_clients_local_result(variant: str, left: float) -> None:
    """Local training that always heads for the client's own P*_i: default-config rounds pull h(phi; z_i) there."""
    hnet = make(**VARIANTS[variant])
    updater, targets = HyperNetworkUpdater(hnet), [change(20 + i) for i in range(4)]

    def gap() -> float:
        return sum(float(((hnet(i)[n].detach() - targets[i][n]) ** 2).sum()) for i in range(4) for n in TARGETS)

    start = gap()
    for r in range(200):
        sent = [{n: t.detach() for n, t in hnet(i).items()} for i in (r % 4, (r + 1) % 4)]
        updater.step([ClientUpdate.from_params(i, 1 + i, p, {n: p[n] + 0.5 * (targets[i][n] - p[n]) for n in p})
                      for i, p in zip((r % 4, (r + 1) % 4), sent, strict=True)])
    assert gap() < left * start


def test_state_dict_resumes_the_momentum_exactly() -> None:
    first, second = make(), make()
    a, b = HyperNetworkUpdater(first), HyperNetworkUpdater(second)
    a.step([ClientUpdate(1, 2, change(1))])
    b.step([ClientUpdate(1, 2, change(1))])
    resumed = make()
    resumed.load_state_dict(second.state_dict())
    c = HyperNetworkUpdater(resumed)
    c.load_state_dict(b.state_dict())
    a.step([ClientUpdate(1, 2, change(2))])
    c.step([ClientUpdate(1, 2, change(2))])
    for x, y in zip(snapshot(first), snapshot(resumed), strict=True):
        assert torch.equal(x, y)


def test_max_grad_norm_caps_the_step() -> None:
    hnet = make()
    before = snapshot(hnet)
    HyperNetworkUpdater(hnet, plain(max_grad_norm=1e-3)).step([ClientUpdate(1, 2, change(1))])
    moved = [float(((a - b) ** 2).sum()) for a, b in zip(snapshot(hnet), before, strict=True)]
    assert math.sqrt(sum(moved[:-1])) == pytest.approx(0.1 * 1e-3, rel=1e-3)  # phi, clipped jointly
    assert math.sqrt(moved[-1]) == pytest.approx(0.1 * 1e-3, rel=1e-3)  # z_1's row, clipped alone


@pytest.mark.parametrize("variant", VARIANTS)
def test_generated_shapes_match_targets_with_one_head_per_block(variant: str) -> None:
    hnet = make(**VARIANTS[variant])
    descriptor = torch.rand(3, dtype=torch.float64) if variant == "task_aware" else None
    for p in (hnet(3), hnet.generate_from_embedding(torch.zeros(3, dtype=torch.float64), descriptor)):
        assert list(p) == list(TARGETS) and {n: tuple(t.shape) for n, t in p.items()} == TARGETS
    assert list(hnet.head_names) == ["blocks.0.mod", "blocks.1.mod"] and len(hnet.heads) == 2


def test_task_aware_descriptor_changes_the_generated_parameters() -> None:
    hnet = make(**VARIANTS["task_aware"])
    z = hnet.embeddings.weight[0].detach()
    a = hnet.generate_from_embedding(z, torch.tensor([1.0, 0, 0], dtype=torch.float64))
    b = hnet.generate_from_embedding(z, torch.tensor([0, 0, 1.0], dtype=torch.float64))
    assert not torch.allclose(a["blocks.0.mod.f.weight"], b["blocks.0.mod.f.weight"])


def test_parameter_counts_of_the_full_and_low_rank_variants() -> None:
    full, low = make(), make(rank=1)
    trunk = (3 * 5 + 5) + (5 * 5 + 5)
    head_full = 6 * (12 + 3) + 6 * 8  # (hidden + 1) x emitted numbers, per block
    head_low = 6 * (1 * (3 + 4) + 3) + 6 * (1 * (4 + 2))
    assert hypernet_param_count(full) == {"embedding": 12, "trunk": trunk, "heads": head_full, "bases": 0,
                                          "descriptor_net": 0, "phi": trunk + head_full,
                                          "total": trunk + head_full + 12, "generated": 23, "emitted": 23,
                                          "vanilla": 92}
    counts = hypernet_param_count(low)
    assert (counts["heads"], counts["bases"], counts["emitted"]) == (head_low, 12 + 8, 7 + 3 + 6)
    assert counts["total"] == sum(p.numel() for p in low.parameters())


def test_init_values_set_the_starting_point() -> None:
    values = {n: torch.full(s, 0.5, dtype=torch.float64) for n, s in TARGETS.items()}
    low = make(rank=1, init_values=values)
    assert torch.equal(low.bases[0].detach(), values["blocks.0.mod.f.weight"])
    full = make(init_values=values)
    head = full.heads[1]
    assert isinstance(head, torch.nn.Linear)
    assert torch.equal(head.bias.detach(), torch.full((8,), 0.5, dtype=torch.float64))
    with pytest.raises(ConfigError, match="not targets"):
        make(init_values={"nope": torch.zeros(1)})


def test_update_after_phi_moved_is_refused() -> None:
    hnet = make()
    sent = {n: t.detach() for n, t in hnet(1).items()}
    update = ClientUpdate.from_params(1, 2, sent, {n: t + 1 for n, t in sent.items()})
    updater = HyperNetworkUpdater(hnet)
    updater.step([update])
    with pytest.raises(HyperNetworkError, match="no longer h"):
        updater.step([update])


@pytest.mark.parametrize("bad,error,match", [
    ({"client_id": 4}, HyperNetworkError, "unknown client id 4"),
    ({"change": {**change(0), "blocks.0.mod.f.bias": torch.zeros(4)}}, HyperNetworkError, r"expected \(3,\)"),
    ({"change": {n: t for n, t in change(0).items() if "bias" not in n}}, HyperNetworkError, "missing"),
    ({"change": {**change(0), "blocks.0.mod.f.bias": torch.full((3,), math.nan)}}, TrainingDivergedError, "finite"),
    ({"num_samples": 0}, HyperNetworkError, "num_samples"),
])
def test_bad_updates_raise_one_clear_error(bad: dict[str, object], error: type[FedhetError], match: str) -> None:
    fields: dict[str, object] = {"client_id": 0, "num_samples": 1, "change": change(0), **bad}
    with pytest.raises(error, match=match):
        HyperNetworkUpdater(make()).step([ClientUpdate(**fields)])  # type: ignore[arg-type]


def test_bad_configs_and_inputs_raise_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="did you mean 'paper'"):
        HyperUpdateConfig(sign="papr")
    with pytest.raises(ConfigError, match="weighting 'samples'"):
        HyperUpdateConfig(weighting="samples")
    with pytest.raises(ConfigError, match="rank must be"):
        HyperNetwork(TARGETS, 4, rank=0)
    with pytest.raises(ConfigError, match="missing"):
        HyperNetwork(TARGETS, 4, heads={"a": ["blocks.0.mod.f.weight"]})
    with pytest.raises(HyperNetworkError, match="each participating client once"):
        HyperNetworkUpdater(make()).step([ClientUpdate(0, 1, change(0)), ClientUpdate(0, 1, change(1))])
    with pytest.raises(HyperNetworkError, match="unknown client id"):
        make()(-1)
    with pytest.raises(HyperNetworkError, match="expected \\(3,\\)"):
        make().generate_from_embedding(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(HyperNetworkError, match="task-aware"):
        make().set_descriptors(torch.zeros(4, 3))

"""The membership report: an overfit model leaks, a model that never saw the members does not, and a broken
attack (members and non-members swapped, or the loss read the wrong way round) is caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedhet.errors import FedhetError
from fedhet.privacy.attacks import auc
from fedhet.privacy.membership import average_reports, evaluate_membership, membership_report, pooled_report

CPU = torch.device("cpu")


def random_set(seed: int, n: int = 48) -> TensorDataset:
    """Random inputs with random labels: a model can only do well on them by memorizing them."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))


def trained_on(data: TensorDataset, seed: int = 0) -> nn.Module:
    """A small MLP trained to (near) zero loss on `data`, full batch."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = data.tensors
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def sets() -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    return random_set(1), random_set(2), random_set(3)  # members, non-members, a third set


def test_overfit_model_leaks_and_unseen_model_does_not(sets: tuple[TensorDataset, ...]) -> None:
    members, nonmembers, other = sets
    leaky, _, _ = evaluate_membership(trained_on(members), members, nonmembers, CPU)
    blind, _, _ = evaluate_membership(trained_on(other), members, nonmembers, CPU)  # never saw the members
    assert leaky["num_members"] == 48 and leaky["num_nonmembers"] == 48
    assert leaky["loss"]["member_mean"] < 0.05
    assert leaky["loss"]["gap"] > 2.0 and leaky["entropy"]["gap"] > 0.2
    assert leaky["loss"]["attack_accuracy"] > 0.9 and leaky["loss"]["auc"] > 0.95
    assert leaky["confidence"]["auc"] > 0.95 and leaky["modified_entropy"]["attack_accuracy"] > 0.9
    assert abs(blind["loss"]["gap"]) < 0.2 * leaky["loss"]["gap"]
    assert abs(blind["entropy"]["gap"]) < 0.5 * leaky["entropy"]["gap"]
    assert 0.3 < blind["loss"]["auc"] < 0.7
    assert blind["loss"]["advantage"] < 0.5 * leaky["loss"]["advantage"]


def test_broken_variants_fail(sets: tuple[TensorDataset, ...]) -> None:
    members, nonmembers, _ = sets
    model = trained_on(members)
    swapped, m, u = evaluate_membership(model, nonmembers, members, CPU)  # members and non-members swapped
    assert swapped["loss"]["gap"] < -2.0 and swapped["loss"]["auc"] < 0.05
    assert swapped["loss"]["attack_accuracy"] < 0.6  # the one-sided attack finds (almost) nothing
    _, m, u = evaluate_membership(model, members, nonmembers, CPU)
    assert auc(m["loss"], u["loss"], lower_is_member=False) < 0.05  # the loss read as "higher = member"


def test_average_and_pooled_by_hand() -> None:
    a = membership_report({"loss": np.array([0.0, 0.2])}, {"loss": np.array([1.0, 1.0])})
    b = membership_report({"loss": np.array([1.0])}, {"loss": np.array([0.0, 2.0, 4.0])})
    assert a["loss"]["gap"] == pytest.approx(0.9) and b["loss"]["gap"] == pytest.approx(1.0)
    avg = average_reports([a, b])
    assert (avg["num_members"], avg["num_nonmembers"]) == (3, 5)
    assert avg["loss"]["gap"] == pytest.approx(0.95)
    assert avg["loss"]["auc"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert "threshold" not in avg["loss"] and "entropy" not in avg
    pooled = pooled_report([{"loss": np.array([0.0, 0.2])}, {"loss": np.array([1.0])}],
                           [{"loss": np.array([1.0, 1.0])}, {"loss": np.array([0.0, 2.0, 4.0])}])
    assert pooled["loss"]["gap"] == pytest.approx(8.0 / 5 - 1.2 / 3)
    assert pooled["loss"]["member_mean"] == pytest.approx(0.4)


def test_empty_datasets_are_one_error(sets: tuple[TensorDataset, ...]) -> None:
    empty = TensorDataset(torch.zeros(0, 16), torch.zeros(0, dtype=torch.long))
    with pytest.raises(FedhetError, match="non-members dataset is empty"):
        evaluate_membership(nn.Linear(16, 4), sets[0], empty, CPU)
    with pytest.raises(FedhetError, match="no client"):
        average_reports([])

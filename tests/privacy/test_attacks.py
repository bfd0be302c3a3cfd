"""Threshold attacks by hand on known score lists, and against brute force / scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fedhet.errors import FedhetError
from fedhet.privacy.attacks import accuracy_at, auc, best_threshold, gap

MEMBERS = np.array([0.1, 0.2, 0.3, 0.9])  # losses: lower = member
NONMEMBERS = np.array([0.4, 0.5, 0.25, 1.0])


def test_by_hand() -> None:
    # thresholds (member if loss <= t): t=0.2 -> TPR 2/4, FPR 0; t=0.3 -> 3/4, 1/4; t=0.9 -> 1, 3/4; t=0.1 -> 1/4, 0
    attack = best_threshold(MEMBERS, NONMEMBERS)
    assert attack.advantage == pytest.approx(0.5)
    assert attack.accuracy == pytest.approx(0.75)
    assert attack.threshold == 0.2  # ties with 0.3: the strictest threshold wins
    assert (attack.tpr, attack.fpr) == (0.5, 0.0)
    # pairs (member, non-member) with member < non-member: 4 + 4 + 3 + 1 = 12 of 16
    assert auc(MEMBERS, NONMEMBERS) == pytest.approx(0.75)
    assert gap(MEMBERS, NONMEMBERS) == pytest.approx((0.4 + 0.5 + 0.25 + 1.0 - 0.1 - 0.2 - 0.3 - 0.9) / 4)
    # Yeom's threshold, the members' mean 0.375: TPR 3/4, TNR 3/4
    assert accuracy_at(MEMBERS, NONMEMBERS, 0.375) == pytest.approx(0.75)


def test_balanced_by_weighting_not_by_count() -> None:
    """2 members, 6 non-members: the best threshold (0) finds half the members and no non-member, so the
    balanced accuracy is (1/2 + 1) / 2 = 0.75, not the plain accuracy 7/8."""
    attack = best_threshold(np.array([0.0, 5.0]), np.array([1.0, 2.0, 3.0, 4.0, 6.0, 7.0]))
    assert (attack.accuracy, attack.advantage, attack.threshold) == (0.75, 0.5, 0.0)


def test_higher_is_member_mirrors_lower() -> None:
    a, b = best_threshold(MEMBERS, NONMEMBERS), best_threshold(-MEMBERS, -NONMEMBERS, lower_is_member=False)
    assert (a.accuracy, a.advantage, a.tpr, a.fpr) == (b.accuracy, b.advantage, b.tpr, b.fpr)
    assert b.threshold == -0.2
    assert auc(-MEMBERS, -NONMEMBERS, lower_is_member=False) == auc(MEMBERS, NONMEMBERS)
    assert gap(-MEMBERS, -NONMEMBERS, lower_is_member=False) == pytest.approx(gap(MEMBERS, NONMEMBERS))
    assert accuracy_at(-MEMBERS, -NONMEMBERS, -0.375, lower_is_member=False) == pytest.approx(0.75)


def test_no_signal_and_perfect_signal() -> None:
    tie = best_threshold(np.ones(3), np.ones(5))
    assert (tie.accuracy, tie.advantage, tie.threshold) == (0.5, 0.0, None)
    assert auc(np.ones(3), np.ones(5)) == 0.5
    perfect = best_threshold(np.array([0.0, 0.1]), np.array([1.0, 2.0, 3.0]))
    assert (perfect.accuracy, perfect.advantage, perfect.threshold) == (1.0, 1.0, 0.1)
    assert auc(np.array([0.0, 0.1]), np.array([1.0, 2.0, 3.0])) == 1.0


def test_swapped_sets_are_caught() -> None:
    """Members and non-members swapped: the gap changes sign, the AUC becomes 1 - AUC, the attack is weaker."""
    assert gap(NONMEMBERS, MEMBERS) == pytest.approx(-gap(MEMBERS, NONMEMBERS))
    assert auc(NONMEMBERS, MEMBERS) == pytest.approx(1 - auc(MEMBERS, NONMEMBERS))
    assert best_threshold(NONMEMBERS, MEMBERS).advantage < best_threshold(MEMBERS, NONMEMBERS).advantage


@pytest.mark.parametrize("seed", range(5))
def test_against_brute_force_and_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = np.round(rng.normal(0.0, 1.0, 30), 1)  # rounded: many ties
    u = np.round(rng.normal(0.5, 1.0, 45), 1)
    labels = np.r_[np.ones(m.size), np.zeros(u.size)]
    assert auc(m, u) == pytest.approx(roc_auc_score(labels, -np.r_[m, u]))
    brute = max(((m <= t).mean() - (u <= t).mean(), t) for t in np.unique(np.r_[m, u]))
    attack = best_threshold(m, u)
    assert attack.advantage == pytest.approx(max(brute[0], 0.0))
    assert accuracy_at(m, u, attack.threshold) == pytest.approx(attack.accuracy)  # type: ignore[arg-type]


@pytest.mark.parametrize("members, nonmembers", [([], [1.0]), ([1.0], []), ([np.nan], [1.0]), ([1.0], [np.inf])])
def test_bad_scores_are_one_error(members: list[float], nonmembers: list[float]) -> None:
    for fn in (gap, auc, best_threshold):
        with pytest.raises(FedhetError, match="members|not finite"):
            fn(np.array(members), np.array(nonmembers))

"""Threshold membership-inference attacks on two lists of per-sample scores: members and non-members.

Every function takes the members' scores, the non-members' scores and `lower_is_member` (True for loss and
entropy: a member is predicted when its score is <= a threshold; False for confidence: when it is >=).

- `gap`: FedBiP's Table 4 metric (spec §2.7 (iii)): the difference between the average score of non-members and
  of members, signed so that a positive gap means members look more like members (lower loss, lower entropy,
  higher confidence). The paper prints positive numbers for "the difference between the two averages", which
  for loss and entropy is mean(non-members) - mean(members). 0: no leak by this measure; negative: the model
  fits the non-members better.
- `best_threshold`: the attack with the best threshold, chosen on the same scores (an upper bound on what a
  threshold attacker achieves, as Song & Mittal 2021 report it when they set thresholds on known data). Its
  accuracy is *balanced*: (TPR + TNR) / 2, i.e. the accuracy on a set with as many members as non-members,
  each side weighted 1/2 whatever its size (deterministic, no sample thrown away, the same as subsampling
  the larger side in expectation). Its advantage is Yeom et al. 2018's membership advantage TPR - FPR =
  2 x accuracy - 1; it is >= 0 since predicting "non-member" for everything is one of the thresholds.
- `accuracy_at`: the balanced accuracy at a given threshold; Yeom et al. 2018's loss attack uses the average
  training loss as its threshold (`membership.py` reports it as `mean_threshold_accuracy`).
- `auc`: the area under the ROC curve of the score as a membership predictor, P(member scores as more
  member-like than non-member) with ties counted 1/2 (the Mann-Whitney statistic); 0.5 is guessing, below 0.5
  means the non-members look more like members.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from fedhet.errors import FedhetError


@dataclass(frozen=True)
class ThresholdAttack:
    """The best threshold attack: balanced accuracy, advantage (TPR - FPR), its threshold in the score's own
    units (None when no threshold beats guessing), and its true and false positive rates."""

    accuracy: float
    advantage: float
    threshold: float | None
    tpr: float
    fpr: float


def _arrays(members: np.ndarray, nonmembers: np.ndarray, lower_is_member: bool) -> tuple[np.ndarray, np.ndarray]:
    """Both lists as float64 'membership' scores, higher = more member-like; empty or non-finite lists refused."""
    m, u = np.asarray(members, dtype=np.float64), np.asarray(nonmembers, dtype=np.float64)
    if m.size == 0 or u.size == 0:
        raise FedhetError(f"a membership attack needs members and non-members, got {m.size} members and {u.size} "
                          "non-members: give both splits some samples")
    if not (np.isfinite(m).all() and np.isfinite(u).all()):
        raise FedhetError("a membership score is NaN or infinite: the model's outputs are not finite (a diverged "
                          "run?); evaluate a checkpoint whose loss is finite")
    return (-m, -u) if lower_is_member else (m, u)


def gap(members: np.ndarray, nonmembers: np.ndarray, lower_is_member: bool = True) -> float:
    """mean(non-members) - mean(members) when `lower_is_member`, else mean(members) - mean(non-members)."""
    m, u = _arrays(members, nonmembers, lower_is_member)
    return float(m.mean() - u.mean())


def best_threshold(members: np.ndarray, nonmembers: np.ndarray, lower_is_member: bool = True) -> ThresholdAttack:
    """The threshold with the largest TPR - FPR over every distinct score value (module docstring); among equal
    advantages the strictest threshold (the fewest predicted members) wins."""
    m, u = _arrays(members, nonmembers, lower_is_member)
    candidates = np.concatenate([[np.inf], np.unique(np.concatenate([m, u]))[::-1]])  # strictest first
    m_sorted, u_sorted = np.sort(m), np.sort(u)
    tpr = (m.size - np.searchsorted(m_sorted, candidates, side="left")) / m.size  # share of members >= t
    fpr = (u.size - np.searchsorted(u_sorted, candidates, side="left")) / u.size
    best = int(np.argmax(tpr - fpr))
    advantage = float(tpr[best] - fpr[best])
    t = float(candidates[best])
    threshold = None if best == 0 else (-t if lower_is_member else t)
    return ThresholdAttack((1.0 + advantage) / 2.0, advantage, threshold, float(tpr[best]), float(fpr[best]))


def accuracy_at(members: np.ndarray, nonmembers: np.ndarray, threshold: float, lower_is_member: bool = True
                ) -> float:
    """Balanced accuracy (TPR + TNR) / 2 of predicting "member" for score <= threshold (>= if not
    `lower_is_member`)."""
    m, u = _arrays(members, nonmembers, lower_is_member)
    t = -threshold if lower_is_member else threshold
    return float(((m >= t).mean() + (u < t).mean()) / 2.0)


def auc(members: np.ndarray, nonmembers: np.ndarray, lower_is_member: bool = True) -> float:
    """ROC AUC of the score as a membership predictor, from the rank sum of the members (ties averaged)."""
    m, u = _arrays(members, nonmembers, lower_is_member)
    ranks = rankdata(np.concatenate([m, u]))
    rank_sum = float(ranks[: m.size].sum())
    return (rank_sum - m.size * (m.size + 1) / 2.0) / (m.size * u.size)

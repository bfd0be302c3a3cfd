"""The membership-inference report of one model on its members and non-members, and averages over clients.

For each score of `scores.SCORES` (loss, entropy, modified entropy, confidence) a report holds:
`member_mean`, `nonmember_mean`, `gap` (FedBiP Table 4's quantity for loss and entropy, `attacks.gap`),
`attack_accuracy` / `advantage` / `threshold` / `tpr` / `fpr` (the best-threshold attack, balanced by weighting
each side 1/2: `attacks.best_threshold`), `auc` (`attacks.auc`) and `mean_threshold_accuracy` (the balanced
accuracy at the members' mean score: Yeom et al. 2018's threshold, the average training loss, for `loss`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.core.protocols import SampleSet
from fedhet.errors import FedhetError
from fedhet.privacy.attacks import accuracy_at, auc, best_threshold, gap
from fedhet.privacy.scores import MEMBER_IS_LOWER, SCORES, sample_scores
from fedhet.yaml_input import JSONDict

Scores = Mapping[str, np.ndarray]
NOT_AVERAGED = ("threshold",)  # a threshold is the model's own; a mean of several models' thresholds means nothing


def score_report(members: np.ndarray, nonmembers: np.ndarray, lower_is_member: bool) -> dict[str, float | None]:
    """Means, gap, best-threshold attack, AUC and the mean-threshold accuracy of one score (module docstring)."""
    attack = best_threshold(members, nonmembers, lower_is_member)
    return {"member_mean": float(np.mean(members)), "nonmember_mean": float(np.mean(nonmembers)),
            "gap": gap(members, nonmembers, lower_is_member), "attack_accuracy": attack.accuracy,
            "advantage": attack.advantage, "threshold": attack.threshold, "tpr": attack.tpr, "fpr": attack.fpr,
            "auc": auc(members, nonmembers, lower_is_member),
            "mean_threshold_accuracy": accuracy_at(members, nonmembers, float(np.mean(members)), lower_is_member)}


def membership_report(members: Scores, nonmembers: Scores) -> JSONDict:
    """The report of every score in both mappings (name -> per-sample values), with the two sample counts."""
    names = [name for name in SCORES if name in members and name in nonmembers]
    if not names:
        raise FedhetError(f"no membership score to report: give per-sample scores named from {', '.join(SCORES)}")
    report: JSONDict = {"num_members": int(len(members[names[0]])),
                              "num_nonmembers": int(len(nonmembers[names[0]]))}
    for name in names:
        report[name] = score_report(members[name], nonmembers[name], MEMBER_IS_LOWER[name])
    return report


def evaluate_membership(model: nn.Module, members: SampleSet, nonmembers: SampleSet, device: torch.device,
                        batch_size: int = 256, classes: Sequence[int] | None = None
                        ) -> tuple[JSONDict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Score `model` on both datasets and report (works on any classifier, not only a run's): the report and
    the members' and non-members' per-sample scores (for pooling several clients)."""
    for what, data in (("members", members), ("non-members", nonmembers)):
        if len(data) == 0:  # type: ignore[arg-type]
            raise FedhetError(f"the {what} dataset is empty; a membership attack needs samples on both sides")
    m = sample_scores(model, members, device, batch_size, classes)
    u = sample_scores(model, nonmembers, device, batch_size, classes)
    return membership_report(m, u), m, u


def average_reports(reports: Sequence[JSONDict]) -> JSONDict:
    """The uniform mean over clients of every per-score number (as fedhet's `avg` client; thresholds left out)
    and the total sample counts."""
    if not reports:
        raise FedhetError("no client to average: the run has no evaluated client")
    out: JSONDict = {"num_members": sum(int(r["num_members"]) for r in reports),
                           "num_nonmembers": sum(int(r["num_nonmembers"]) for r in reports)}
    for name in SCORES:
        if all(name in r for r in reports):
            keys = [k for k in reports[0][name] if k not in NOT_AVERAGED]
            out[name] = {k: float(np.mean([r[name][k] for r in reports])) for k in keys}
    return out


def pooled_report(members: Sequence[Scores], nonmembers: Sequence[Scores]) -> JSONDict:
    """The report on every client's members against every client's non-members, concatenated."""
    names = [name for name in SCORES if all(name in s for s in (*members, *nonmembers))]
    return membership_report({n: np.concatenate([s[n] for s in members]) for n in names},
                             {n: np.concatenate([s[n] for s in nonmembers]) for n in names})

"""Tests added after the mutation pass (docs/results/mutation.md): the edges of Ditto-MMD's penalty session and
MK-MMD's kernel family that no earlier test pinned."""

from __future__ import annotations

import torch

from fedhet.algorithms.ditto_mmd_penalty import DittoMMDParams, PenaltySession, PenaltyState
from fedhet.losses.mk_mmd import default_gammas


def _session(**params: object) -> PenaltySession:
    return PenaltySession(DittoMMDParams(**params), ["features"], PenaltyState(), torch.device("cpu"))


def test_a_refit_every_step_learns() -> None:  # refit_interval 1 is a schedule, only 0 means never
    assert _session(refit_interval=1).learns and not _session(refit_interval=0).learns


def test_one_sample_gives_no_mmdd_term_and_no_refit() -> None:
    session = _session(penalty="mmdd")
    one = {"features": torch.randn(1, 6)}
    assert session.penalty(one, {"features": torch.randn(1, 6)}).item() == 0.0
    assert session.fit(one, {"features": torch.randn(1, 6)}, kernel_steps=1) is False


def test_a_single_kernel_is_allowed() -> None:
    assert default_gammas(1).tolist() == [2.0 ** -3.5]

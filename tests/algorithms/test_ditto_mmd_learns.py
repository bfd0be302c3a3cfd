"""Ditto + MK-MMD / MMD-D / cosine learn on real data: short runs on the offline default (scikit-learn's real
8x8 digits, four feature-shifted clients), personal models evaluated, well above chance (0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.config import load_config
from fedhet.launch.run import run_experiment

FAST = ["data.dataset=offline_digits", "model.name=small_cnn", "rounds=4", "train.local_epochs=1",
        "train.batch_size=32", "train.lr=0.01", "train.momentum=0.9", "run.quiet=true", "data.augment=false",
        "run.num_threads=1", "method=ditto_mmd"]


# the default penalty (MK-MMD) in the default suite; MMD-D and the cosine constraint with -m slow (MMD-D's kernel
# fitting is checked by hand in tests/losses/test_mmd_d.py and by the mutation tests)
@pytest.mark.parametrize(("penalty", "lam"),
                         [("mkmmd", 0.1), pytest.param("mmdd", 0.0, marks=pytest.mark.slow),
                          pytest.param("cosine", 0.1, marks=pytest.mark.slow)])
def test_ditto_mmd_beats_chance_on_real_digits(tmp_path: Path, penalty: str, lam: float) -> None:
    args = f"method_args={{penalty: {penalty}, lam: {lam}, mu: 1.0, refit_interval: 5, n_accumulate: 4}}"
    result = run_experiment(load_config(None, [*FAST, args]), tmp_path / penalty)
    avg = result.final["avg"]["accuracy"]
    # 0.35: MMD-D reached 0.44 on an Intel VM and above 0.5 on an AMD one (4 rounds; CPUs round differently)
    assert avg > 0.35, f"ditto_mmd ({penalty}): average personal accuracy {avg:.3f} is not well above chance (0.1)"
    assert len(result.final) >= 5  # four clients and the average

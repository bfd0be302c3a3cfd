"""Small end-to-end runs on the offline default benchmark: learning actually happens."""

from __future__ import annotations

import pytest

from fedhet.config import load_config
from fedhet.launch.run import run_experiment

FAST = ["data.dataset=offline_digits", "model.name=small_cnn", "rounds=4", "train.local_epochs=1",
        "train.batch_size=32", "train.lr=0.05", "train.momentum=0.5", "run.quiet=true", "data.augment=false"]


# the two non-federated references (local-only and pooled training) with -m slow: the default suite keeps the two
# federated paths, and tests/algorithms checks single and all by hand
@pytest.mark.parametrize("method", ["fedavg", "fedbn", pytest.param("single", marks=pytest.mark.slow),
                                    pytest.param("all", marks=pytest.mark.slow)])
def test_methods_beat_chance(tmp_path, method: str) -> None:
    result = run_experiment(load_config(None, FAST + [f"method={method}"]), tmp_path / method)
    avg = result.final["avg"]["accuracy"]
    assert avg > 0.3, f"{method}: average accuracy {avg:.3f} is not well above chance (0.1)"
    assert set(result.final) >= {"avg"} and len(result.final) >= 5
    assert (tmp_path / method / "summary.json").is_file()

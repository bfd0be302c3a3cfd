"""The App's Flower-style aliases (num-server-rounds, lr, local-epochs) hold the experiment's values, so a stock
ClientApp reading them trains as configured, and a `--run-config` change of an alias or of its key applies."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from fedhet.config import load_config  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402
from fedhet.runtimes.flower.run_config import ALIAS_WRITTEN, experiment_run_config, read_run_config  # noqa: E402


@pytest.fixture
def written() -> dict[str, object]:
    cfg = load_config(None, ["rounds=7", "train.lr=0.02", "train.local_epochs=3", "method=fedprox"])
    return experiment_run_config(cfg.to_dict())


def test_aliases_hold_the_values(written) -> None:
    assert (written["num-server-rounds"], written["lr"], written["local-epochs"]) == (7, 0.02, 3)
    config, _ = read_run_config(written)
    assert (config["rounds"], config["train"]["lr"], config["train"]["local_epochs"]) == (7, 0.02, 3)


def test_a_changed_alias_or_key_applies(written) -> None:
    assert read_run_config({**written, "num-server-rounds": 5})[0]["rounds"] == 5
    assert read_run_config({**written, "rounds": 9})[0]["rounds"] == 9
    assert read_run_config({**written, "rounds": 9, "num-server-rounds": 9})[0]["rounds"] == 9
    with pytest.raises(ConfigError, match="changes both local-epochs .* and train.local_epochs"):
        read_run_config({**written, "local-epochs": 2, "train.local_epochs": 4})


def test_an_app_written_with_the_old_zero_sentinel_still_reads(written) -> None:
    old = {k: v for k, v in written.items() if k != ALIAS_WRITTEN}
    old.update({"num-server-rounds": 0, "lr": 0.0, "local-epochs": 0})
    config, _ = read_run_config(old)
    assert (config["rounds"], config["train"]["local_epochs"]) == (7, 3)
    assert read_run_config({**old, "num-server-rounds": 4})[0]["rounds"] == 4

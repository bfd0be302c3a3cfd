"""The `tune` config section (FedPop runner S4): the paper's defaults, one clear error per bad setting, the
checks that need the experiment, the search space it names, and plain runs unaffected by it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedhet.config import load_config
from fedhet.engine.checkpoint import fingerprint
from fedhet.errors import ConfigError
from fedhet.tune.config import TuneConfig, resolve_space, tune_config

VAL = ["data.val_fraction=0.2"]


def test_defaults_are_the_papers() -> None:
    tune = tune_config(load_config(None, VAL))
    assert (tune.wrapper, tune.num_configs, tune.rho, tune.eps0, tune.p_re0, tune.gamma_g) == ("rs", 5, 3, 0.1, 0.1,
                                                                                                0.9)
    assert tune.split == "official"  # the official code's group size, ceil(0.3 n)
    assert tune.g_rounds(800) == 80 and tune.g_rounds(5) == 1  # T_g = 0.1 R_c, at least one round
    assert tune_config(load_config(None, [*VAL, "tune.wrapper=sha"])).num_configs == 27


@pytest.mark.parametrize("overrides, message", [
    (["tune.wraper=sha"], "did you mean 'wrapper'"),
    (["tune.wrapper=bohb"], "tune.wrapper"),
    (["tune.clients=fixed"], "tune.fedpop_l evolves the Delta-ball's local vectors"),
    (["tune.wrapper=sha", "tune.configs=9"], "start at least 27"),
    (["tune.rho=1"], "tune.rho must be an integer >= 2"),
    (["tune.rho=4"], "set tune.split=rank to use rho"),
    (["tune.split=median"], "tune.split"),
    (["tune.g_interval=0"], r"tune.g_interval must be in \(0, 1\]"),
    (["tune.p_re0=1.5"], r"tune.p_re0 must be in \[0, 1\]"),
])
def test_a_bad_setting_is_one_clear_error(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tune_config(load_config(None, [*VAL, *overrides]))


def test_the_experiment_must_have_a_validation_split_and_no_novel_clients() -> None:
    with pytest.raises(ConfigError, match="set data.val_fraction"):
        tune_config(load_config(None, []))
    with pytest.raises(ConfigError, match="does not hold out novel clients"):
        tune_config(load_config(None, [*VAL, "novel.holdout=0.3"]))


def test_the_space_is_a_preset_a_file_or_a_mapping(tmp_path: Path) -> None:
    assert "method_args.mu" in resolve_space(TuneConfig(space="fedprox")).client.dims
    inline = {"client": {"train.lr": {"type": "log_uniform", "low": -4, "high": 0}}}
    assert list(resolve_space(TuneConfig(space=inline)).client.dims) == ["train.lr"]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(inline))
    assert list(resolve_space(TuneConfig(space="space.yaml"), tmp_path).client.dims) == ["train.lr"]
    with pytest.raises(ConfigError, match="tune.space must be a preset"):
        resolve_space(TuneConfig(space="fedavgm"))


def test_plain_runs_ignore_the_section() -> None:
    plain, tuned = load_config(None, VAL), load_config(None, [*VAL, "tune.wrapper=sha"])
    assert fingerprint(plain.to_dict()) == fingerprint(tuned.to_dict())

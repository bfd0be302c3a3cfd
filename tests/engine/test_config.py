"""Config validation: unknown keys name the nearest valid key, bad values are rejected before training."""

from __future__ import annotations

import pytest

from fedhet.config import ExperimentConfig, load_config
from fedhet.errors import ConfigError


def test_defaults_validate() -> None:
    ExperimentConfig().validate()


def test_unknown_key_names_nearest(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("method: fedavg\ntrain:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"train\.lrr.*did you mean 'lr'"):
        load_config(path)


def test_unknown_top_level_key_in_override() -> None:
    with pytest.raises(ConfigError, match="did you mean 'rounds'"):
        load_config(None, ["round=5"])


@pytest.mark.parametrize("override, pattern", [
    ("train.lr=-0.1", "train.lr must be > 0"),
    ("data.fraction=1.5", "data.fraction must be in"),
    ("data.alpha=0", "data.alpha must be > 0"),
    ("server.fraction_fit=2", "server.fraction_fit"),
    ("rounds=0", "rounds must be >= 1"),
    ("train.batch_size=abc", "expected an integer"),
])
def test_bad_values_rejected(override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, [override])


def test_overrides_are_typed() -> None:
    cfg = load_config(None, ["train.lr=0.05", "method=fedbn", "data.domains=[clean,inverted]", "train.local_steps=3"])
    assert cfg.train.lr == 0.05 and cfg.method == "fedbn" and cfg.train.local_steps == 3
    assert cfg.data.domains == ["clean", "inverted"]


def test_override_without_equals_is_an_error() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.lr"])


def test_missing_config_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")

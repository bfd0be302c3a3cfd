"""Config validation: unknown keys name the nearest valid key, bad values are rejected before training."""

from __future__ import annotations

from pathlib import Path

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
    ("run.num_threads=0", "run.num_threads must be >= 1"),
    ("run.num_threads=-1", "run.num_threads must be >= 1"),
    ("label=..", "may not be . or .."),
    ("label=.", "may not be . or .."),
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


def test_extends_merges_into_the_base_file(tmp_path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "b.yaml").write_text("name: b\nrounds: 7\ntrain: {lr: 0.5, batch_size: 8}\n"
                                             "sweep: {methods: [fedavg], seeds: [0, 1]}\n")
    (tmp_path / "t.yaml").write_text("extends: base/b.yaml\ntrain: {lr: 0.1}\nsweep: {methods: [fedbn]}\n")
    cfg = load_config(tmp_path / "t.yaml", ["rounds=3"])
    assert (cfg.name, cfg.rounds, cfg.train.lr, cfg.train.batch_size) == ("b", 3, 0.1, 8)
    assert cfg.sweep == {"methods": ["fedbn"], "seeds": [0, 1]}


@pytest.mark.parametrize("text, match", [
    ("extends: nowhere.yaml\n", r"nowhere.yaml' \(extended by"),
    ("extends: t.yaml\n", "extends itself"),
    ("extends: [a]\n", "extends must be a file path"),
])
def test_bad_extends_is_one_clear_error(tmp_path, text, match) -> None:
    (tmp_path / "t.yaml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "t.yaml")


def test_adamw_is_a_local_optimizer() -> None:
    import torch

    from fedhet.engine.local import make_optimizer

    cfg = load_config(None, ["train.optimizer=adamw", "train.weight_decay=0.01"])
    opt = make_optimizer([torch.nn.Parameter(torch.ones(2))], cfg.train)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["weight_decay"] == 0.01
    with pytest.raises(ConfigError, match="did you mean 'adamw'"):
        load_config(None, ["train.optimizer=adamww"])


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "paper")  # paper/: published values


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_shipped_config_loads_and_plans(path: Path) -> None:
    """Every file under configs/ (extends chains, sweep variants, per-method overrides) is a valid config."""
    from fedhet.launch.sweep import plan_sweep

    assert plan_sweep(load_config(str(path))).configs


def test_yaml_merge_keys_may_be_overridden(tmp_path) -> None:
    """`<<: *base` then the same key is an override on purpose, not a duplicate."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  <<: {lr: 0.1, batch_size: 8}\n  lr: 0.2\n")
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.batch_size) == (0.2, 8)


def test_utf8_bom_is_allowed(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes("\ufeffrounds: 3\n".encode())
    assert load_config(path).rounds == 3


def test_duplicate_key_inside_a_list_item_is_an_error(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sweep:\n  overrides:\n    fedprox: {method_args: {mu: 0.1, mu: 0.2}}\n")
    with pytest.raises(ConfigError, match="'mu' is given twice"):
        load_config(path)


def test_overrides_are_checked_before_the_file_is_read(tmp_path) -> None:
    with pytest.raises(ConfigError, match="empty key"):
        load_config(tmp_path / "missing.yaml", ["=2"])


def test_in_code_a_later_override_replaces_an_earlier_one() -> None:
    """Lists of overrides compose in Python; the command line refuses a repeated key (tests/battery)."""
    assert load_config(None, ["rounds=1", "rounds=2"]).rounds == 2

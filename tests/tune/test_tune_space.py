"""Search spaces (spec §2.9): dimension kinds and their positions, the presets against fedhet's config, one clear
ConfigError per bad definition, and HP vectors turned into run configs and YAML-able dicts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedhet.config import ExperimentConfig, load_config
from fedhet.errors import ConfigError
from fedhet.models import SplitModel
from fedhet.tune import (
    PRESETS,
    apply_vector,
    check_space,
    load_space,
    parse_dim,
    parse_space,
    preset,
    to_overrides,
    vector_from_dict,
    vector_to_dict,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "tune.md"


def cfg(*overrides: str) -> ExperimentConfig:
    return load_config(overrides=list(overrides))


def test_positions_map_to_config_values() -> None:
    lr = parse_dim("train.lr", {"type": "log_uniform", "low": -4, "high": 0})
    assert lr.value(-3) == pytest.approx(1e-3) and lr.position(1e-3) == pytest.approx(-3) and lr.width == 4
    gamma = parse_dim("g", {"type": "one_minus_log", "low": -4, "high": -2})
    assert gamma.value(-2) == pytest.approx(0.99) and gamma.position(0.999) == pytest.approx(-3)
    batch = parse_dim("train.batch_size", {"type": "log2_int", "low": 3, "high": 7})
    assert batch.grid == (8, 16, 32, 64, 128) and batch.width == 4 and batch.value(2) == 32
    epochs = parse_dim("train.local_epochs", {"type": "int", "low": 1, "high": 5, "scale": 0.5})
    assert epochs.grid == (1, 2, 3, 4, 5) and epochs.scale == 0.5
    mom = parse_dim("server.momentum", {"type": "choice", "values": [0.0, 0.9]})
    assert mom.discrete and mom.position(0.9) == 1 and mom.width == 1


def test_sampling_covers_the_space_within_its_bounds() -> None:
    space = preset("fedavg").client
    rng = np.random.default_rng(0)
    vecs = [space.sample(rng) for _ in range(500)]
    lrs = np.array([v["train.lr"] for v in vecs])
    assert lrs.min() >= -4 and lrs.max() <= 0 and lrs.min() < -3.9 and lrs.max() > -0.1
    assert {v["train.batch_size"] for v in vecs} == {0, 1, 2, 3, 4}
    values = space.values(vecs[0])
    assert 1e-4 <= values["train.lr"] <= 1 and values["train.batch_size"] in (8, 16, 32, 64, 128)


@pytest.mark.parametrize("name,method", [("fedavg", "fedavg"), ("fedprox", "fedprox"), ("scaffold", "scaffold"),
                                         ("fedavg_official", "fedavg"), ("fedprox_official", "fedprox")])
def test_every_preset_fits_fedhet_config(name: str, method: str) -> None:
    space = preset(name)
    check_space(space, cfg(f"method={method}"))
    scaffold = {"method_args.control_lr", "method_args.control_decay"} if method == "scaffold" else set()
    assert set(space.server.dims) == {"server.lr", "server.momentum", "server.lr_decay"} | scaffold
    assert ("method_args.mu" in space.client.dims) == (method == "fedprox")
    assert all(dim.scale == 1.0 for dim in space.joint.dims.values())


def test_presets_hold_the_paper_ranges() -> None:
    dims = preset("fedprox").joint.dims
    assert (dims["server.lr"].low, dims["server.lr"].high) == (-1, 1)
    assert (dims["train.lr"].low, dims["train.lr"].high) == (-4, 0)
    assert (dims["train.weight_decay"].low, dims["train.weight_decay"].high) == (-5, -1)
    assert dims["train.local_epochs"].grid == (1, 2, 3, 4, 5)
    assert (dims["method_args.mu"].kind, dims["method_args.mu"].high) == ("uniform", 1.0)
    assert preset("fedavg_official").server.dims["server.momentum"].grid == (0.0, 0.9)
    decay = dims["server.lr_decay"]  # log10(1 - gamma) ~ U[-4, -2]
    assert (decay.kind, decay.low, decay.high) == ("one_minus_log", -4, -2)
    assert decay.value(-2) == pytest.approx(0.99)
    assert set(PRESETS) == {"fedavg", "fedprox", "scaffold", "fedavg_official", "fedprox_official"}


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("inverted bounds", {"client": {"train.lr": {"type": "log_uniform", "low": 0, "high": -4}}},
     r"low \(0\) must be below high \(-4\)"),
    ("equal bounds", {"client": {"train.momentum": {"type": "uniform", "low": 0.5, "high": 0.5}}},
     "must be below high"),
    ("empty choice", {"client": {"train.batch_size": {"type": "choice", "values": []}}}, "non-empty list 'values'"),
    ("repeated choice", {"client": {"train.batch_size": {"type": "choice", "values": [8, 8]}}}, "repeat a value"),
    ("unknown type", {"client": {"train.lr": {"type": "loguniform", "low": -4, "high": 0}}},
     "unknown type 'loguniform' \\(did you mean 'log_uniform'\\?\\)"),
    ("missing type", {"client": {"train.lr": {"low": -4, "high": 0}}}, "missing 'type'"),
    ("non-numeric bound", {"client": {"train.lr": {"type": "uniform", "low": "tiny", "high": 1}}},
     "low must be a number, got 'tiny'"),
    ("missing bound", {"client": {"train.lr": {"type": "uniform", "low": 0.1}}}, "missing: high"),
    ("fractional int bound", {"client": {"train.local_epochs": {"type": "int", "low": 1, "high": 4.5}}},
     "integer bounds"),
    ("unknown field", {"client": {"train.lr": {"type": "uniform", "low": 0.1, "hi": 1}}},
     "unknown field 'hi' \\(did you mean 'high'\\?\\)"),
    ("unknown top-level key", {"clients": {}}, "did you mean 'client'"),
    ("unknown preset", {"preset": "fedavgm"}, "did you mean 'fedavg'"),
    ("key in both roles", {"server": {"method_args.mu": {"type": "uniform", "low": 0, "high": 1}},
                           "client": {"method_args.mu": {"type": "uniform", "low": 0, "high": 1}}}, "both server"),
]


@pytest.mark.parametrize("what,data,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_definition_is_one_clear_config_error(what: str, data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_space(data)


CHECKED: list[tuple[str, dict[str, Any], str]] = [
    ("key the config lacks", {"client": {"train.lrr": {"type": "log_uniform", "low": -4, "high": 0}}},
     "'train.lrr' is not a tunable key.*did you mean 'train.lr'"),
    ("misspelt section", {"server": {"sever.lr": {"type": "log_uniform", "low": -1, "high": 1}}},
     "did you mean 'server.lr'"),
    ("method argument of another method", {"client": {"method_args.mu": {"type": "uniform", "low": 0, "high": 1}}},
     "method 'fedavg' takes no method arguments"),
    ("client key under server", {"server": {"train.lr": {"type": "log_uniform", "low": -4, "high": 0}}},
     "client \\(beta, Loc\\) hyperparameter; list it under client:"),
    ("server key under client", {"client": {"server.lr": {"type": "log_uniform", "low": -1, "high": 1}}},
     "list it under server:"),
    ("continuous dimension for an integer", {"client": {"train.local_epochs": {"type": "uniform", "low": 1,
                                                                               "high": 5}}}, "use type int"),
    ("value the config rejects", {"client": {"train.momentum": {"type": "uniform", "low": 0, "high": 1.0}}},
     "value 1.0 .*train.momentum must be in \\[0, 1\\)"),
    ("untunable section", {"client": {"data.alpha": {"type": "uniform", "low": 0.1, "high": 1}}},
     "'data.alpha' is not a tunable key"),
    ("model argument under client", {"client": {"model.args.dropout": {"type": "uniform", "low": 0, "high": 0.5}}},
     "read when the model is built, so it is one value per member .*list it under server:"),
]


@pytest.mark.parametrize("what,data,message", CHECKED, ids=[c[0] for c in CHECKED])
def test_a_space_that_does_not_fit_the_experiment_is_one_clear_config_error(what: str, data: dict[str, Any],
                                                                            message: str) -> None:
    space = parse_space(data)  # well-formed on its own
    with pytest.raises(ConfigError, match=message):
        check_space(space, cfg())


def test_tuned_epochs_under_fixed_local_steps_is_an_error() -> None:
    with pytest.raises(ConfigError, match="train.local_steps=5 overrides it"):
        check_space(preset("fedavg"), cfg("train.local_steps=5"))


def test_a_preset_can_be_rescaled_narrowed_and_trimmed() -> None:
    space = parse_space({"preset": "fedavg", "client": {"train.lr": {"scale": 2}, "train.momentum": None,
                                                        "train.batch_size": {"type": "choice", "values": [16, 32]}}})
    dims = space.client.dims
    assert dims["train.lr"].scale == 2 and (dims["train.lr"].low, dims["train.lr"].high) == (-4, 0)
    assert "train.momentum" not in dims and dims["train.batch_size"].grid == (16, 32)
    check_space(space, cfg())


def test_a_vector_becomes_a_run_config_the_same_way_as_command_line_overrides() -> None:
    space = preset("fedprox_official")
    base = cfg("method=fedprox")
    vec = {**space.server.sample(np.random.default_rng(0)), **space.client.sample(np.random.default_rng(1))}
    vec["method_args.mu"] = -5.0  # 1e-05: YAML 1.1 would read a bare '1e-05' as text
    applied = apply_vector(base, space.joint, vec)
    values = vector_to_dict(space.joint, vec)
    assert applied.train.lr == values["train.lr"] and applied.server.momentum == values["server.momentum"]
    assert applied.train.batch_size == values["train.batch_size"] and applied.method_args == {"mu": 1e-05}
    via_cli = load_config(base=base.to_dict(), overrides=to_overrides(space.joint, vec))
    assert via_cli == applied and isinstance(via_cli.method_args["mu"], float)


def test_a_vector_written_as_yaml_reads_back() -> None:
    space = preset("fedavg").joint
    vec = space.sample(np.random.default_rng(4))
    text = yaml.safe_dump(vector_to_dict(space, vec))
    back = vector_from_dict(space, yaml.safe_load(text))
    assert back == pytest.approx(vec)
    with pytest.raises(ConfigError, match="not on its grid"):
        vector_from_dict(space, {**yaml.safe_load(text), "train.batch_size": 48})
    with pytest.raises(ConfigError, match="do not match the search space"):
        vector_from_dict(space, {"train.lr": 0.1})


def test_the_documented_example_is_a_valid_space(tmp_path: Path) -> None:
    example = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert example, "docs/tune.md needs a ```yaml example"
    path = tmp_path / "space.yaml"
    path.write_text(example.group(1))
    space = load_space(path)
    check_space(space, cfg("method=fedprox"))
    assert {"server.lr", "train.lr", "train.batch_size", "method_args.mu"} <= set(space.joint.dims)


def test_an_unannotated_plug_in_model_argument_is_tunable_with_any_dimension_kind() -> None:
    """A plug-in model's keyword argument without an annotation is a tunable key typed `object`: any kind fits."""
    from fedhet.models import register_model
    from fedhet.tune import tunable_keys
    from fedhet.tune.keys import check_kind

    register_model("test_unannotated_width")(_loose)
    keys = tunable_keys(cfg("model.name=test_unannotated_width"))
    assert keys["model.args.width"] is object
    check_kind("model.args.width", keys["model.args.width"], "uniform", discrete=False)  # nothing to refuse


def _loose(num_classes: int, input_shape: tuple[int, ...], pretrained: bool, *, width=8) -> SplitModel:  # type: ignore[no-untyped-def]
    raise AssertionError("never built here")

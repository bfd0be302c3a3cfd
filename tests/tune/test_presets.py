"""The sweep's tuners (`tuner_settings`) and each method's default search space (`default_space`): valid for its
method on a tiny config, holding the method's own default, and listed in docs/tune.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedhet.algorithms.registry import ALGORITHMS
from fedhet.config import load_config
from fedhet.config.typed import from_dict
from fedhet.engine.experiment import method_params
from fedhet.errors import ConfigError
from fedhet.tune.apply import check_space
from fedhet.tune.config import TuneConfig
from fedhet.tune.presets import METHOD_DIMS, default_space, tuner_settings
from fedhet.tune.space import parse_space

TINY = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "rounds=2"]
FEDERATED = sorted(m for m in ALGORITHMS.names() if not (ALGORITHMS.get(m).centralized or ALGORITHMS.get(m).one_shot))
DOCS = Path(__file__).resolve().parents[2] / "docs" / "tune.md"


def test_the_tuners_are_the_contracts_settings() -> None:
    assert tuner_settings("rs") == {"wrapper": "rs", "clients": "fixed", "fedpop_l": False, "fedpop_g": False}
    assert tuner_settings("sha") == {"wrapper": "sha", "clients": "fixed", "fedpop_l": False, "fedpop_g": False}
    assert tuner_settings("fedpop") == {"wrapper": "rs", "clients": "ball", "fedpop_l": True, "fedpop_g": True}
    for name in ("rs", "sha", "fedpop"):
        from_dict(TuneConfig, tuner_settings(name), "tune").validate()
    tuner_settings("rs")["wrapper"] = "sha"  # a copy: the caller may change it
    assert tuner_settings("rs")["wrapper"] == "rs"
    with pytest.raises(ConfigError, match=r"unknown tuner 'fedpo'.*fedpop.*valid: fedpop, rs, sha"):
        tuner_settings("fedpo")


@pytest.mark.parametrize("method", FEDERATED)
def test_each_default_space_is_valid_for_its_method(method: str) -> None:
    """Keys, roles, types and both ends of every range pass the method's own validation (`check_space`)."""
    cfg = load_config(None, [*TINY, f"method={method}"])
    check_space(parse_space(default_space(method)), cfg)


@pytest.mark.parametrize("method", FEDERATED)
def test_each_default_space_holds_the_methods_default(method: str) -> None:
    """The method's own default value of every tuned argument is a point of its space (the ranges sit around
    the paper's values), and the space tunes the client lr plus exactly what its table names."""
    space = parse_space(default_space(method)).joint
    params = method_params(load_config(None, [*TINY, f"method={method}"]))
    for key, dim in space.dims.items():
        if not key.startswith("method_args."):
            continue
        value: object = params
        for name in key.split(".")[1:]:
            value = getattr(value, name)
        position = dim.position(value)
        assert dim.value(position) == pytest.approx(value), (key, value)
        assert dim.discrete or dim.low <= position <= dim.high, (key, value, dim)
    assert set(space.dims) == {"train.lr", *METHOD_DIMS.get(method, {})}


def test_the_issues_methods_tune_their_own_hyperparameters() -> None:
    keys = {m: set(parse_space(default_space(m)).joint.dims) - {"train.lr"} for m in FEDERATED}
    assert keys["adaptfed"] == {"method_args.update.lr", "method_args.embedding_dim"}
    assert keys["fraug"] == {"method_args.alpha", "method_args.beta", "method_args.eta_g"}
    assert keys["feddat"] == {"method_args.ramp", "method_args.temperature"}
    assert keys["ditto_mmd"] == {"method_args.lam", "method_args.mu"}
    assert keys["ditto"] == {"method_args.lam"} and keys["fedprox"] == {"method_args.mu"}
    assert keys["fedavg"] == set() and keys["fedbn"] == set()
    adamw, sgd = default_space("feddat")["client"]["train.lr"], default_space("fedavg")["client"]["train.lr"]
    assert (adamw["low"], adamw["high"], sgd["low"], sgd["high"]) == (-4, -2, -3, -0.5)


def test_a_key_the_method_reads_per_call_is_a_client_key_else_a_server_key() -> None:
    for method in FEDERATED:
        tree, per_call = default_space(method), ALGORITHMS.get(method).capabilities.call_params
        assert all(key.partition(".")[2] in per_call for key in tree["client"] if key.startswith("method_args."))
        assert all(key.partition(".")[2] not in per_call for key in tree["server"])
    assert "mu" in ALGORITHMS.get("fedprox").capabilities.call_params
    assert "method_args.mu" in default_space("fedprox")["client"]


def test_methods_without_rounds_have_no_default_space() -> None:
    with pytest.raises(ConfigError, match="'fedbip' is one-shot"):
        default_space("fedbip")
    with pytest.raises(ConfigError, match="'all' trains on the pooled data"):
        default_space("all")
    with pytest.raises(ConfigError, match="unknown method 'fedprx'.*fedprox"):
        default_space("fedprx")


def test_docs_list_every_default_space() -> None:
    """docs/tune.md's default-spaces table has one row per method of `METHOD_DIMS`, naming each of its keys."""
    text = DOCS.read_text()
    section = text.split("### Default search spaces", 1)[1].split("\n#", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|(.*)$", section, re.M)}
    assert set(METHOD_DIMS) <= set(rows)
    for method, row in rows.items():
        keys = set(re.findall(r"`((?:train|server|method_args)\.[\w.]+)`", row)) - {"train.lr"}
        assert keys == set(parse_space(default_space(method)).joint.dims) - {"train.lr"}, method


def test_a_field_of_a_dataclass_argument_is_tuned_per_member(tmp_path: Path) -> None:
    """AdaptFED's hypernetwork lr `method_args.update.lr` (a field of its `update` dataclass) is a build-time key:
    refused per client, and each member's method is built with its own value."""
    from fedhet.engine.experiment import build_experiment
    from fedhet.tune.member import MethodCopies

    cfg = load_config(None, [*TINY, "method=adaptfed", "model.name=focalnet", "data.fraction=0.3",
                             "model.args={embed_dim: 8, depths: [2], patch_size: 4}"])
    lr = {"type": "log_uniform", "low": -3, "high": -1}
    with pytest.raises(ConfigError, match="'method_args.update.lr' is read when the method is built"):
        check_space(parse_space({"client": {"method_args.update.lr": lr}}), cfg)
    space = parse_space({"server": {"method_args.update.lr": lr}})
    check_space(space, cfg)
    copies = MethodCopies(build_experiment(cfg), space)
    assert [copies.of({"method_args.update.lr": x}, {}).params.update.lr for x in (-3.0, -1.0)] == pytest.approx(
        [1e-3, 1e-1])

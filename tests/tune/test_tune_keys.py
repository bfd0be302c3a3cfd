"""Which keys a search space may hold (tune/keys.py): per-call keys anywhere their role allows, build-time keys
(model.args.*, method_args the method reads when it is built) under server: only, untunable keys one clear error
naming why; and every method's declared `call_params` really are read only at call time (probed)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from fedhet_testing import for_method

from fedhet.algorithms import ALGORITHMS
from fedhet.config import ExperimentConfig, load_config
from fedhet.data import build_federated_data
from fedhet.engine.experiment import make_model_fn, method_params
from fedhet.errors import ConfigError
from fedhet.tune import check_space
from fedhet.tune.keys import build_time
from fedhet.tune.space import parse_space

UNIFORM = {"type": "uniform", "low": 0.1, "high": 0.5}


def cfg(*overrides: str) -> ExperimentConfig:
    return load_config(overrides=["model.name=small_cnn", *overrides])


def test_build_time_keys_are_tunable_under_server() -> None:
    space = parse_space({"server": {"model.args.width": {"type": "choice", "values": [4, 8]},
                                    "method_args.projection_dim": {"type": "int", "low": 4, "high": 8}},
                         "client": {"method_args.mu": UNIFORM, "method_args.temperature": UNIFORM}})
    check_space(space, cfg("method=moon"))
    moon = cfg("method=moon")
    assert build_time("model.args.width", moon) and build_time("method_args.projection_dim", moon)
    assert not build_time("method_args.mu", moon) and not build_time("train.lr", moon)


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("build-time method arg under client", {"client": {"method_args.projection_dim": {"type": "int", "low": 4,
                                                                                      "high": 8}}},
     "method_args.projection_dim' is read when the method is built, so it is one value per member"),
    ("data key", {"server": {"data.alpha": UNIFORM}}, "'data.alpha' is not a tunable key: the data is loaded once"),
    ("rounds", {"server": {"rounds": {"type": "int", "low": 2, "high": 4}}}, "'rounds' is not a tunable key: it is "
     "each configuration's budget"),
    ("run key", {"server": {"run.device": {"type": "choice", "values": ["cpu"]}}}, "not how a member trains"),
    ("model name", {"server": {"model.name": {"type": "choice", "values": ["mlp"]}}}, "only model.args.\\* can "
     "differ per member"),
    ("unknown model arg", {"server": {"model.args.widht": {"type": "int", "low": 4, "high": 8}}},
     "did you mean 'model.args.width'.*model 'small_cnn' takes"),
    ("continuous int model arg", {"server": {"model.args.width": {"type": "uniform", "low": 4, "high": 8}}},
     "use type int"),
    ("numeric text field", {"server": {"model.args.norm": UNIFORM}}, "is a str but type uniform is numeric; use "
     "type choice"),
    ("reversed bounds", {"server": {"method_args.projection_dim": {"type": "int", "low": 8, "high": 4}}}, "low"),
    ("value the method rejects", {"server": {"method_args.projection_dim": {"type": "int", "low": 0, "high": 4}}},
     "the value 0 it can take is not valid here"),
]


@pytest.mark.parametrize("what,data,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_key_that_cannot_be_tuned_so_is_one_clear_error(what: str, data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_space(parse_space(data), cfg("method=moon"))


def _reads_while_built(method: str) -> tuple[set[str], list[str]]:
    """The Params fields the method reads while it is built (`__init__`, `init_server`, `init_client`), and the
    attributes other than `params` that keep its Params object (they would not see a copy's values)."""
    config = load_config(None, for_method(method, ["data.dataset=offline_digits", "model.name=small_cnn",
                                                   "model.args={width: 4}", "rounds=2"]))
    data = build_federated_data(config.data, config.seed)
    params = method_params(config)
    fields, reads = {f.name for f in dataclasses.fields(params)}, set()

    class Recording(type(params)):  # type: ignore[misc]
        def __getattribute__(self, name: str) -> Any:
            if name in fields:
                reads.add(name)
            return object.__getattribute__(self, name)

    recording = Recording.__new__(Recording)
    recording.__dict__.update(params.__dict__)
    alg = ALGORITHMS.get(method)(recording, make_model_fn(config, data), config.train, config.server,
                                 data.num_classes, torch.device("cpu"), num_clients=len(data.clients))
    alg.init_server()
    alg.init_client(0)
    kept = [f"{name}.{inner}" for name, value in vars(alg).items() if name != "params" and hasattr(value, "__dict__")
            for inner, held in vars(value).items() if held is recording]
    return reads, kept + [name for name, value in vars(alg).items() if value is recording and name != "params"]


DECLARING = sorted(n for n in ALGORITHMS.names() if ALGORITHMS.get(n).capabilities.call_params)


@pytest.mark.parametrize("method", DECLARING)
def test_declared_call_params_are_not_read_when_the_method_is_built(method: str) -> None:
    """A call param read while building (or kept by a built object) would silently keep the base's value in a
    member's or client's copy (`with_hparams` swaps `params` only)."""
    reads, kept = _reads_while_built(method)
    assert not reads & ALGORITHMS.get(method).capabilities.call_params and not kept

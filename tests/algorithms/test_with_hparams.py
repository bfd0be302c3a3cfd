"""`algorithms.base.with_hparams` (FedPop's per-client / per-member hyperparameters, docs/design_fedpop_runner.md):
a copy configured with other train / server / per-call method values trains and aggregates exactly as an
algorithm built from a config with those values, and leaves the original untouched."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedhet.algorithms.base import with_hparams
from fedhet.config import load_config
from fedhet.core.messages import Reply
from fedhet.engine.experiment import build_experiment, method_params
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError
from fedhet.tune import check_space, hparams_of, parse_space

BASE = ["data.dataset=offline_digits", "model.name=mlp", "train.local_steps=4", "run.num_threads=1",
        "run.quiet=true", "method=fedprox"]
CHANGED = ["train.lr=0.05", "train.momentum=0.5", "train.batch_size=8", "method_args.mu=0.3",
           "server.lr=0.5", "server.momentum=0.9"]


def fit_and_aggregate(alg, exp, seed: int = 0):
    server = alg.init_server()
    info = exp.round_info(1)
    replies = []
    for cid in (0, 1):
        torch.manual_seed(seed + cid)
        reply, _ = fit_client(alg, alg.broadcast(server, info, cid), alg.init_client(cid), exp.context(cid, 1))
        replies.append(Reply(cid, reply, 10))
    return replies, alg.aggregate(server, replies, info)


def test_a_copy_with_other_hparams_equals_an_algorithm_built_with_them() -> None:
    base = build_experiment(load_config(None, BASE))
    built = build_experiment(load_config(None, [*BASE, *CHANGED]))
    want = built.config
    copy = with_hparams(base.algorithm, train=want.train, server=want.server, params=method_params(want))
    (got_replies, got), (ref_replies, ref) = fit_and_aggregate(copy, base), fit_and_aggregate(built.algorithm, built)
    for a, b in zip(got_replies, ref_replies, strict=True):
        assert all(torch.equal(a.message.arrays[k], b.message.arrays[k]) for k in b.message.arrays)
    assert all(torch.equal(got.model[k], ref.model[k]) for k in ref.model)
    buffers = [k for k in ref.opt if isinstance(ref.opt[k], torch.Tensor)]
    assert buffers and all(torch.equal(got.opt[k], ref.opt[k]) for k in buffers)  # server momentum buffers too
    # the original keeps its own values and trains as before
    assert base.algorithm.train_cfg.lr == base.config.train.lr and base.algorithm.params.mu == 0.01
    plain = build_experiment(load_config(None, BASE))
    (mine, _), (fresh, _) = fit_and_aggregate(base.algorithm, base), fit_and_aggregate(plain.algorithm, plain)
    assert all(torch.equal(mine[0].message.arrays[k], fresh[0].message.arrays[k]) for k in fresh[0].message.arrays)


def test_method_args_read_at_build_cannot_differ_per_call() -> None:
    exp = build_experiment(load_config(None, [*BASE, "method=moon"]))
    with pytest.raises(ConfigError, match=r"reads method_args \['projection_dim'\] when it is built"):
        with_hparams(exp.algorithm, params=dataclasses.replace(exp.algorithm.params, projection_dim=4))
    space = parse_space({"client": {"method_args.projection_dim": {"type": "int", "low": 4, "high": 8}}})
    with pytest.raises(ConfigError, match="projection_dim' is read when the method is built, so it is one value per "
                       "member"):  # fedhet tune builds it per member (tests/tune/test_tune_builds.py)
        check_space(space, exp.config)


def test_hparams_of_gives_what_with_hparams_takes() -> None:
    cfg = load_config(None, BASE)
    space = parse_space({"client": {"train.lr": {"type": "log_uniform", "low": -4, "high": 0},
                                    "method_args.mu": {"type": "uniform", "low": 0, "high": 1}},
                         "server": {"server.lr": {"type": "log_uniform", "low": -1, "high": 1}}})
    check_space(space, cfg)
    train, server, params = hparams_of(cfg, space.joint, {"train.lr": -2.0, "method_args.mu": 0.25, "server.lr": 0.0})
    assert (train.lr, params.mu, server.lr) == (pytest.approx(0.01), 0.25, pytest.approx(1.0))
    assert train.batch_size == cfg.train.batch_size  # everything else as configured


def test_every_method_declares_capabilities_over_its_own_params() -> None:
    """A method's per-call and laned Params fields are fields of its Params, and laned ones are per-call; a
    declaration that breaks this is refused when the method's class is made."""
    from fedhet.algorithms.base import Capabilities
    from fedhet.algorithms.registry import ALGORITHMS

    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        fields = {f.name for f in dataclasses.fields(cls.Params)}
        assert cls.capabilities.call_params <= fields, name
        assert cls.capabilities.lane_params <= cls.capabilities.call_params, name
    with pytest.raises(ValueError, match=r"lane_params \['mu'\] must be call_params"):
        Capabilities(lane_params=frozenset({"mu"}))


def test_a_copy_keeps_the_server_settings_its_method_derives_when_built() -> None:
    """FRAug's method_args.aggregation (weighted by default) replaces server.aggregation when it is built; a tuning
    copy given the run's server settings must aggregate as the built method does (as `fedhet run` of it would)."""
    exp = build_experiment(load_config(None, [*BASE, "method=fraug", "server.aggregation=uniform", "server.lr=0.5"]))
    assert exp.algorithm.server_cfg.aggregation == "weighted"
    copy = with_hparams(exp.algorithm, server=dataclasses.replace(exp.config.server, lr=0.25))
    assert (copy.server_cfg.aggregation, copy.server_cfg.lr) == ("weighted", 0.25)

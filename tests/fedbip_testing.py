"""Helpers for the `fedbip` method's tests: a tiny FedBiP experiment on the tiny LDM and one client's seeded fit
(import as `from fedbip_testing import ...`)."""

from __future__ import annotations

from typing import Any

from fedhet_testing import tiny_ldm

from fedhet.config import load_config
from fedhet.core.seeding import seeded
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import fit_client

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.batch_size=16",
        "train.lr=0.05", "data.max_test_per_client=20", "run.quiet=true", "run.device=cpu", "run.num_threads=1",
        "method=fedbip", "data.domains=[clean, inverted]"]


def experiment(*overrides: str) -> Experiment:
    """FedBiP on two offline_digits clients (24 training images each) and the tiny LDM."""
    return build_experiment(load_config(None, [*BASE, *tiny_ldm(), *overrides]))


def fit(exp: Experiment, cid: int = 0) -> tuple[Any, Any, Any, Any, Any]:
    """(method, broadcast, old state, reply, new state) of client `cid`'s fit, seeded as the runtimes seed it."""
    alg = exp.algorithm
    msg = alg.broadcast(alg.init_server(), exp.round_info(1), cid)
    state = alg.init_client(cid)
    with seeded(exp.config.seed, "fit", cid):
        reply, new_state = fit_client(alg, msg, state, exp.context(cid, 1))
    return alg, msg, state, reply, new_state

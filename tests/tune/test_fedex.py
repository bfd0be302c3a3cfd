"""FedEx (Khodak et al. 2021) as the local-HP baseline: the exponentiated-gradient step by hand, and a tuning
job whose members draw their clients' vectors from their own candidate distribution and resume exactly."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedhet.config import load_config
from fedhet.errors import ConfigError
from fedhet.tune.checkpoint import FILENAME, load_population
from fedhet.tune.config import tune_config
from fedhet.tune.fedex import FedExState, fedex_draw, fedex_step
from fedhet.tune.run import run_tuning

FEDEX = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "train.local_steps=2", "rounds=4",
         "run.num_threads=1", "run.quiet=true", "server.fraction_fit=0.5", "tune.configs=2", "tune.clients=fedex",
         "tune.fedpop_l=false", "tune.fedpop_g=false",
         "tune.space={client: {train.lr: {type: log_uniform, low: -2, high: -0.5}}}"]


def test_one_step_by_hand() -> None:
    cands = [{"train.lr": float(i)} for i in range(3)]
    state = FedExState(candidates=cands, z=[-math.log(3)] * 3)
    new = fedex_step(state, chosen=[0, 1], errors=[0.2, 0.6], weights=[1.0, 1.0])
    grad = np.array([0.5 * 0.2 * 3, 0.5 * 0.6 * 3, 0.0])  # w (e - b) / theta with b = 0 the first time
    z = np.full(3, -math.log(3)) - math.sqrt(2 * math.log(3)) * grad
    want = np.exp(z - np.logaddexp.reduce(z))
    assert np.allclose(new.theta, want) and new.theta[2] > new.theta[0] > new.theta[1]
    assert new.baseline == pytest.approx(0.4) and new.steps == 1 and new.mle() == cands[2]
    again = fedex_step(new, chosen=[0], errors=[0.3], weights=[1.0])  # below the baseline 0.4: more likely
    assert again.theta[0] / again.theta[1] > new.theta[0] / new.theta[1]


def test_draws_follow_theta() -> None:
    state = FedExState(candidates=[{}, {}], z=[math.log(0.9), math.log(0.1)])
    draws = fedex_draw(state, 2000, np.random.default_rng(0))
    assert abs(draws.count(0) / 2000 - 0.9) < 0.03


def test_a_fedex_job_runs_and_resumes(tmp_path: Path) -> None:
    whole = run_tuning(load_config(None, FEDEX), tmp_path / "w", progress=False)
    assert whole.summary["label"] == "fedavg+rs+fedex"
    run_tuning(load_config(None, FEDEX), tmp_path / "p", progress=False, stop_after=2)
    resumed = run_tuning(load_config(None, FEDEX), tmp_path / "p", progress=False, resume=True)
    assert resumed.summary["final"] == whole.summary["final"]
    members = load_population(tmp_path / "w" / "checkpoints" / FILENAME, load_config(None, FEDEX)).members
    for m in members:
        assert m.fedex is not None and len(m.fedex.candidates) == 27 and m.fedex.steps == 4
        assert m.beta0 == m.fedex.mle() and all(b in m.fedex.candidates for b in m.betas)


def test_fedex_is_a_baseline_of_its_own() -> None:
    with pytest.raises(ConfigError, match="set tune.fedpop_g=false"):
        tune_config(load_config(None, ["data.val_fraction=0.2", "tune.clients=fedex", "tune.fedpop_l=false"]))

"""privacy.dp in a run: epsilon per round, the max_epsilon stop before the round, resume, personal keys, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from fedhet_testing import assert_same_run

from fedhet.config import load_config
from fedhet.engine.safe_load import load_trusted
from fedhet.errors import ConfigError
from fedhet.launch.run import run_experiment

pytest.importorskip("dp_accounting")
BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "run.checkpoint_every=3", "data.max_test_per_client=40"]
# 4 clients, 2 per round (q = 0.5), sigma 1, delta 0.01: epsilon 2.74 after 2 rounds, 3.40 after 3
DP = ["privacy.dp.mode=server", "privacy.dp.noise_multiplier=1.0", "privacy.dp.delta=0.01",
      "server.fraction_fit=0.5"]


def cfg(*extra: str):
    return load_config(None, BASE + list(extra))


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def reference(steps: int) -> float:
    from dp_accounting import dp_event, rdp

    acc = rdp.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(1.0)), steps)
    return float(acc.get_epsilon(0.01))


def test_budget_stops_before_the_round_and_resume_gives_the_same_epsilon(tmp_path) -> None:
    c = cfg("rounds=4", "method=fedavg", *DP, "privacy.dp.max_epsilon=3.0")
    done = run_experiment(c, tmp_path / "straight")
    assert done.rounds_completed == 2  # round 3 would spend 3.40 > 3.0: refused before it trained
    privacy = json.loads((tmp_path / "straight" / "summary.json").read_text())["privacy"]
    assert "round 3 would spend epsilon" in privacy["stopped"]
    assert privacy["epsilon"] == pytest.approx(reference(2), rel=1e-6)
    eps = [r["epsilon"] for r in rows(tmp_path / "straight") if r["split"] == "privacy"]
    assert eps == pytest.approx([reference(1), reference(2)], rel=1e-6)
    assert load_trusted(tmp_path / "straight" / "checkpoints" / "latest.pt", "checkpoint")["round"] == 2

    run_experiment(c, tmp_path / "split", stop_after=1)
    run_experiment(c, tmp_path / "split", resume=True)
    assert_same_run(tmp_path / "straight", tmp_path / "split")  # the noise and the epsilon rows, bit for bit
    assert json.loads((tmp_path / "split" / "summary.json").read_text())["privacy"] == privacy

    before = (tmp_path / "split" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already spent epsilon 2.74"):
        run_experiment(cfg("rounds=4", "method=fedavg", *DP, "privacy.dp.max_epsilon=2.0"), tmp_path / "split",
                       resume=True, allow_changes=("privacy.dp.max_epsilon",))
    assert (tmp_path / "split" / "metrics.jsonl").read_text() == before


def test_fedbn_keeps_its_batchnorm_local_and_unnoised(tmp_path) -> None:
    """Round 1 trains from the same initial model with and without DP: the clients' BatchNorm (never sent) is the
    same bit for bit, while the shared model differs by the noise."""
    plain = run_experiment(cfg("rounds=1", "method=fedbn", "server.aggregation=uniform"), tmp_path / "plain")
    private = run_experiment(cfg("rounds=1", "method=fedbn", *DP[:3]), tmp_path / "dp")
    a = load_trusted(plain.run_dir / "checkpoints" / "latest.pt", "checkpoint")
    b = load_trusted(private.run_dir / "checkpoints" / "latest.pt", "checkpoint")
    bn = list(b["clients"][0].local)  # FedBN: the BatchNorm layers
    assert bn and not any(k in b["server"].model for k in bn)
    for cid, state in a["clients"].items():
        for key in bn:
            assert torch.equal(state.local[key], b["clients"][cid].local[key]), (cid, key)
    assert any(not torch.equal(v, b["server"].model[k]) for k, v in a["server"].model.items())


@pytest.mark.parametrize(("extra", "match"), [(["method=scaffold"], "method 'scaffold' aggregates in its own way"),
                                              (["server.aggregation=median"], "server.aggregation"),
                                              (["privacy.dp.delta=0.5"], "1/N = 1/4")])
def test_refused_before_training(tmp_path, extra: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        run_experiment(cfg("rounds=1", *DP, *extra), tmp_path / "r")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()

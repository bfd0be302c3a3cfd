"""`fedhet tune` under privacy.dp (docs/tune.md "Tuning under differential privacy"): one epsilon composes every
member-round on the same clients (hand-built dp-accounting events, 1e-6 relative), SHA's eliminated members stop
spending, a planned spend over max_epsilon is refused before anything runs, a round over it stops the job cleanly,
a resume gives the same epsilon bit for bit, and the members' noises are independent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tune_testing import BASE

from fedhet.config import load_config
from fedhet.errors import ConfigError
from fedhet.tune.checkpoint import FILENAME, load_population
from fedhet.tune.run import run_tuning

pytest.importorskip("dp_accounting")
# 4 clients, 2 sampled a round (q = 0.5), sigma 1, delta 0.01; 2 configurations of 2 rounds, nothing evolves
DP = ["privacy.dp.mode=server", "privacy.dp.noise_multiplier=1.0", "privacy.dp.delta=0.01"]
SMALL = ["rounds=2", "tune.configs=2", "tune.fedpop_g=false", "tune.fedpop_l=false", "tune.clients=fixed"]


def tuned(run_dir: Path, *extra: str, **kwargs):
    return run_tuning(load_config(None, [*BASE, *DP, *SMALL, *extra]), run_dir, progress=False, **kwargs)


def by_hand(*rounds: tuple[int, bool]) -> float:
    """dp-accounting's RDP epsilon(0.01) of rounds given as (members, shared sample): k members on one Poisson
    sample (q 0.5) are one sampled event of k Gaussians; on their own samples, k sampled events."""
    from dp_accounting import dp_event, rdp

    acc = rdp.RdpAccountant()
    for k, shared in rounds:
        gaussian = dp_event.GaussianDpEvent(1.0)
        if shared:
            acc.compose(dp_event.PoissonSampledDpEvent(0.5, dp_event.SelfComposedDpEvent(gaussian, k)))
        else:
            acc.compose(dp_event.PoissonSampledDpEvent(0.5, gaussian), k)
    return float(acc.get_epsilon(0.01))


def privacy_rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "privacy"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-member x 2-round job under DP, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("straight")
    tuned(run_dir)
    return run_dir


def test_epsilon_composes_every_member_round(straight: Path) -> None:
    privacy = json.loads((straight / "summary.json").read_text())["privacy"]
    assert privacy["member_rounds"] == 4 and privacy["dp_rounds"] == 2 and privacy["sampling"] == "shared"
    assert privacy["members_per_round"] == [2, 2]
    assert privacy["epsilon"] == pytest.approx(by_hand((2, True), (2, True)), rel=1e-6)
    eps = [r["epsilon"] for r in privacy_rows(straight)]
    assert eps == pytest.approx([by_hand((2, True)), by_hand((2, True), (2, True))], rel=1e-6)


def test_members_sampling_apart_compose_as_independent_events(tmp_path: Path) -> None:
    result = tuned(tmp_path, "tune.sampling=per_member", "rounds=1")
    assert result.summary["privacy"]["epsilon"] == pytest.approx(by_hand((2, False)), rel=1e-6)


def test_sha_counts_only_the_rounds_members_trained(tmp_path: Path) -> None:
    """3 configurations, one elimination after round 1 (keeps 1): 3 member-rounds, then 1."""
    result = tuned(tmp_path, "tune.wrapper=sha", "tune.configs=3", "tune.eliminations=1")
    privacy = result.summary["privacy"]
    assert privacy["member_rounds"] == 4 and privacy["members_per_round"] == [3, 1]
    assert privacy["epsilon"] == pytest.approx(by_hand((3, True), (1, True)), rel=1e-6)


def test_a_plan_over_the_budget_is_refused_before_anything_runs(tmp_path: Path) -> None:
    planned = by_hand((2, True), (2, True))
    with pytest.raises(ConfigError, match=rf"plans 4 member-rounds .* epsilon {planned:.6g} .* > privacy.dp.max"
                                          r"_epsilon 4; nothing was run. Start fewer configurations"):
        tuned(tmp_path, "privacy.dp.max_epsilon=4")
    assert not (tmp_path / "checkpoints" / FILENAME).exists() and not (tmp_path / "metrics.jsonl").exists()


def test_a_round_over_the_budget_stops_the_job_checkpointed(tmp_path: Path, monkeypatch) -> None:
    """With the plan's check out of the way, the round check alone: round 2 would pass max_epsilon 4, so the job
    ends after round 1 with its choice made and its checkpoint of round 1."""
    from fedhet.tune.privacy import JobPrivacy

    monkeypatch.setattr(JobPrivacy, "check_plan", lambda self, planned: None)
    result = tuned(tmp_path, "privacy.dp.max_epsilon=4")
    assert result.rounds_completed == 1 and result.summary["rounds_completed"] == 1
    privacy = result.summary["privacy"]
    assert "round 2 of 2 members would spend epsilon" in privacy["stopped"]
    assert privacy["epsilon"] == pytest.approx(by_hand((2, True)), rel=1e-6)
    saved = load_population(tmp_path / "checkpoints" / FILENAME, load_config(None, [*BASE, *DP, *SMALL,
                                                                                    "privacy.dp.max_epsilon=4"]))
    assert saved.round == 1 and saved.dp_rounds == [2]


def test_a_resumed_job_spends_the_same_epsilon_bit_for_bit(straight: Path, tmp_path: Path) -> None:
    assert tuned(tmp_path, stop_after=1).rounds_completed == 1
    resumed = tuned(tmp_path, resume=True)
    assert resumed.summary["privacy"] == json.loads((straight / "summary.json").read_text())["privacy"]
    for name in ("metrics.jsonl", "tune/members.jsonl"):
        assert (tmp_path / name).read_text() == (straight / name).read_text()


def test_members_draw_independent_noise() -> None:
    """Two members with the same vectors train the same clients the same way; only their DP noise differs, so
    their models differ (a shared noise would cancel in the difference of their aggregates)."""
    from fedhet.engine.experiment import build_experiment
    from fedhet.tune.config import resolve_space, tune_config
    from fedhet.tune.population import Population

    cfg = load_config(None, [*BASE, *DP, *SMALL])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    vector = (pop.space.server.sample(pop.rng("x", 0)), pop.space.client.sample(pop.rng("y", 0)))
    pop.start([vector, vector])
    pop.train_round(1)
    a, b = (m.server.model for m in pop.members)
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())


def test_the_plan_counts_the_members_each_round_trains() -> None:
    from fedhet.tune.config import TuneConfig
    from fedhet.tune.privacy import planned_members

    assert planned_members(TuneConfig(wrapper="rs", configs=5), 3, []) == [5, 5, 5]
    assert planned_members(TuneConfig(wrapper="sha", configs=27), 5, [1, 2, 3]) == [27, 9, 3, 1, 1]


def test_lanes_apply_the_same_dp_as_in_process() -> None:
    """The batched runtime's lanes only train; each member's private aggregation is the same step in-process."""
    from tune_testing import played

    base = [*BASE, *DP, *SMALL, "rounds=1", "run.batched_min_lanes=1"]
    alone, lanes = played(base=base), played("run.runtime=batched", base=base)
    for a, b in zip(alone.members, lanes.members, strict=True):
        assert all(torch.allclose(a.server.model[k], v, atol=1e-5, rtol=1e-5) for k, v in b.server.model.items())
        assert a.server.opt["dp/steps"] == b.server.opt["dp/steps"] == 1


def test_a_tuned_sweep_records_the_tuning_epsilon_and_each_rerun_its_own(tmp_path: Path) -> None:
    """2 clients, every one each round (q = 1): the tuning job's 2 members x 2 rounds are 4 Gaussians; the re-run
    on the fresh seed is a run of its own, 2 Gaussians, in its summary."""
    from dp_accounting import dp_event, rdp

    from fedhet.config import ExperimentConfig, from_dict
    from fedhet.tune.sweep import plan_tuned_sweep, run_tuned_sweep

    def gaussians(n: int) -> float:
        acc = rdp.RdpAccountant()
        acc.compose(dp_event.GaussianDpEvent(1.0), n)
        return float(acc.get_epsilon(0.01))

    tree = {"name": "dp", "rounds": 2, "model": {"name": "mlp"}, "train": {"local_steps": 1},
            "data": {"dataset": "offline_digits", "domains": ["clean", "inverted"], "max_test_per_client": 20,
                     "max_train_per_client": 40},
            "privacy": {"dp": {"mode": "server", "noise_multiplier": 1.0, "delta": 0.01}},
            "run": {"out_dir": str(tmp_path), "quiet": True, "num_threads": 1},
            "sweep": {"methods": ["fedavg"], "tune": {"budget": "2x", "seeds": [0], "seed": 7,
                                                      "space": {"client": {"train.lr": {"type": "log_uniform",
                                                                                        "low": -2, "high": -0.5}}}}}}
    cfg = from_dict(ExperimentConfig, tree)
    cfg.validate()
    run_tuned_sweep(plan_tuned_sweep(cfg), progress=False)
    folder = tmp_path / "dp" / "offline_digits" / "fedavg+tuned-rs"
    privacy = json.loads((folder / "tuned.json").read_text())["privacy"]
    assert privacy["member_rounds"] == 4 and privacy["tuning_epsilon"] == pytest.approx(gaussians(4), rel=1e-6)
    rerun = json.loads((folder / "seed0" / "summary.json").read_text())["privacy"]
    assert rerun["epsilon"] == pytest.approx(gaussians(2), rel=1e-6)

"""Tuned sweeps (`fedhet sweep CONFIG --tune BUDGET`, issue 40 item 2): the layout and tuned.json with the budget in
client-rounds, a stopped sweep resumes to the uninterrupted result without re-running finished tuning jobs, and
each bad input is one clear error before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from fedhet_testing import metric_rows

import fedhet.tune.run as tune_run
from fedhet.cli import main
from fedhet.config import ExperimentConfig, from_dict
from fedhet.errors import ConfigError
from fedhet.tune.budget import sha_shape, tune_block
from fedhet.tune.sweep import plan_tuned_sweep, run_tuned_sweep
from fedhet.yaml_input import JSONDict

SPACE = {"client": {"train.lr": {"type": "log_uniform", "low": -2, "high": -0.5}}}
# 2 clients, 2 rounds: one full run is 4 client-rounds
TINY: JSONDict = {"name": "tsw", "rounds": 2, "model": {"name": "mlp"}, "train": {"local_steps": 2},
                  "data": {"dataset": "offline_digits", "domains": ["clean", "inverted"], "max_test_per_client": 20,
                           "max_train_per_client": 40},
                  "sweep": {"methods": ["fedavg", "fedprox"],
                            "tune": {"budget": "2x", "seeds": [0, 1], "seed": 7, "space": SPACE}}}


def _cfg(tmp_path: Path, **tune: object) -> ExperimentConfig:
    tree = json.loads(json.dumps(TINY))
    tree["run"] = {"out_dir": str(tmp_path), "quiet": True, "num_threads": 1}
    tree["sweep"]["tune"].update(tune)
    cfg = from_dict(ExperimentConfig, tree)
    cfg.validate()
    return cfg


def _read(path: Path) -> JSONDict:
    return json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def test_a_tuned_sweep_writes_the_layout_and_tuned_json(tmp_path: Path) -> None:
    run_tuned_sweep(plan_tuned_sweep(_cfg(tmp_path)), progress=False)
    root = tmp_path / "tsw" / "offline_digits"
    for label in ("fedavg", "fedprox"):
        record = _read(root / f"{label}+tuned-rs" / "tuned.json")
        assert record["budget_client_rounds"] == 8 == record["spent_client_rounds"]  # 2 runs x 2 rounds x 2 clients
        assert (record["method"], record["default_label"], record["tuner"], record["tune_seed"], record["members"]) == (
            label, label, "rs", 7, 2)
        assert set(record["chosen"]) == {"train.lr"} and record["selection"] == "val" and record["diverged"] == 0
        assert 0 <= record["val_score"] <= 1 and record["seeds"] == [0, 1]
        tuning = _read(root / f"{label}+tuned-rs" / "tuning" / "config.yaml")
        assert tuning["seed"] == 7 and tuning["data"]["val_fraction"] == 0.2 and tuning["tune"]["configs"] == 2
        for seed in (0, 1):
            assert (root / label / f"seed{seed}" / "summary.json").is_file()  # the default row
            rerun = root / f"{label}+tuned-rs" / f"seed{seed}"
            config, summary = _read(rerun / "config.yaml"), _read(rerun / "summary.json")
            assert config["label"] == f"{label}+tuned-rs" and config["seed"] == seed == summary["seed"]
            assert config["train"]["lr"] == pytest.approx(record["chosen"]["train.lr"])
            assert config["data"]["val_fraction"] == 0.0 and summary["final"]  # the config's own data: test metrics
    best = root / "fedavg+tuned-rs" / "tuning" / "tune" / "best_config.yaml"
    chosen = _read(root / "fedavg+tuned-rs" / "tuned.json")["chosen"]["train.lr"]
    best.write_text(best.read_text().replace(f"lr: {chosen}", "lr: 0.5"))  # not the choice the re-runs were made with
    with pytest.raises(ConfigError, match=r"seed0 holds a finished run made with another config \(train.lr"):
        run_tuned_sweep(plan_tuned_sweep(_cfg(tmp_path)), progress=False)


@pytest.mark.parametrize("budget, tuner, configs", [("12", "rs", 3), ("3x", "rs", 3), ("3x", "sha", 4)])
def test_the_budget_is_client_rounds_for_every_tuner(tmp_path: Path, budget: str, tuner: str, configs: int) -> None:
    job = plan_tuned_sweep(_cfg(tmp_path, tuners=[tuner]), budget=budget).jobs[0]
    tune = job.tuning.tune
    assert job.budget == 12 and tune["configs"] == configs and tune["budget"] == 6  # 12 client-rounds / 2 clients
    if tuner == "sha":  # 4 configurations for 1 round, then the survivor's second round: 5 of 6 member-rounds
        assert tune["eliminations"] == 1 and tune["wrapper"] == "sha"


def test_sha_keeps_the_papers_shape_where_the_budget_allows() -> None:
    assert sha_shape(800, 4000, 3) == (3, 27)  # the paper's CIFAR-10 budget: 27 -> 9 -> 3 -> 1 (docs/tune.md)
    assert sha_shape(40, 8 * 40, 3) == (3, 27) and sha_shape(2, 6, 3) == (1, 4)  # stages of 7 rounds; of 1
    assert sha_shape(2, 3, 3) is None  # 3 configurations for a round and the survivor's second: 4 > 3


def test_the_fresh_seeds_default_to_three_not_to_the_plain_sweeps_seed(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    del cfg.sweep["tune"]["seeds"]
    cfg.sweep["seeds"] = [5]  # a plain sweep of one seed (the quickstart's): a tuned comparison still runs 3
    assert tune_block(cfg).seeds == [0, 1, 2]
    assert tune_block(cfg, seeds=[4]).seeds == [4]


def test_the_tuning_jobs_keep_the_configs_tune_settings_and_a_lane_runtime(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg.run.runtime, cfg.tune = "batched", {"sampling": "per_member", "clients": "ball", "configs": 50}
    tune = plan_tuned_sweep(cfg).jobs[0].tuning.tune
    assert (tune["sampling"], tune["clients"], tune["configs"]) == ("per_member", "fixed", 2)  # the tuner's win
    assert {j.tuning.run.runtime for j in plan_tuned_sweep(cfg).jobs} == {"batched"}  # population lanes
    cfg.run.runtime = "flower"
    assert {j.tuning.run.runtime for j in plan_tuned_sweep(cfg).jobs} == {"inprocess"}


def test_lanes_tune_where_the_rule_allows_and_in_process_where_it_refuses(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, lanes=True, seeds=[0])
    cfg.sweep["methods"], cfg.model.args = ["fedavg"], {"dropout": 0.3}  # dropout: refused by the batched rule
    plan = plan_tuned_sweep(cfg)
    assert plan.jobs[0].tuning.run.runtime == "batched"
    run_tuned_sweep(plan, progress=False)
    tuning = tmp_path / "tsw" / "offline_digits" / "fedavg+tuned-rs" / "tuning"
    assert _read(tuning / "config.yaml")["run"]["runtime"] == "inprocess" and (tuning / "summary.json").is_file()
    again = plan_tuned_sweep(cfg).jobs[0]  # finished in-process: it stays so (not "made with another config")
    assert again.tuning.run.runtime == "inprocess" and again.status() == "finished"


def test_check_lists_the_tuning_jobs_and_their_re_runs_and_runs_nothing(tmp_path: Path, capsys) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "run": {"out_dir": str(tmp_path / "runs")}}))
    assert main(["sweep", str(config), "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tuning = [line for line in lines if "tuning seed 7" in line]
    assert len(tuning) == 2 and all(line.startswith("new") and "8 client-rounds" in line for line in tuning)
    assert sum(line.startswith("waiting") and "+tuned-rs" in line for line in lines) == 4  # 2 labels x 2 seeds
    assert not (tmp_path / "runs").exists()


class Killed(Exception):
    """A stop in the middle of a tuning job (a crash or a kill)."""


def test_an_interrupted_tuned_sweep_resumes_to_the_uninterrupted_result(tmp_path: Path, monkeypatch) -> None:
    run_tuned_sweep(plan_tuned_sweep(_cfg(tmp_path / "whole", seeds=[0])), progress=False)
    real, calls = tune_run.run_tuning, []

    def stopping(cfg: ExperimentConfig, *args: object, **kwargs: object):
        calls.append((cfg.label, kwargs["resume"]))

        def kill(phase: str, rnd: int) -> None:
            if cfg.method == "fedprox" and (phase, rnd) == ("checkpoint_saved", 1):
                raise Killed
        return real(cfg, *args, **kwargs, on_phase=kill if len(calls) == 2 else None)

    monkeypatch.setattr(tune_run, "run_tuning", stopping)
    with pytest.raises(Killed):
        run_tuned_sweep(plan_tuned_sweep(_cfg(tmp_path / "parts", seeds=[0])), progress=False)
    parts = tmp_path / "parts" / "tsw" / "offline_digits"
    finished = (parts / "fedavg+tuned-rs" / "tuning" / "summary.json").stat().st_mtime_ns
    run_tuned_sweep(plan_tuned_sweep(_cfg(tmp_path / "parts", seeds=[0])), progress=False)
    assert calls == [("fedavg+tuned-rs", False), ("fedprox+tuned-rs", False), ("fedprox+tuned-rs", True)]
    assert (parts / "fedavg+tuned-rs" / "tuning" / "summary.json").stat().st_mtime_ns == finished
    whole = tmp_path / "whole" / "tsw" / "offline_digits"
    for label in ("fedavg+tuned-rs", "fedprox+tuned-rs"):
        a, b = _read(whole / label / "tuned.json"), _read(parts / label / "tuned.json")
        assert {**a, "wall_s": 0} == {**b, "wall_s": 0}
        tune_log = "tuning/tune/members.jsonl"
        assert (whole / label / tune_log).read_text() == (parts / label / tune_log).read_text()
        assert metric_rows(whole / label / "seed0") == metric_rows(parts / label / "seed0")  # but train_time_s
        assert _read(whole / label / "seed0" / "summary.json")["final"] == _read(
            parts / label / "seed0" / "summary.json")["final"]


@pytest.mark.parametrize("args, match", [
    (["--tune", "1"], "tune budget of 1 client-rounds is below one run of 'fedavg'"),
    (["--tune", "eight"], "give full runs' worth as NUMx"),
    (["--tune", "2x", "sweep.tune.space={client: {data.alpha: {type: uniform, low: 0.1, high: 1}}}"],
     "data.alpha"),
    (["--tune", "2x", "sweep.tune.space={client: {train.lr: {type: log_uniform, low: -1, high: -2}}}"],
     r"low \(-1\) must be below high \(-2\)"),
    (["--tune", "2x", "sweep.tune.space={client: {train.momentum: {type: uniform, low: 0.5, high: 1.5}}}"],
     "train.momentum"),
    (["--tune", "2x", "--methods", "fedavg,fedd3"], "cannot tune 'fedd3': method fedd3 is one-shot"),
    (["--tune", "2x", "--methods", "fedavg,all"], "cannot tune 'all': method all is centralized"),
    (["--tune", "2x", "sweep.tune.seed=1"], "the tuning seed 1 is among the fresh seeds"),
    (["--tune", "2x", "sweep.tune.tuners=[rs,hyperband]"], "unknown tuner.*'hyperband'.*valid: fedpop, rs, sha"),
    (["--tune", "2x", "sweep.tune.budgets=3"], "unknown sweep.tune key 'budgets'"),
    (["--tune", "2x", "privacy.dp.mode=server", "privacy.dp.delta=0.01", "privacy.dp.max_epsilon=1"],
     r"fedavg\+tuned-rs .*plans 4 member-rounds .* > privacy.dp.max_epsilon 1; nothing was run"),
])
def test_each_bad_input_is_one_clear_error_and_nothing_runs(tmp_path: Path, capsys, args: list[str],
                                                           match: str) -> None:
    config = tmp_path / "tiny.yaml"
    tree = json.loads(json.dumps(TINY))
    tree["sweep"]["tune"].pop("budget")
    config.write_text(yaml.safe_dump({**tree, "run": {"out_dir": str(tmp_path / "runs")}}))
    assert main(["sweep", str(config), "-q", *args]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(match, err), err
    assert not (tmp_path / "runs").exists()

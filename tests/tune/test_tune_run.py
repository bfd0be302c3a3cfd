"""`fedhet tune` end to end (FedPop runner S8-S11): a stopped job resumes to exactly the uninterrupted result,
SHA keeps 27 -> 9 -> 3 -> 1, the results directory is a normal run directory with a runnable best config,
and bad starts are one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tune_testing import BASE

from fedhet.config import load_config
from fedhet.errors import CheckpointError, FedhetError
from fedhet.report import write_report
from fedhet.report.runs import load_runs
from fedhet.report.table import make_table, to_markdown
from fedhet.tune.checkpoint import FILENAME, load_population
from fedhet.tune.run import run_tuning


def tuned(run_dir: Path, *extra: str, **kwargs):
    return run_tuning(load_config(None, [*BASE, *extra]), run_dir, progress=False, **kwargs)


def test_a_stopped_job_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    whole = tuned(tmp_path / "whole")
    stopped = tuned(tmp_path / "parts", stop_after=2)
    assert stopped.rounds_completed == 2 and not stopped.summary
    resumed = tuned(tmp_path / "parts", resume=True)
    assert resumed.summary["final"] == whole.summary["final"] and resumed.summary["tune"] == whole.summary["tune"]
    for name in ("metrics.jsonl", "tune/members.jsonl", "tune/best_config.yaml"):
        assert (tmp_path / "parts" / name).read_text() == (tmp_path / "whole" / name).read_text()
    cfg = load_config(None, BASE)
    a = load_population(tmp_path / "whole" / "checkpoints" / FILENAME, cfg).members
    b = load_population(tmp_path / "parts" / "checkpoints" / FILENAME, cfg).members
    assert all(torch.equal(x.server.model[k], y.server.model[k]) for x, y in zip(a, b, strict=True)
               for k in x.server.model)
    assert any(m.parent is not None for m in a)  # FedPop-G copied members (T_g = 2)


def test_sha_keeps_the_best_third_three_times(tmp_path: Path) -> None:
    result = tuned(tmp_path, "tune.wrapper=sha", "tune.configs=27", "tune.clients=fixed", "tune.fedpop_l=false",
                   "tune.fedpop_g=false")
    rows = [json.loads(line) for line in (tmp_path / "tune" / "members.jsonl").read_text().splitlines()]
    alive = [sum(r["alive"] for r in rows if r["round"] == rnd) for rnd in (1, 2, 3, 4)]
    assert alive == [9, 3, 1, 1]  # eliminations after rounds 1, 2 and 3 (R_c t / 4)
    survivor = next(r["slot"] for r in rows if r["round"] == 4 and r["alive"])
    assert result.summary["tune"]["selected"] == survivor and result.summary["label"] == "fedavg+sha+none"


def test_the_results_are_a_run_directory_with_a_runnable_best_config(tmp_path: Path) -> None:
    result = tuned(tmp_path)
    runs = load_runs(tmp_path)
    assert len(runs) == 1 and runs[0].label == "fedavg+rs+fedpop" and runs[0].final == result.summary["final"]
    assert "fedavg+rs+fedpop" in to_markdown(make_table(runs))
    report = write_report(tmp_path, tmp_path / "report").markdown.read_text()
    assert "## Tuning" in report and "fedavg+rs+fedpop (seed 0)" in report
    plot = tmp_path / "report" / "hp_offline_digits_fedavg+rs+fedpop_seed0.png"
    assert plot.is_file() and f"]({plot.name})" in report
    rows = [json.loads(line) for line in (tmp_path / "tune" / "members.jsonl").read_text().splitlines()]
    first = [r for r in rows if r["round"] == 1]  # the Delta-ball's beta^k its active clients trained with
    assert all(r["local"] and all(set(b) == {"train.lr", "train.batch_size"} for b in r["local"]) for r in first)
    assert any(b["train.lr"] != r["train.lr"] for r in first for b in r["local"])
    best = load_config(str(tmp_path / "tune" / "best_config.yaml"))
    values = result.summary["tune"]["values"]
    assert (best.train.lr, best.train.batch_size, best.server.lr) == (
        pytest.approx(values["train.lr"]), values["train.batch_size"], pytest.approx(values["server.lr"]))
    assert best.tune == {} and best.label == ""


def test_bad_starts_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FedhetError, match="fedhet tune runs its members in this process"):
        tuned(tmp_path / "a", "run.runtime=flower")
    tuned(tmp_path / "b", stop_after=1)
    with pytest.raises(FedhetError, match="already holds a checkpoint: pass --resume"):
        tuned(tmp_path / "b")
    with pytest.raises(CheckpointError, match=r"made with another config \(tune: .*split.*rank"):
        tuned(tmp_path / "b", "tune.split=rank", resume=True)
    with pytest.raises(CheckpointError, match="no population checkpoint"):
        tuned(tmp_path / "c", resume=True)


def test_the_command_stops_resumes_and_names_the_best_config(tmp_path: Path, capsys) -> None:
    from fedhet.cli import main

    args = ["tune", "--quiet", "--run-dir", str(tmp_path), *BASE]
    assert main([*args, "--stop-after", "1"]) == 0
    assert "stopped after round 1; continue with --resume" in capsys.readouterr().out
    assert main([*args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "best configuration (member" in out and "fedhet run" in out and "best_config.yaml" in out
    assert main(["tune", "--quiet", "--run-dir", str(tmp_path / "x"), *BASE, "tune.wraper=sha"]) == 2
    assert "did you mean 'wrapper'" in capsys.readouterr().err


def test_sha_stages_fit_the_budget_and_random_search_checks_it() -> None:
    from fedhet.errors import ConfigError
    from fedhet.tune.wrappers import check_rs_budget, sha_rounds

    # the paper's CIFAR-10 budget: R_t 4000, R_c 800, 27 -> 9 -> 3 -> 1: (26 + 8 + 2) s + 800 <= 4000
    assert sha_rounds(800, 3, 27, 3, budget=4000) == [88, 176, 264]
    assert sha_rounds(20, 3, 27, 3) == [5, 10, 15]  # no budget: evenly over R_c
    with pytest.raises(ConfigError, match="do not fit rounds=800 and tune.budget=820"):
        sha_rounds(800, 3, 27, 3, budget=820)
    check_rs_budget(5, 800, 4000)
    with pytest.raises(ConfigError, match="set rounds to 800"):
        check_rs_budget(5, 900, 4000)


class HardKill(BaseException):
    """Stands in for kill -9: nothing of the job's handlers runs."""


@pytest.mark.parametrize("where", ["mid_round", "before_checkpoint", "after_checkpoint"])
def test_a_job_killed_anywhere_resumes_to_the_uninterrupted_result(tmp_path: Path, monkeypatch, where: str) -> None:
    import fedhet.tune.population as population
    import fedhet.tune.run as run

    whole = tuned(tmp_path / "whole")
    real_fit, real_save = population.aggregate_round, run.save_population
    calls = {"fit": 0}

    def fit(*args, **kwargs):  # round 3: the first member aggregates, the kill comes before the second
        calls["fit"] += 1
        if where == "mid_round" and calls["fit"] == 2 * 3 + 2:
            raise HardKill
        return real_fit(*args, **kwargs)

    def save(path, cfg, saved):
        if where == "before_checkpoint" and saved.round == 3:
            raise HardKill  # round 3's member-log lines are written, its checkpoint is not
        real_save(path, cfg, saved)
        if where == "after_checkpoint" and saved.round == 3:
            raise HardKill  # the checkpoint is written, metrics.jsonl is not
    monkeypatch.setattr(population, "aggregate_round", fit)
    monkeypatch.setattr(run, "save_population", save)
    with pytest.raises(HardKill):
        tuned(tmp_path / "killed")
    monkeypatch.undo()
    resumed = tuned(tmp_path / "killed", resume=True)
    assert resumed.summary["final"] == whole.summary["final"] and resumed.summary["tune"] == whole.summary["tune"]
    for name in ("metrics.jsonl", "tune/members.jsonl"):
        assert (tmp_path / "killed" / name).read_text() == (tmp_path / "whole" / name).read_text()


def test_a_space_of_server_values_only_runs_with_fedpop(tmp_path: Path) -> None:
    result = tuned(tmp_path, "tune.space={server: {server.lr: {type: log_uniform, low: -0.3, high: 0.3}}}")
    assert set(result.summary["tune"]["values"]) == {"server.lr"} and result.summary["tune"]["tuner"] == "fedpop"


def test_sha_with_fedpop_g_on_its_elimination_rounds(tmp_path: Path) -> None:
    """T_g = 1 round: FedPop-G runs in every round, SHA's eliminations included; SHA ranks the trained
    configurations first, then FedPop-G acts among the survivors (it used to score a just-copied member)."""
    tuned(tmp_path, "tune.wrapper=sha", "tune.configs=9", "tune.eliminations=2", "tune.g_interval=0.25")
    rows = [json.loads(line) for line in (tmp_path / "tune" / "members.jsonl").read_text().splitlines()]
    assert [sum(r["alive"] for r in rows if r["round"] == rnd) for rnd in (1, 2, 3, 4)] == [3, 3, 1, 1]
    assert any(r["born"] == 1 and r["alive"] for r in rows if r["round"] == 1)  # FedPop-G copied a survivor

"""The report reads what a real tuned sweep writes (fedhet.tune.sweep): its rows, and an anytime curve that ends at
the client-rounds tuned.json says were spent. Slow: it trains (2 methods, 2 rounds, a budget of 2 runs each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedhet.config import ExperimentConfig, from_dict
from fedhet.report import load_runs, tuned_rows, write_report
from fedhet.report.anytime import MEMBERS_LOG, anytime_curve
from fedhet.yaml_input import JSONDict

SPACE = {"client": {"train.lr": {"type": "log_uniform", "low": -2, "high": -0.5}}}


@pytest.mark.slow
def test_the_report_reads_a_real_tuned_sweep(tmp_path: Path) -> None:
    from fedhet.tune.sweep import plan_tuned_sweep, run_tuned_sweep

    tree: JSONDict = {"name": "tsw", "rounds": 2, "model": {"name": "mlp"}, "train": {"local_steps": 2},
                      "data": {"dataset": "offline_digits", "domains": ["clean", "inverted"],
                               "max_test_per_client": 20, "max_train_per_client": 40},
                      "run": {"out_dir": str(tmp_path), "quiet": True, "num_threads": 1},
                      "sweep": {"methods": ["fedavg", "fedprox"],
                                "tune": {"budget": "2x", "seeds": [0, 1], "seed": 7, "space": SPACE}}}
    cfg = from_dict(ExperimentConfig, tree)
    cfg.validate()
    dirs = run_tuned_sweep(plan_tuned_sweep(cfg), progress=False)
    rows = tuned_rows(load_runs(dirs))
    assert [(r.method, r.tuner) for r in rows] == [("fedavg", "rs"), ("fedprox", "rs")]
    for row in rows:
        assert row.default is not None and row.tuned is not None
        assert row.default.seeds == (0, 1) == row.tuned.seeds
        spent = json.loads((row.folder / "tuned.json").read_text())["spent_client_rounds"]
        xs, ys = anytime_curve(row.folder / "tuning" / MEMBERS_LOG)
        assert xs[-1] == spent == 8 and ys == sorted(ys, reverse=True)
    text = write_report(dirs, tmp_path / "report").markdown.read_text()
    assert "| fedavg | " in text and "| rs | 8 / 8 |" in text and (tmp_path / "report" / "anytime_rs.png").is_file()

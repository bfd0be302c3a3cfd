"""A report averages only seeds of one experiment: runs that differ in any results-relevant key (rounds
included) are separate, labelled columns."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedhet.report import load_runs, make_table, write_report
from fedhet.report.experiments import experiment_keys, split_experiments


def _set(run: Path, **keys: object) -> Path:
    config = yaml.safe_load((run / "config.yaml").read_text())
    for dotted, value in keys.items():
        section, _, key = dotted.partition("__")
        if key:
            config.setdefault(section, {})[key] = value
        else:
            config[section] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def test_runs_with_other_models_are_not_averaged(make_run) -> None:
    runs = [_set(make_run("fedbn", s, {"c": acc, "avg": acc}), model__name=model)
            for s, (acc, model) in enumerate([(0.1, "small_cnn"), (0.2, "small_cnn"), (0.9, "digits_cnn")])]
    table = make_table(load_runs(runs)).datasets[0]
    assert table.columns == ["fedbn [model.name=small_cnn]", "fedbn [model.name=digits_cnn]"]
    assert table.cells[("avg", "fedbn [model.name=small_cnn]")].n == 2
    assert table.cells[("avg", "fedbn [model.name=digits_cnn]")].mean == pytest.approx(0.9)


def test_runs_of_other_lengths_are_not_seeds_of_one_experiment(make_run, tmp_path: Path) -> None:
    runs = [make_run("fedavg", 0, {"avg": 0.75}, rounds=6), make_run("fedavg", 1, {"avg": 0.65}, rounds=4)]
    text = write_report(runs, tmp_path / "out").markdown.read_text()
    assert "fedavg [rounds=6]" in text and "fedavg [rounds=4]" in text
    assert "**Not averaged together.** Runs of fedavg on digits differ in more than the seed" in text
    assert "70.00" not in text  # the mean of the two would be 70.00


def test_seeds_threads_and_folders_do_not_split(make_run) -> None:
    runs = [_set(make_run("fedavg", s, {"avg": 0.5}), run__num_threads=s + 1, run__out_dir=f"r{s}",
                 data__root=f"/d{s}", name=f"n{s}") for s in range(3)]
    records = load_runs(runs)
    assert [r.label for r in split_experiments(records)] == ["fedavg"] * 3
    assert make_table(records).datasets[0].cells[("avg", "fedavg")].n == 3


def test_a_key_missing_from_an_older_run_counts_as_its_default(make_run) -> None:
    runs = [make_run("fedavg", 0, {"avg": 0.5}), _set(make_run("fedavg", 1, {"avg": 0.5}), train__lr=0.01)]
    assert experiment_keys(load_runs(runs[:1])[0].config)["train.lr"] == 0.01
    assert [r.label for r in split_experiments(load_runs(runs))] == ["fedavg", "fedavg"]


def test_split_is_idempotent(make_run) -> None:
    runs = load_runs([make_run("fedavg", 0, {"avg": 0.5}, rounds=2), make_run("fedavg", 1, {"avg": 0.5}, rounds=3)])
    once = split_experiments(runs)
    assert [r.label for r in split_experiments(once)] == [r.label for r in once]


def test_leaderboard_ranks_methods_across_datasets(make_run, tmp_path: Path) -> None:
    runs = [make_run(m, 0, {"avg": acc}, dataset=d) for d, scores in
            (("digits", {"fedavg": 0.5, "fedbn": 0.7, "single": 0.6}), ("pacs", {"fedavg": 0.4, "fedbn": 0.3,
                                                                                 "single": 0.2}))
            for m, acc in scores.items()]
    text = write_report(runs, tmp_path / "out").markdown.read_text()
    assert "## Across datasets" in text
    # fedbn ranks 1 and 2, fedavg 3 and 1, single 2 and 3
    assert "| fedbn | 1.50 | 2 |" in text and "| fedavg | 2.00 | 2 |" in text and "| single | 2.50 | 2 |" in text

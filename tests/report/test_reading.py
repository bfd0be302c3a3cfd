"""The sentence under a results table is read off its cells: leader, margins, local baseline, noise."""

from __future__ import annotations

import math

from fedhet.report.reading import read_table
from fedhet.report.table import AVG, Cell, DatasetTable


def table(means: dict[str, float], n: int = 1, std: float = math.nan) -> DatasetTable:
    cells = {(AVG, m): Cell(v, std, n) for m, v in means.items()}
    return DatasetTable("digits", ["a", AVG], list(means), cells)


def test_names_the_leader_and_its_margins() -> None:
    text = read_table(table({"single": 0.50, "fedavg": 0.20, "fedbn": 0.55, "fraug": 0.60}))
    assert text.startswith("On digits, fraug has the highest average accuracy over clients (60.0%), "
                           "5.0 points above fedbn and 10.0 points above training on each client's own data alone")
    assert "fedavg is lowest (20.0%)" in text and "One seed" in text


def test_local_training_winning_is_said_plainly() -> None:
    text = read_table(table({"single": 0.83, "fedavg": 0.47, "fedbn": 0.61, "all": 0.88}))
    assert "single has the highest" in text and "No federated method beats local training" in text
    assert "(all, not federated) reaches 88.0%" in text and "all has the highest" not in text


def test_seeds_decide_whether_the_lead_is_noise() -> None:
    close = read_table(table({"fedbn": 0.60, "fraug": 0.61}, n=3, std=0.02))
    clear = read_table(table({"fedbn": 0.50, "fraug": 0.61}, n=3, std=0.02))
    assert "within one standard deviation" in close and "larger than one standard deviation" in clear


def test_nothing_to_compare() -> None:
    assert read_table(table({"fedavg": 0.5})) == ""


def test_the_report_prints_the_reading_under_the_accuracy_table(make_run, tmp_path) -> None:
    from fedhet.report import write_report

    runs = [make_run("single", 0, {"a": 0.5, "b": 0.6, "avg": 0.55}),
            make_run("fedbn", 0, {"a": 0.7, "b": 0.8, "avg": 0.75})]
    text = write_report(runs, tmp_path / "out").markdown.read_text()
    reading = "**Reading.** On digits, fedbn has the highest average accuracy over clients (75.0%), 20.0 points"
    assert reading in text
    assert text.index(reading) < text.index("balanced_accuracy (%)") and text.count("**Reading.**") == 1

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


def test_the_report_reads_every_metric_under_its_table(make_run, tmp_path) -> None:
    from fedhet.report import write_report

    runs = [make_run("single", 0, {"a": 0.5, "b": 0.6, "avg": 0.55}),
            make_run("fedbn", 0, {"a": 0.7, "b": 0.8, "avg": 0.75})]
    text = write_report(runs, tmp_path / "out").markdown.read_text()
    reading = ("**Reading (accuracy).** On digits, fedbn has the highest average accuracy over clients (75.0%), "
               "20.0 points")
    balanced = "**Reading (balanced_accuracy).** On digits, fedbn has the highest average balanced accuracy"
    assert reading in text and balanced in text
    assert text.index(reading) < text.index("balanced_accuracy (%)") < text.index(balanced)


def test_a_lower_is_better_metric_is_read_the_right_way() -> None:
    text = read_table(table({"fedavg": 0.9, "fedbn": 0.4}), percent=False, metric="loss", lower_is_better=True)
    assert text.startswith("On digits, fedbn has the lowest average loss over clients (0.400), 0.500 below fedavg")


def test_the_best_two_are_compared_paired_over_seeds() -> None:
    t = DatasetTable("digits", ["avg"], ["fraug", "fedbn"])
    t.cells[("avg", "fraug")] = Cell(0.62, 0.02, 3, (0, 1, 2), values=(0.60, 0.62, 0.64))
    t.cells[("avg", "fedbn")] = Cell(0.60, 0.02, 3, (0, 1, 2), values=(0.59, 0.60, 0.61))
    text = read_table(t)
    # differences 0.01, 0.02, 0.03: mean 2.0 points, std 1.0, t(0.975, 2) = 4.3027 -> +-2.48 points;
    # t = 2 / (1 / sqrt 3) = 3.464 on 2 dof -> two-sided p = 0.0742 (scipy.stats.ttest_rel agrees)
    assert "fraug − fedbn = +2.00 points (95% CI -0.48 to +4.48, paired t-test p = 0.0742, seeds 0, 1, 2)" in text
    assert "the interval includes 0" in text

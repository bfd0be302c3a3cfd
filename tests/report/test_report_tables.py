"""Report: loading run dirs, mean ± std tables against hand computations, CSV, plots, errors."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from fedhet.errors import FedhetError
from fedhet.report import (
    find_run_dirs,
    load_run,
    load_runs,
    make_table,
    mean_std,
    plot_curves,
    to_csv,
    to_markdown,
    write_report,
)


@pytest.fixture
def runs(make_run):
    # fedavg: mnist 0.80/0.85/0.90 -> mean 0.85, sample std 0.05; svhn 0.50/0.60/0.70 -> 0.60 ± 0.10
    # fedbn:  mnist 0.70/0.74 -> mean 0.72, sample std sqrt(2 * 0.02^2 / 1) = 0.028284; svhn 0.90/0.80
    dirs = [
        make_run("fedavg", 0, {"mnist": 0.80, "svhn": 0.50, "avg": 0.65}, curve=[0.3, 0.5, 0.65]),
        make_run("fedavg", 1, {"mnist": 0.85, "svhn": 0.60, "avg": 0.725}, curve=[0.4, 0.6, 0.725]),
        make_run("fedavg", 2, {"mnist": 0.90, "svhn": 0.70, "avg": 0.80}, curve=[0.5, 0.7, 0.80]),
        make_run("fedbn", 0, {"mnist": 0.70, "svhn": 0.90, "avg": 0.80}, curve=[0.5, 0.8]),
        make_run("fedbn", 1, {"mnist": 0.74, "svhn": 0.80, "avg": 0.77}, curve=[0.6, 0.77]),
        make_run("fedavg", 0, {"amazon": 0.5, "avg": 0.5}, dataset="office", curve=[0.5]),
    ]
    return [load_run(d) for d in dirs]


def test_mean_std_sample() -> None:
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)  # ddof=1: sqrt(2/2)
    m, s = mean_std([4.0])
    assert m == 4.0 and math.isnan(s)


def test_load_run(runs) -> None:
    r = runs[0]
    assert (r.method, r.dataset, r.seed, r.rounds_completed, r.rounds, r.wall_time_s) == (
        "fedavg",
        "digits",
        0,
        3,
        3,
        1.5,
    )
    assert r.name == "fedavg-digits" and r.config["data"]["dataset"] == "digits"
    assert r.clients == ["mnist", "svhn", "avg"]
    assert r.final["mnist"]["accuracy"] == 0.80
    assert r.curve("accuracy") == ([1, 2, 3], [0.3, 0.5, 0.65])
    assert r.metrics[0].num_examples == 10 and r.metrics[0].values["loss"] == pytest.approx(0.7)


def test_table_mean_std_hand_computed(runs) -> None:
    table = make_table(runs, "accuracy")
    assert [t.dataset for t in table.datasets] == ["digits", "office"]
    digits = table.datasets[0]
    assert digits.rows == ["mnist", "svhn", "avg"]
    assert digits.columns == ["fedavg", "fedbn"]
    c = digits.cells[("mnist", "fedavg")]
    assert (c.n, c.seeds) == (3, (0, 1, 2))
    assert c.mean == pytest.approx(0.85) and c.std == pytest.approx(0.05)
    c = digits.cells[("mnist", "fedbn")]
    assert c.mean == pytest.approx(0.72) and c.std == pytest.approx(math.sqrt(2 * 0.02**2))
    c = digits.cells[("svhn", "fedavg")]
    assert c.mean == pytest.approx(0.60) and c.std == pytest.approx(0.10)
    office = table.datasets[1]
    assert office.cells[("amazon", "fedavg")].n == 1 and math.isnan(office.cells[("amazon", "fedavg")].std)


def test_markdown_bold_best(runs) -> None:
    md = to_markdown(make_table(runs, "accuracy"))
    assert "### digits: accuracy (%)" in md
    assert "| mnist | **85.00 ± 5.00** (n=3) | 72.00 ± 2.83 (n=2) |" in md
    assert "| svhn | 60.00 ± 10.00 (n=3) | **85.00 ± 7.07** (n=2) |" in md
    # avg: fedavg 0.725 vs fedbn 0.785
    assert "| **avg** | 72.50 ± 7.50 (n=3) | **78.50 ± 2.12** (n=2) |" in md
    # a single method: nothing to compare, no bold; n=1 has no std
    assert "| amazon | 50.00 (n=1) |" in md
    assert "sample std (ddof=1)" in md


def test_loss_lower_is_better(runs) -> None:
    md = to_markdown(make_table(runs, "loss"))
    assert "### digits: loss\n" in md
    assert "| mnist | **0.15 ± 0.05** (n=3) | 0.28 ± 0.03 (n=2) |" in md


def test_reference_columns(runs) -> None:
    ref = {"mnist": {"fedbn": (98.3, 0.1), "fedprox": 97.0}, "avg": {"fedbn": [86.8, 0.5]}}
    table = make_table(runs, "accuracy", reference=ref)
    digits = table.datasets[0]
    assert digits.columns == ["fedavg", "fedbn", "fedbn (paper)", "fedprox (paper)"]
    assert digits.cells[("mnist", "fedbn (paper)")].mean == pytest.approx(0.983)
    md = to_markdown(table)
    # paper values take no part in "best"
    assert "| mnist | **85.00 ± 5.00** (n=3) | 72.00 ± 2.83 (n=2) | 98.30 ± 0.10 | 97.00 |" in md
    assert "| svhn | 60.00 ± 10.00 (n=3) | **85.00 ± 7.07** (n=2) | – | – |" in md
    only = make_table(runs, "accuracy", reference=ref, reference_dataset="office")
    assert only.datasets[0].columns == ["fedavg", "fedbn"]
    assert only.datasets[1].columns == ["fedavg", "fedbn (paper)", "fedprox (paper)"]


def test_group_by_name(make_run) -> None:
    runs = [load_run(make_run("fedavg", 0, {"a": 0.5, "avg": 0.5}))]
    assert make_table(runs, by="name").datasets[0].columns == ["fedavg-digits"]
    with pytest.raises(FedhetError, match="by must be"):
        make_table(runs, by="seed")


def test_csv(runs, tmp_path: Path) -> None:
    path = to_csv(make_table(runs, "accuracy"), tmp_path / "out" / "t.csv")
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["dataset", "metric", "client", "method", "source", "mean", "std", "n", "seeds", "best",
                             "ci95_low", "ci95_high"]
    got = {(r["dataset"], r["client"], r["method"]): r for r in rows}
    r = got[("digits", "mnist", "fedavg")]
    assert float(r["mean"]) == pytest.approx(0.85) and float(r["std"]) == pytest.approx(0.05)
    assert (r["n"], r["seeds"], r["best"], r["source"]) == ("3", "0;1;2", "1", "run")
    half = 4.302653 * 0.05 / 3 ** 0.5  # t(0.975, 2 dof) * std / sqrt(n), by hand
    assert float(r["ci95_low"]) == pytest.approx(0.85 - half, abs=1e-6)
    assert float(r["ci95_high"]) == pytest.approx(0.85 + half, abs=1e-6)
    assert got[("digits", "mnist", "fedbn")]["best"] == "0"
    assert got[("office", "amazon", "fedavg")]["std"] == ""
    assert len(rows) == 3 * 2 + 2
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_plot_curves(runs, tmp_path: Path) -> None:
    path = plot_curves(runs, tmp_path / "c.png")
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curve_stats(runs) -> None:
    from fedhet.report import curve_stats

    rounds, means, stds, n = curve_stats(runs[:3])
    assert rounds == [1, 2, 3] and n == [3, 3, 3]
    assert means[0] == pytest.approx(0.4) and stds[0] == pytest.approx(0.1)


def test_write_report_from_parent_dir(runs, tmp_path: Path) -> None:
    out = tmp_path / "report"
    paths = write_report(tmp_path / "runs", out)
    assert {p.name for p in paths} == {"report.md", "report.csv", "curves.png"}
    md = paths.markdown.read_text()
    assert "**85.00 ± 5.00** (n=3)" in md and "![learning curves](curves.png)" in md
    assert "balanced_accuracy (%)" in md and "| `../runs/digits_fedavg_s0` | digits | fedavg | 0 | 3/3 |" in md
    metrics = {row["metric"] for row in csv.DictReader(paths.csv.open())}
    assert metrics == {"accuracy", "balanced_accuracy"}
    assert paths.curves.stat().st_size > 0


def test_find_run_dirs(runs, tmp_path: Path) -> None:
    parent = tmp_path / "runs"
    found = find_run_dirs([parent, parent / "digits_fedbn_s0"])
    assert len(found) == 6 and found == sorted(found)
    assert find_run_dirs(parent / "digits_fedbn_s0") == [parent / "digits_fedbn_s0"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedhetError, match="no run directories"):
        load_runs(tmp_path / "empty")
    with pytest.raises(FedhetError, match="does not exist"):
        find_run_dirs(tmp_path / "nope")


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(FedhetError, match="not a run directory"):
        load_run(tmp_path)
    with pytest.raises(FedhetError, match="not a directory"):
        load_run(tmp_path / "missing")


def test_corrupt_summary(make_run) -> None:
    run = make_run("fedavg", 0, {"a": 0.5})
    (run / "summary.json").write_text('{"method": "fedavg", "dataset": ')
    with pytest.raises(FedhetError, match=r"corrupt JSON in .*summary\.json \(line 1"):
        load_run(run)
    (run / "summary.json").write_text(json.dumps({"method": "fedavg", "seed": 0, "final": {}}))
    with pytest.raises(FedhetError, match="lacks key.*dataset"):
        load_run(run)
    (run / "summary.json").write_text(json.dumps({"method": "m", "dataset": "d", "seed": 0, "final": [1]}))
    with pytest.raises(FedhetError, match="'final' must map"):
        load_run(run)


def test_corrupt_metrics(make_run) -> None:
    run = make_run("fedavg", 0, {"a": 0.5}, curve=[0.1, 0.2])
    lines = (run / "metrics.jsonl").read_text().splitlines()
    # a truncated last line (killed run) is dropped
    (run / "metrics.jsonl").write_text("\n".join([*lines, lines[0][:15]]))
    assert load_run(run).curve("accuracy", client="a") == ([1, 2], [0.1, 0.2])
    # corruption elsewhere is an error naming the line
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "{oops", lines[1]]))
    with pytest.raises(FedhetError, match=r"metrics\.jsonl line 2"):
        load_run(run)
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "split": "test"}) + "\n")
    with pytest.raises(FedhetError, match="round, client, split"):
        load_run(run)


def test_corrupt_config(make_run) -> None:
    run = make_run("fedavg", 0, {"a": 0.5})
    (run / "config.yaml").write_text("name: [unclosed\n")
    with pytest.raises(FedhetError, match="corrupt YAML"):
        load_run(run)


def test_empty_runs() -> None:
    with pytest.raises(FedhetError, match="no runs"):
        make_table([])

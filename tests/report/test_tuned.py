"""The report of a tuned sweep: default vs tuned side by side, what tuning spent and chose, the ordering sentence
and the anytime plot, on a hand-written runs tree in the layout of issue 40's contract."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from fedhet.errors import FedhetError
from fedhet.report import load_runs, write_report
from fedhet.report.anytime import anytime_curve
from fedhet.report.table import Cell
from fedhet.report.tuned import TunedRow, read_ordering, row_line, tuned_readings, tuned_rows

STAND_IN = "small_cnn instead of the paper's ResNet"


def write_run(path: Path, method: str, label: str, seed: int, accuracy: float, tune: bool = False) -> None:
    path.mkdir(parents=True)
    config = {"name": "quick", "method": method, "label": label, "seed": seed, "rounds": 4,
              "data": {"dataset": "digits"}, "stand_in": STAND_IN, **({"tune": {"wrapper": "rs"}} if tune else {})}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"method": method, "dataset": "digits", "seed": seed, "label": label, "rounds_completed": 4,
               "final": {"a": {"accuracy": accuracy}, "avg": {"accuracy": accuracy}}, "wall_time_s": 2.0,
               **({"tune": {"wrapper": "rs", "tuner": "none", "values": {}}} if tune else {})}
    (path / "summary.json").write_text(json.dumps(summary))


MEMBER_LOG = [  # 2 members x 3 clients; member 1 diverges in round 2 and trains no more
    {"round": 1, "slot": 0, "alive": True, "score": 0.9, "local": [{}, {}, {}]},
    {"round": 1, "slot": 1, "alive": True, "score": 0.8, "local": [{}, {}, {}]},
    {"round": 2, "slot": 0, "alive": True, "score": 0.7, "local": [{}, {}, {}]},
    {"round": 2, "slot": 1, "alive": False, "score": math.inf, "local": [{}, {}, {}]},
    {"round": 3, "slot": 0, "alive": True, "score": 0.75, "local": [{}, {}, {}]},
    {"round": 3, "slot": 1, "alive": False, "score": math.inf, "local": []},
]


def write_tuned(folder: Path, method: str, seeds_acc: dict[int, float]) -> None:
    label = folder.name
    for seed, acc in seeds_acc.items():
        write_run(folder / f"seed{seed}", method, label, seed, acc)
    write_run(folder / "tuning", method, label, 1000, 0.5, tune=True)
    (folder / "tuning" / "tune").mkdir()
    (folder / "tuning" / "tune" / "members.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MEMBER_LOG))
    info = {"method": method, "label": label, "default_label": method, "tuner": "rs", "budget_client_rounds": 18,
            "spent_client_rounds": 15, "wall_s": 123.4, "tune_seed": 1000, "seeds": list(seeds_acc),
            "space": {"train.lr": {"low": 0.001, "high": 0.1, "log": True}},
            "chosen": {"train.lr": 0.031622, "method_args.mu": 0.01}, "val_score": 0.645, "members": 8,
            "diverged": 1, "selection": "val"}
    (folder / "tuned.json").write_text(json.dumps(info))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """fedavg leads at its default configuration, fedbn once both are tuned."""
    root = tmp_path / "runs" / "quick" / "digits"
    for method, default, tuned in (("fedavg", (0.59, 0.60, 0.61), (0.64, 0.66, 0.68)),
                                   ("fedbn", (0.54, 0.55, 0.56), (0.69, 0.70, 0.71))):
        for seed, acc in enumerate(default):
            write_run(root / method / f"seed{seed}", method, method, seed, acc)
        write_tuned(root / f"{method}+tuned-rs", method, dict(enumerate(tuned)))
    return tmp_path / "runs"


def test_rows_put_default_and_tuned_side_by_side(sweep: Path) -> None:
    rows = {r.method: r for r in tuned_rows(load_runs(sweep))}
    assert sorted(rows) == ["fedavg", "fedbn"] and rows["fedavg"].tuner == "rs"
    fedavg = rows["fedavg"]
    assert fedavg.default is not None and fedavg.tuned is not None
    assert fedavg.default.seeds == (0, 1, 2) and fedavg.tuned.seeds == (0, 1, 2)  # the tuning job is no seed
    assert (fedavg.default.mean, fedavg.tuned.mean) == pytest.approx((0.60, 0.66))
    # 95% t-interval over 3 seeds: mean ± t(0.975, 2) * std / sqrt(3) = 60 ± 4.303 * 1 / 1.732; the paired
    # differences (5, 6, 7 points) have the same spread: 6 ± 2.48
    assert row_line(fedavg) == (
        "| fedavg | 60.00 ± 1.00 [57.52, 62.48] (n=3) | 66.00 ± 2.00 [61.03, 70.97] (n=3) | +6.00 [+3.52, +8.48] | "
        "rs | 15 / 18 | 123.4 | 64.50 | 1 / 8 | train.lr=0.0316, method_args.mu=0.01 |")


def test_the_report_page_has_the_section_and_keeps_tuning_jobs_out_of_the_tables(sweep: Path,
                                                                                  tmp_path: Path) -> None:
    paths = write_report(sweep, tmp_path / "out")
    text = paths.markdown.read_text()
    section = text[text.index("## Default vs tuned"):]
    assert f"**Stand-ins.** {STAND_IN}" in section.split("### digits")[0]
    assert "| fedbn | 55.00 ± 1.00" in section and "70.00 ± 1.00" in section
    assert "**Reading (tuning).** Tuned with rs on digits, fedbn and fedavg swap" in section
    assert (tmp_path / "out" / "anytime_rs.png").is_file() and "(anytime_rs.png)" in section
    assert "| client | fedavg | fedavg+tuned-rs | fedbn | fedbn+tuned-rs |" in text  # no tuning-job column
    assert "(n=3)" in text and "(n=4)" not in text
    assert "fedbn and fedavg swap" in paths.summary


def test_ordering_sentence_names_swaps_and_moves() -> None:
    default = {"fedavg": 0.70, "fedbn": 0.65, "fraug": 0.60}
    assert read_ordering("digits", "rs", default, {"fedavg": 0.66, "fedbn": 0.68, "fraug": 0.61}) == (
        "Tuned with rs on digits, fedbn and fedavg swap (default: fedavg > fedbn > fraug; tuned: fedbn > fedavg > "
        "fraug).")
    assert read_ordering("digits", "sha", default, {"fedavg": 0.71, "fedbn": 0.70, "fraug": 0.80}) == (
        "Tuned with sha on digits, fraug moves from 3rd to 1st; fedavg moves from 1st to 2nd; fedbn moves from 2nd "
        "to 3rd (default: fedavg > fedbn > fraug; tuned: fraug > fedavg > fedbn).")


def test_ordering_sentence_when_nothing_changes() -> None:
    default = {"fedavg": 0.70, "fedbn": 0.65, "fraug": 0.60}
    tuned = {"fedavg": 0.80, "fedbn": 0.75, "fraug": 0.74}
    assert read_ordering("digits", "rs", default, tuned) == (
        "Tuned with rs on digits, no ordering changes: fedavg > fedbn > fraug, at the default configuration and "
        "tuned.")
    assert read_ordering("digits", "rs", {"fedavg": 0.7}, {"fedavg": 0.8}) == ""


def test_anytime_curve_is_best_so_far_over_client_rounds(sweep: Path) -> None:
    xs, ys = anytime_curve(sweep / "quick" / "digits" / "fedavg+tuned-rs" / "tuning" / "tune" / "members.jsonl")
    assert xs == [6, 12, 15]  # 2 x 3, + 2 x 3 (the diverging member trained), + 1 x 3
    assert ys == [0.8, 0.7, 0.7]  # round 3's best (0.75) is worse: the curve stays; inf never counts
    assert all(b <= a for a, b in zip(ys, ys[1:], strict=False))


def test_anytime_curve_takes_the_recorded_client_rounds(tmp_path: Path) -> None:
    """A log with `client_rounds` (all members' trained clients so far) is read by it, not by `local`."""
    log = tmp_path / "members.jsonl"
    spent = {1: 6, 2: 12, 3: 15}
    log.write_text("".join(json.dumps({**{k: v for k, v in r.items() if k != "local"},
                                       "client_rounds": spent[r["round"]]}) + "\n" for r in MEMBER_LOG))
    assert anytime_curve(log) == ([6, 12, 15], [0.8, 0.7, 0.7])


def test_ties_share_a_place_in_the_ordering_sentence() -> None:
    default = {"fedavg": 0.70, "fedprox": 0.70, "fedbn": 0.60}
    assert read_ordering("digits", "rs", default, {"fedavg": 0.70, "fedprox": 0.71, "fedbn": 0.60}) == (
        "Tuned with rs on digits, fedavg moves from joint 1st to 2nd (default: fedavg = fedprox > fedbn; tuned: "
        "fedprox > fedavg > fedbn).")
    assert read_ordering("digits", "rs", default, {"fedavg": 0.8, "fedprox": 0.8, "fedbn": 0.6}).startswith(
        "Tuned with rs on digits, no ordering changes: fedavg = fedprox > fedbn")


def test_a_changed_order_within_the_seeds_noise_is_called_not_decisive(tmp_path: Path) -> None:
    def row(method: str, default: float, tuned: Cell) -> TunedRow:
        return TunedRow("digits", method, "rs", Cell(default, 0.01, 3), tuned, {}, tmp_path)

    close = [row("fedavg", 0.70, Cell(0.66, 0.02, 3)), row("fedbn", 0.65, Cell(0.67, 0.02, 3)),
             row("fraug", 0.60, Cell(0.50, 0.02, 3))]
    assert tuned_readings(close) == [
        "Tuned with rs on digits, fedbn and fedavg swap (default: fedavg > fedbn > fraug; tuned: fedbn > fedavg > "
        "fraug). Within one standard deviation over seeds, so not decisive: fedbn over fedavg."]
    clear = [close[0], row("fedbn", 0.65, Cell(0.70, 0.02, 3)), close[2]]
    assert tuned_readings(clear)[0].endswith("fraug).")
    one_seed = [close[0], row("fedbn", 0.65, Cell(0.70, math.nan, 1)), close[2]]
    assert tuned_readings(one_seed)[0].endswith("One seed: the changed order is not tested against noise.")


def test_a_corrupt_tuned_json_is_one_clear_error(sweep: Path) -> None:
    (sweep / "quick" / "digits" / "fedbn+tuned-rs" / "tuned.json").write_text('{"method": "fedbn"')
    with pytest.raises(FedhetError, match="tuned.json.*resume the sweep"):
        tuned_rows(load_runs(sweep))
    (sweep / "quick" / "digits" / "fedbn+tuned-rs" / "tuned.json").write_text('{"method": "fedbn"}')
    with pytest.raises(FedhetError, match="lacks default_label, tuner"):
        tuned_rows(load_runs(sweep))

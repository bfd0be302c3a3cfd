"""Tuning honesty (issue 40 item 5): the members' scores and the final pick never see test data; the pick is the
best validation accuracy, test accuracy only with `tune.select: test`, which the summary labels; members whose
training diverges score +inf, are counted in summary.json and are never picked; members.jsonl counts the
client-rounds spent."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset
from tune_testing import BASE

from fedhet.config import load_config
from fedhet.engine.experiment import Experiment
from fedhet.tune import run as tune_run
from fedhet.tune.run import TuneResult, run_tuning

# train.lr is 0.05 or 1e6 (diverges at once); seed 2 draws [0.05, 1e6, 0.05, 1e6] for 4 configurations
DIVERGING = ["tune.configs=4", "tune.clients=fixed", "tune.fedpop_l=false",
             "tune.space={client: {train.lr: {type: choice, values: [0.05, 1.0e+6]}}, server: {server.lr: "
             "{type: log_uniform, low: -0.3, high: 0.3}}}"]
RS = ["tune.fedpop_g=false"]


def tuned(run_dir: Path, *extra: str) -> TuneResult:
    return run_tuning(load_config(None, [*BASE, *extra]), run_dir, progress=False)


def log_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "tune" / "members.jsonl").read_text().splitlines()]


class OtherTest(Dataset[tuple[torch.Tensor, int]]):
    """A client's test split replaced: half as many samples, random inputs, every label moved to the next class."""

    def __init__(self, test: Dataset[tuple[torch.Tensor, int]], classes: int) -> None:
        self.test, self.classes = test, classes

    def __len__(self) -> int:
        return max(1, len(self.test) // 2)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, y = self.test[i]
        return torch.rand(x.shape, generator=torch.Generator().manual_seed(i)), (int(y) + 1) % self.classes


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TuneResult]:
    """FedPop (RS + FedPop-L / -G) on the tuner's small setting, picked on validation (the default)."""
    run_dir = tmp_path_factory.mktemp("plain")
    return run_dir, tuned(run_dir)


def test_a_changed_test_split_changes_no_score_and_not_the_pick(plain: tuple[Path, TuneResult], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    build = tune_run.build_experiment

    def other_test_data(cfg: object) -> Experiment:
        exp = build(cfg)  # type: ignore[arg-type]
        for client in exp.data.clients:
            client.test = OtherTest(client.test, exp.data.num_classes)
        return exp

    monkeypatch.setattr(tune_run, "build_experiment", other_test_data)
    other = tuned(tmp_path)
    first_dir, first = plain
    assert other.summary["final"] != first.summary["final"]  # the test data did change what test measures
    assert log_rows(tmp_path) == log_rows(first_dir)  # every member's vectors and score, every round
    for key in ("selected", "values", "accuracy", "client_rounds"):
        assert other.summary["tune"][key] == first.summary["tune"][key], key
    best = "tune/best_config.yaml"
    assert (tmp_path / best).read_text() == (first_dir / best).read_text()


def test_the_pick_is_the_best_validation_accuracy_and_test_only_when_asked(
        plain: tuple[Path, TuneResult], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first_dir, first = plain
    accuracy = first.summary["tune"]["accuracy"]
    assert len(set(accuracy.values())) == len(accuracy) > 1  # a real choice
    assert first.summary["selection"] == "val" and json.loads((first_dir / "summary.json").read_text())[
        "selection"] == "val"
    assert str(first.summary["tune"]["selected"]) == max(accuracy, key=accuracy.__getitem__)
    with caplog.at_level(logging.WARNING, logger="fedhet.tune.run"):
        on_test = tuned(tmp_path, "tune.select=test")
    assert "tune.select=test picks the final configuration by its test accuracy" in caplog.text
    assert json.loads((tmp_path / "summary.json").read_text())["selection"] == "test"
    scores = on_test.summary["tune"]["accuracy"]
    assert scores != accuracy and str(on_test.summary["tune"]["selected"]) == max(scores, key=scores.__getitem__)
    assert log_rows(tmp_path) == log_rows(first_dir)  # the same search; only the final pick's split differs


def test_diverged_members_are_counted_and_never_picked_by_random_search(tmp_path: Path) -> None:
    result = tuned(tmp_path, "seed=2", "rounds=2", *DIVERGING, *RS)
    rows = log_rows(tmp_path)
    first = {r["slot"]: r for r in rows if r["round"] == 1}
    assert [first[s]["train.lr"] for s in range(4)] == [0.05, 1e6, 0.05, 1e6]
    assert [first[s]["score"] == float("inf") for s in range(4)] == [False, True, False, True]
    assert result.summary["diverged"] == 2 and json.loads((tmp_path / "summary.json").read_text())["diverged"] == 2
    assert result.summary["tune"]["values"]["train.lr"] == 0.05 and set(result.summary["tune"]["accuracy"]) == {"0",
                                                                                                                "2"}
    # the budget spent so far: per round, the clients each member trained (4 configurations x 2 in round 1)
    spent, trained = [], 0
    for rnd in (1, 2):
        trained += sum(len(r["local"]) for r in rows if r["round"] == rnd)
        spent.append(trained)
        assert {r["client_rounds"] for r in rows if r["round"] == rnd} == {trained}
    assert spent[0] == 8 and result.summary["tune"]["client_rounds"] == spent[-1]


@pytest.mark.slow  # 12 s; the default suite keeps the random-search case and the split test below (+inf never on top)
def test_with_fedpop_g_a_member_scored_inf_is_never_picked(tmp_path: Path) -> None:
    """FedPop-G keeps diverged members alive (it replaces the worst) but never copies one; at the end those scored
    +inf since their (re)initialisation are not candidates, and each configuration that ever scored +inf counts
    once."""
    result = tuned(tmp_path, "seed=4", *DIVERGING)
    rows = log_rows(tmp_path)
    last = [r for r in rows if r["round"] == 4 and r["alive"]]
    finite = {str(m["slot"]) for m in last if all(r["score"] != float("inf") for r in rows
                                                  if (r["slot"], r["born"]) == (m["slot"], m["born"]))}
    assert finite and len(finite) < len(last)  # some live member scored +inf
    assert set(result.summary["tune"]["accuracy"]) == finite and str(result.summary["tune"]["selected"]) in finite
    score = {(r["round"], r["slot"]): r["score"] for r in rows}
    children = {(r["slot"], r["born"], r["parent"]) for r in rows if r["parent"] is not None}
    assert children and all(score[born, parent] < float("inf") for _, born, parent in children)  # never a parent
    diverged = {(r["slot"], r["born"]) for r in rows if r["score"] == float("inf")}
    assert result.summary["diverged"] == len(diverged) > len({r["slot"] for r in rows if r["score"] == float("inf")})


def test_a_diverged_score_is_never_in_the_top_group() -> None:
    """Fewer finite scores than the group size: the top is only the finite ones (none: no parent at all)."""
    from fedhet.tune.fedpop import split_quantiles

    inf, nan = float("inf"), float("nan")
    assert split_quantiles([inf, 0.2, inf, nan]) == ((1,), (2, 3))
    assert split_quantiles([inf, 0.2, inf, nan, inf, inf], rule="rank") == ((1,), (4, 5))
    assert split_quantiles([inf, inf]) == ((), (1,))

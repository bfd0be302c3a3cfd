"""`fedhet privacy RUN_DIR` on tiny real runs (offline digits), and its bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from fedhet_testing import tiny_client
from torch.utils.data import TensorDataset

from fedhet.cli import main
from fedhet.config import load_config
from fedhet.errors import FedhetError
from fedhet.launch.run import run_experiment
from fedhet.privacy.rundir import PRIVACY_FILE, client_split, evaluate_run

TINY = ["data.dataset=offline_digits", "model.name=small_cnn", "rounds=1", "train.local_steps=4",
        "train.batch_size=32", "train.lr=0.01", "run.quiet=true", "data.augment=false"]
CLIENTS = {"clean", "inverted", "colored", "thick_blur"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A personalized run (FedBN: local BatchNorm per client) and the centralized oracle (one pooled model)."""
    root = tmp_path_factory.mktemp("privacy_runs")
    for method in ("fedbn", "all"):
        run_experiment(load_config(None, [*TINY, f"method={method}"]), root / method)
    return {m: root / m for m in ("fedbn", "all")}


def final_test_losses(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["client"]: r["loss"] for r in rows if r["split"] == "test" and r["client"] in CLIENTS}


@pytest.mark.parametrize("method", ["fedbn", "all"])
def test_attacks_the_models_the_run_evaluated(runs: dict[str, Path], method: str) -> None:
    result = evaluate_run(runs[method], progress=False)
    assert json.loads((runs[method] / PRIVACY_FILE).read_text())["train_vs_test"] == json.loads(json.dumps(result))
    assert set(result["clients"]) == CLIENTS and result["held_out"] == []
    assert (result["method"], result["round"], result["finished"]) == (method, 1, True)
    for name, loss in final_test_losses(runs[method]).items():  # non-members = the test split, same model
        assert result["clients"][name]["loss"]["nonmember_mean"] == pytest.approx(loss, rel=1e-5)
        assert result["clients"][name]["num_members"] > result["clients"][name]["num_nonmembers"] > 0
    members = sum(r["num_members"] for r in result["clients"].values())
    assert result["avg"]["num_members"] == result["pooled"]["num_members"] == members
    assert result["table4"] == {"entropy": result["pooled"]["entropy"]["gap"], "loss": result["pooled"]["loss"]["gap"]}
    for report in (*result["clients"].values(), result["avg"], result["pooled"]):
        assert 0.5 <= report["loss"]["attack_accuracy"] <= 1.0 and 0.0 <= report["loss"]["auc"] <= 1.0


def test_other_splits_are_merged_into_privacy_json(runs: dict[str, Path]) -> None:
    evaluate_run(runs["fedbn"], progress=False)
    swapped = evaluate_run(runs["fedbn"], "test", "train", progress=False)
    saved = json.loads((runs["fedbn"] / PRIVACY_FILE).read_text())
    assert set(saved) >= {"train_vs_test", "test_vs_train"}
    assert swapped["table4"]["loss"] == pytest.approx(-saved["train_vs_test"]["table4"]["loss"])


def test_cli(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", str(runs["all"]), "-q"]) == 0
    out = capsys.readouterr().out
    assert "Table 4" in out and "pooled" in out and f"results: {runs['all'] / PRIVACY_FILE}" in out
    assert main(["privacy", str(runs["all"]), "--split-nonmembers", "train"]) == 2
    assert "two different splits" in capsys.readouterr().err


def test_not_a_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FedhetError, match="not a fedhet run directory"):
        evaluate_run(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FedhetError, match="not a fedhet run directory"):
        evaluate_run(tmp_path / "file")
    assert main(["privacy", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not a fedhet run directory" in err[0]


def test_run_without_checkpoint(runs: dict[str, Path], tmp_path: Path) -> None:
    shutil.copy(runs["fedbn"] / "config.yaml", tmp_path / "config.yaml")
    with pytest.raises(FedhetError, match="has no checkpoint"):
        evaluate_run(tmp_path)
    assert not (tmp_path / PRIVACY_FILE).exists()


def test_flower_run_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    config = yaml.safe_load((runs["fedbn"] / "config.yaml").read_text())
    config["run"]["runtime"] = "flower-simulation"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "checkpoints").mkdir()
    shutil.copy(runs["fedbn"] / "checkpoints" / "latest.pt", tmp_path / "checkpoints" / "latest.pt")
    with pytest.raises(FedhetError, match="Flower run"):
        evaluate_run(tmp_path)


def test_missing_split_names_the_client(runs: dict[str, Path]) -> None:
    before = (runs["fedbn"] / PRIVACY_FILE).read_text() if (runs["fedbn"] / PRIVACY_FILE).exists() else None
    with pytest.raises(FedhetError, match="client 'clean' has no val split.*val_fraction"):
        evaluate_run(runs["fedbn"], "train", "val", progress=False)
    after = (runs["fedbn"] / PRIVACY_FILE).read_text() if (runs["fedbn"] / PRIVACY_FILE).exists() else None
    assert before == after  # nothing written
    with pytest.raises(FedhetError, match="two different splits"):
        evaluate_run(runs["fedbn"], "train", "train")
    with pytest.raises(FedhetError, match="two different splits"):
        evaluate_run(runs["fedbn"], "train", "holdout")


def test_client_without_test_split() -> None:
    client = tiny_client()
    client.test = TensorDataset(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    with pytest.raises(FedhetError, match="client 'c0' has no test split"):
        client_split(client, "test")
    assert len(client_split(client, "train")) == 8  # type: ignore[arg-type]

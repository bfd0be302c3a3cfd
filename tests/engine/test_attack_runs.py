"""Attacks in whole runs (offline_digits, 4 clients, 2 rounds): a backdoor's attack success rate, the median against
a sign flip that breaks the mean, the drawn attackers recorded, and a refusal before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fedhet_testing import metric_rows

from fedhet.cli import main
from fedhet.config import load_config
from fedhet.engine.attacks import ASR, choose_attackers
from fedhet.errors import ConfigError
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.batch_size=16",
        "train.lr=0.1", "train.momentum=0.5", "data.augment=false", "run.quiet=true", "data.max_test_per_client=40"]


def run(tmp_path: Path, name: str, *extra: str) -> dict:
    result = run_experiment(load_config(None, [*BASE, "rounds=2", *extra]), tmp_path / name)
    return json.loads((result.run_dir / "summary.json").read_text())


def test_a_backdoor_is_learned_and_its_success_rate_reported_for_the_honest_clients(tmp_path: Path) -> None:
    summary = run(tmp_path, "bd", "method=fedavg", "train.local_steps=10", "attack.kind=backdoor",
                  "attack.clients=[inverted]", "attack.target=7")
    attack = summary["attack"]
    assert attack["kind"] == "backdoor" and attack["clients"] == ["inverted"] and attack["client_ids"] == [1]
    # 0.45 here; 0.05 when the attacker trains on clean batches (the trigger alone is not read as a 7)
    assert attack[ASR] > 0.2
    rows = [r for r in metric_rows(tmp_path / "bd") if r["round"] == 2 and r["split"] == "test"]
    per_client = {r["client"]: r.get(ASR) for r in rows}
    assert per_client["inverted"] is None and all(v is not None for c, v in per_client.items() if c != "inverted")
    honest = [r["accuracy"] for r in rows if r["client"] not in ("avg", "inverted")]
    avg = next(r for r in rows if r["client"] == "avg")
    assert avg["honest_accuracy"] == pytest.approx(sum(honest) / 3) and avg["honest_worst_accuracy"] == min(honest)
    assert avg[ASR] == attack[ASR]


def test_the_median_defends_a_sign_flip_that_breaks_the_mean(tmp_path: Path) -> None:
    flip = ["method=fedbn", "train.local_steps=5", "attack.kind=sign_flip", "attack.clients=[1]", "attack.factor=10"]
    mean = run(tmp_path, "mean", *flip, "server.aggregation=uniform")
    median = run(tmp_path, "median", *flip, "server.aggregation=median")
    assert ASR not in mean["attack"]
    assert median["attack"]["honest_accuracy"] > mean["attack"]["honest_accuracy"]
    assert mean["final"]["avg"]["loss"] > 5 > median["final"]["avg"]["loss"]  # the mean's loss blew up (20.6)


def test_a_drawn_fraction_of_attackers_is_recorded_and_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    assert main(["run", *BASE, "rounds=1", "train.local_steps=1", "attack.kind=label_flip", "attack.fraction=0.25",
                 "seed=3", "--run-dir", str(tmp_path / "lf")]) == 0
    summary = json.loads((tmp_path / "lf" / "summary.json").read_text())
    names = ["clean", "inverted", "colored", "thick_blur"]
    drawn = choose_attackers(load_config(None, ["attack.kind=label_flip", "attack.fraction=0.25"]).attack, 3, names,
                             [0, 1, 2, 3])
    assert summary["attack"]["client_ids"] == drawn and summary["attack"]["clients"] == [names[drawn[0]]]
    assert f"attack label_flip by {names[drawn[0]]}: honest clients' accuracy mean" in capsys.readouterr().out


def test_flower_refuses_an_attack_by_name_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("flwr")

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Flower simulation started")

    monkeypatch.setattr("fedhet.runtimes.flower.simulation.run_flower_simulation", started)
    assert main(["flower", "simulate", "configs/quickstart.yaml", "attack.kind=sign_flip", "attack.clients=[0]",
                 "--run-dir", str(tmp_path / "f")]) == 2
    assert "runs in process only" in capsys.readouterr().err and not (tmp_path / "f").exists()


def test_attackers_that_are_no_minority_under_the_median_are_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="2 attackers among n=4 .*not a minority.*median needs an honest majority"):
        run(tmp_path, "refused", "attack.kind=sign_flip", "attack.fraction=0.5", "server.aggregation=median")
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()
    assert not (tmp_path / "refused" / "checkpoints").exists()
    with pytest.raises(ConfigError, match="rewrites the shared model's upload, but method 'scaffold'"):
        run(tmp_path, "scaffold", "method=scaffold", "attack.kind=scale", "attack.factor=3", "attack.clients=[0]")

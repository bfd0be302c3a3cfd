"""`fedhet export`: each client's deployed model by name and the global model as plain state_dict files, rebuilt
by `fedhet.load_exported` to the run's final accuracy exactly; unfinished runs and non-empty --out refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fedhet
from fedhet.config import load_config
from fedhet.engine.evaluation import evaluate
from fedhet.engine.experiment import build_experiment
from fedhet.errors import FedhetError
from fedhet.launch import export as export_mod
from fedhet.launch.export import export_run
from fedhet.launch.run import run_experiment

TINY = ["data.dataset=offline_digits", "data.fraction=0.1", "data.test_fraction=0.1", "train.local_steps=3",
        "train.batch_size=16", "train.lr=0.05", "run.num_threads=1", "run.quiet=true", "rounds=2",
        "model.args={width: 4}"]


def _run(tmp: Path, method: str, extra: list[str] | None = None) -> Path:
    cfg = load_config(None, [*TINY, f"method={method}", *(extra or [])])
    return run_experiment(cfg, tmp / method, progress=False).run_dir


@pytest.fixture(scope="module")
def fedbn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished FedBN run (local BN: every client deploys its own model) and its export."""
    tmp = tmp_path_factory.mktemp("export")
    run = _run(tmp, "fedbn")
    return run, export_run(run, tmp / "out")


def _final(run: Path) -> dict[str, dict[str, float]]:
    return dict(json.loads((run / "summary.json").read_text())["final"])


def _test_splits(run: Path) -> dict[str, object]:
    exp = build_experiment(load_config(run / "config.yaml"))
    return {c.name: c.test for c in exp.data.clients}


def _metrics(model: torch.nn.Module, test: object) -> dict[str, float]:
    """The run's evaluation of a model (its batch size: the sum of the loss in the same order)."""
    got = evaluate(model, test, torch.device("cpu"), batch_size=16)  # type: ignore[arg-type]
    return {k: got[k] for k in ("accuracy", "balanced_accuracy", "loss")}


def test_each_client_reloads_to_the_runs_final_metrics(fedbn: tuple[Path, Path]) -> None:
    run, out = fedbn
    final, tests = _final(run), _test_splits(run)
    manifest = json.loads((out / "export.json").read_text())
    assert set(manifest["clients"]) == set(tests) and manifest["method"] == "fedbn"
    assert len({final[name]["loss"] for name in tests}) == len(tests), "the clients must differ for the test to bite"
    for name, test in tests.items():
        assert manifest["clients"][name]["file"] == f"clients/{name}.pt"  # by name, not by position
        assert manifest["clients"][name]["metrics"] == final[name]
        assert _metrics(fedhet.load_exported(out, client=name), test) == final[name]


def test_files_are_plain_tensors_and_the_architecture_is_described(fedbn: tuple[Path, Path]) -> None:
    run, out = fedbn
    state = torch.load(out / "clients" / "clean.pt", weights_only=True)
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    spec = json.loads((out / "model.json").read_text())
    assert spec["model"] == "small_cnn" and spec["args"] == {"width": 4} and spec["num_classes"] == 10
    assert spec["input_shape"] == [3, 28, 28] or len(spec["input_shape"]) == 3
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["fedhet_version"] and manifest["round"] == 2 and manifest["run"] == str(run.resolve())
    assert manifest["global"]["file"] is None and "local" in manifest["global"]["note"]  # FedBN keeps BN local
    with pytest.raises(FedhetError, match="no global model.*clean"):
        fedhet.load_exported(out)
    with pytest.raises(FedhetError, match="no client 'nope'.*clean"):
        fedhet.load_exported(out, client="nope")


def test_the_global_model_reloads_to_the_pooled_accuracy(tmp_path: Path) -> None:
    run = _run(tmp_path, "fedavg", ["eval.pooled_test=true"])
    out = export_run(run, tmp_path / "out")
    exp = build_experiment(load_config(run / "config.yaml"))
    pooled = evaluate(fedhet.load_exported(out), exp.data.pooled_test(), torch.device("cpu"))
    assert pooled["accuracy"] == _final(run)["pooled"]["accuracy"]
    assert pooled["loss"] == pytest.approx(_final(run)["pooled"]["loss"], rel=1e-6)
    glob = torch.load(out / "global.pt", weights_only=True)
    for name in ("clean", "inverted"):  # FedAvg's clients deploy the global model
        state = torch.load(out / "clients" / f"{name}.pt", weights_only=True)
        assert all(torch.equal(state[k], glob[k]) for k in glob)


def test_refusals_and_overwrite(tmp_path: Path, fedbn: tuple[Path, Path]) -> None:
    run, _ = fedbn
    cfg = load_config(None, [*TINY, "method=fedavg", "rounds=2"])
    unfinished = run_experiment(cfg, tmp_path / "half", progress=False, stop_after=1).run_dir
    with pytest.raises(FedhetError, match="has not finished training"):
        export_run(unfinished, tmp_path / "x")
    with pytest.raises(FedhetError, match="not found"):
        export_run(tmp_path / "missing")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(FedhetError, match="not empty.*--overwrite"):
        export_run(run, full)
    assert (full / "keep.txt").is_file() and not (tmp_path / "x").exists()
    assert export_run(run, full, overwrite=True) == full
    assert not (full / "keep.txt").exists() and (full / "export.json").is_file()


def test_a_failed_write_leaves_nothing_half_written(tmp_path: Path, fedbn: tuple[Path, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = fedbn
    out = export_run(run, tmp_path / "out")
    before = (out / "export.json").read_text()

    def broken(folder: Path, export: object) -> None:
        (folder / "clients").mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_mod, "fill_folder", broken)
    with pytest.raises(OSError):
        export_run(run, out, overwrite=True)
    with pytest.raises(OSError):
        export_run(run, tmp_path / "new")
    assert (out / "export.json").read_text() == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folders left


def test_the_cli_exports_and_refuses_in_one_line(tmp_path: Path, fedbn: tuple[Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from fedhet.cli import main

    run, _ = fedbn
    assert main(["export", str(run), "--out", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    assert "clients/clean.pt" in out and "global" in out and "none" in out
    assert main(["export", str(run), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ditto", "fedrep", "pfedavg", "fedper", "fedprox", "scaffold"])
def test_personal_models_reload_exactly(tmp_path: Path, method: str) -> None:
    run = _run(tmp_path, method, ["method_args.finetune_epochs=1"] if method == "pfedavg" else [])
    out = export_run(run, tmp_path / "out")
    final = _final(run)
    for name, test in _test_splits(run).items():
        assert _metrics(fedhet.load_exported(out, client=name), test) == final[name]


def test_the_manifest_names_restricted_heads_and_flower_checkpoints_are_refused(fedbn: tuple[Path, Path]) -> None:
    export = export_mod.Export({"a b/c": {}, "d": {}}, {}, {"method": "x"}, {"d": {"accuracy": 0.5}},
                               heads={"d": [0, 2]})
    files = export_mod.file_names(list(export.clients))
    made = export_mod.manifest(export, files)
    assert made["clients"]["d"] == {"file": "clients/d.pt", "metrics": {"accuracy": 0.5}, "classes": [0, 2]}
    assert made["clients"]["a b/c"]["file"] == "clients/a_b_c.pt" and "classes" not in made["clients"]["a b/c"]
    assert export_mod.file_names(["a/b", "a_b"]) == {"a/b": "clients/a_b.pt", "a_b": "clients/a_b-2.pt"}
    run = export_mod.load_run(export_mod.checked_run(fedbn[0]))
    run.states = {"state_round": {0: 2}}  # what a Flower run's checkpoint holds
    with pytest.raises(FedhetError, match="holds no client states: the Flower runtime keeps them on the clients"):
        export_mod.client_models(run)

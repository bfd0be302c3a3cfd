"""The command line: a run from overrides, and one clear error for bad input."""

from __future__ import annotations

from fedhet.cli import main


def test_run_and_report(tmp_path, capsys) -> None:
    args = ["run", "--quiet", "--run-dir", str(tmp_path / "r"), "data.dataset=offline_digits",
            "model.name=small_cnn", "model.args={width: 8}", "rounds=1", "train.local_steps=1",
            "data.max_test_per_client=20"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "avg" in out and "results:" in out
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()


def test_unknown_method_is_one_clear_error(capsys) -> None:
    assert main(["run", "--quiet", "method=fedavgg"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'fedavgg'" in err and "did you mean 'fedavg'" in err


def test_unknown_dataset_is_one_clear_error(capsys) -> None:
    assert main(["run", "--quiet", "data.dataset=pcas"]) == 2
    assert "did you mean 'pacs'" in capsys.readouterr().err


def test_methods_lists_registry(capsys) -> None:
    assert main(["methods"]) == 0
    assert "fedbn" in capsys.readouterr().out

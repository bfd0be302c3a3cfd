"""The command line: a run from overrides, and one clear error for bad input."""

from __future__ import annotations

import pytest

from fedhet.cli import main


def test_run_and_report(tmp_path, capsys) -> None:
    args = ["run", "--quiet", "--run-dir", str(tmp_path / "r"), "data.dataset=offline_digits",
            "model.name=small_cnn", "model.args={width: 8}", "rounds=1", "train.local_steps=1",
            "data.max_test_per_client=20"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "avg" in out and "results:" in out
    assert "quiet: true" in (tmp_path / "r" / "config.yaml").read_text()  # --quiet is the run's run.quiet too
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


def test_overrides_after_flags_join_the_overrides() -> None:
    from fedhet.cli import parse_args

    args = parse_args(["run", "c.yaml", "--quiet", "rounds=2", "--stop-after", "1", "seed=3", "-v"])
    assert (args.config, args.overrides, args.quiet, args.stop_after, args.verbose) == (
        "c.yaml", ["rounds=2", "seed=3"], True, 1, True)
    assert parse_args(["report", "--out", "o", "a", "b"]).run_dirs == ["a", "b"]


def test_csv_lists() -> None:
    from fedhet.cli_args import csv_list
    from fedhet.errors import UsageError

    assert csv_list(" 0, 2 ", "--seeds", int) == [0, 2] and csv_list(None, "--seeds", int) is None
    for bad in ("", "0,,1", "0,x", "1,1"):
        with pytest.raises(UsageError, match="--seeds"):
            csv_list(bad, "--seeds", int)


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("fedhet ")


@pytest.mark.parametrize("command", [["run"], ["tune"], ["flower", "simulate"]])
def test_a_bare_command_is_an_error_not_a_default_run(command, capsys) -> None:
    assert main([*command, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"fedhet {' '.join(command)} needs a config file" in err and "configs/quickstart.yaml" in err


def test_report_prints_a_short_summary_not_the_markdown(tmp_path, capsys) -> None:
    args = ["run", "--quiet", "--run-dir", str(tmp_path / "r"), "data.dataset=offline_digits",
            "model.name=small_cnn", "model.args={width: 8}", "rounds=1", "train.local_steps=1",
            "data.max_test_per_client=20"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("offline_digits: client-average accuracy (%)") and "fedavg" in out
    assert "|---" not in out and "report (tables per client, curves, runs):" in out


def test_no_path_reprs_in_messages(capsys) -> None:
    from pathlib import Path

    from fedhet.cli import _fail

    assert _fail(f"cannot read {Path('runs/x')!r} or {Path('a b')!r}", False, 2) == 2
    assert capsys.readouterr().err == "error: cannot read 'runs/x' or 'a b'\n"


def test_the_method_catalog_agrees_with_the_registry() -> None:
    from fedhet.algorithms import ALGORITHMS
    from fedhet.method_catalog import method_catalog

    catalog = {e.name: e for e in method_catalog()}
    assert sorted(catalog) == sorted(ALGORITHMS.names())
    for name, entry in catalog.items():
        cls = ALGORITHMS.get(name)
        assert (entry.personalized, entry.one_shot, entry.centralized) == (
            cls.personalized, cls.one_shot, cls.centralized), name
        assert entry.requires == getattr(cls, "requires", ""), name
        assert entry.summary, f"{name}: its module has no docstring"


def test_methods_lists_whole_descriptions_and_the_tuners(capsys) -> None:
    import subprocess
    import sys

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "ditto_mmd" in out and "fedbip" in out and "one-shot" in out and "fedhet tune" in out
    assert "(Algorithm 1)" in out  # FedAvg's description is not cut at its first line
    probe = ("import sys, fedhet.cli; fedhet.cli.main(['methods']); "
             "print(sorted(m for m in sys.modules if 'torch' in m))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.rstrip().endswith("[]"), "fedhet methods imported torch"


def test_run_checks_its_own_folder_not_the_default_one(tmp_path, capsys) -> None:
    tiny = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "rounds=1",
            "train.local_steps=1", "data.max_test_per_client=20", f"run.out_dir={tmp_path / 'runs'}", "--quiet"]
    assert main(["run", *tiny]) == 0  # a finished run in the default folder
    assert main(["run", *tiny, "train.lr=0.05", "--run-dir", str(tmp_path / "new")]) == 0
    assert main(["run", *tiny, "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["run", *tiny, "train.lr=0.05"]) == 2  # the run's own folder holds a run: its own error
    err = capsys.readouterr().err
    assert "already holds a checkpoint" in err and "--overwrite" in err and "sweep" not in err


def test_output_folders_that_cannot_be_written_are_one_clear_error(tmp_path, capsys, monkeypatch) -> None:
    from fedhet.errors import FedhetError
    from fedhet.launch.ldm_pretrain import check_out

    a_file = tmp_path / "afile"
    a_file.write_text("")
    assert main(["flower", "app", "configs/quickstart.yaml", "--workdir", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert "--workdir" in err and "is an existing file" in err and "Flower App" in err
    monkeypatch.setattr("os.access", lambda *_: False)  # a read-only parent (the tests may run as root)
    with pytest.raises(FedhetError, match="--out .*cannot write in"):
        check_out(tmp_path / "ldm", "key", False)

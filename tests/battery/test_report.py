"""`fedhet report` on damaged run directories, bad --out folders and bad reference files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from battery.harness import run_cli


def _damaged_run(battery, name: str, text: str | bytes):
    run = battery.finished_run()
    path = run / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    battery.watch(run)
    return run, path


DAMAGED = {  # name: (file, content, words)
    "summary_not_json": ("summary.json", "{not json", ("corrupt JSON", "summary.json", "line 1")),
    "summary_truncated": ("summary.json", '{"method": "fedavg", "dataset"', ("corrupt JSON", "summary.json")),
    "summary_not_object": ("summary.json", "[1, 2]", ("expected a JSON object",)),
    "summary_missing_keys": ("summary.json", '{"method": "fedavg"}', ("lacks key(s) dataset, seed, final",)),
    "summary_bad_final": ("summary.json", '{"method": "m", "dataset": "d", "seed": 0, "final": 3}',
                          ("'final' must map client",)),
    "summary_bad_seed": ("summary.json", '{"method": "m", "dataset": "d", "seed": "x", "final": {}}',
                         ("seed must be an integer",)),
    "summary_not_utf8": ("summary.json", b'{"method": "caf\xe9"}', ("cannot read", "summary.json")),
    "config_bad_yaml": ("config.yaml", "name: [unclosed\n", ("corrupt YAML", "config.yaml", "repair it")),
    "config_not_mapping": ("config.yaml", "- a\n- b\n", ("config.yaml", "expected a mapping")),
    "metrics_corrupt_middle": ("metrics.jsonl", '{"round": 1, "client": "a", "split": "test"}\n{oops\n'
                               '{"round": 2, "client": "a", "split": "test"}\n', ("metrics.jsonl line 2",
                                                                                  "repair or delete that line")),
    "metrics_row_without_keys": ("metrics.jsonl", '{"round": 1}\n', ("metrics.jsonl line 1",
                                                                     "round, client, split")),
    "metrics_bad_value": ("metrics.jsonl", '{"round": 1, "client": "a", "split": "test", "accuracy": true}\n',
                          ("'accuracy'", "expected a number")),
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_damaged_run_directory(battery, name: str) -> None:
    file, content, words = DAMAGED[name]
    run, _ = _damaged_run(battery, file, content)
    battery.fails(["report", str(run), "--out", "rep"], *words, code=2)
    assert not (battery.root / "rep").exists()


def _metrics_lines(run) -> list[str]:
    return (run / "metrics.jsonl").read_text().splitlines(keepends=True)


def test_truncated_last_line_is_a_warning_naming_file_and_line(battery) -> None:
    run = battery.finished_run()
    lines = _metrics_lines(run)
    (run / "metrics.jsonl").write_text("".join(lines[:-1]) + lines[-1][:25])
    result = run_cli(["report", str(run), "--out", "rep"])
    assert result.code == 0 and (battery.root / "rep" / "report.md").is_file()
    assert "Traceback" not in result.err
    warning = next(line for line in result.err_lines if "truncated" in line)
    assert f"{run / 'metrics.jsonl'} line {len(lines)}" in warning and warning.startswith("WARNING")


def test_metrics_cut_at_a_round_is_a_warning(battery) -> None:
    run = battery.finished_run()
    first_round = [line for line in _metrics_lines(run) if json.loads(line)["round"] == 1]
    (run / "metrics.jsonl").write_text("".join(first_round))
    result = run_cli(["report", str(run), "--out", "rep"])
    assert result.code == 0
    assert any("ends at round 1" in line and "2 rounds were completed" in line for line in result.err_lines)


def test_missing_metrics_is_a_warning(battery) -> None:
    run = battery.finished_run()
    (run / "metrics.jsonl").unlink()
    result = run_cli(["report", str(run), "--out", "rep"])
    assert result.code == 0 and any("metrics.jsonl is missing" in line for line in result.err_lines)


def test_intact_run_reports_without_warnings(battery) -> None:
    """The control for the warnings above."""
    run = battery.finished_run()
    result = battery.succeeds(["report", str(run), "--out", "rep"])
    assert result.err_lines == []


OUT = {  # name: (--out relative to root, words)
    "existing_file": ("notes.txt", ("--out 'notes.txt' is an existing file", "give a folder")),
    "inside_a_file": ("notes.txt/rep", ("'notes.txt' is a file, not a folder",)),
}


@pytest.mark.parametrize("name", list(OUT))
def test_bad_out(battery, name: str) -> None:
    value, words = OUT[name]
    run = battery.finished_run()
    battery.write("notes.txt", "keep me\n")
    battery.fails(["report", str(run), "--out", value], *words, code=2)


def test_out_without_permission(battery, monkeypatch) -> None:
    import fedhet.outpaths

    real_access = fedhet.outpaths.os.access
    locked = battery.root / "locked"
    monkeypatch.setattr(fedhet.outpaths.os, "access",  # chmod does not stop root: pretend
                        lambda path, mode: Path(path).resolve() != locked and real_access(path, mode))
    locked.mkdir()
    run = battery.finished_run()
    battery.fails(["report", str(run), "--out", "locked"], "--out 'locked'", "permission denied")


def test_write_failure_is_one_line(battery, monkeypatch) -> None:
    import fedhet.report.report

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fedhet.report.report, "atomic_write_text", full)
    run = battery.finished_run()
    battery.fails(["report", str(run), "--out", "rep"], "cannot write report folder 'rep'", "No space left")


@pytest.mark.parametrize("runs, words", [(["nowhere"], ("nowhere does not exist",)),
                                         (["empty"], ("no run directories", "summary.json"))])
def test_no_runs(battery, runs: list[str], words: tuple[str, ...]) -> None:
    (battery.root / "empty").mkdir()
    battery.fails(["report", *runs, "--out", "rep"], *words, code=2)


REFERENCES = {  # name: (content or None for a missing file, words)
    "missing": (None, ("reference file", "not found")),
    "bad_yaml": ("a: [1,\n", ("reference file", "not valid YAML")),
    "duplicate_key": ("clean: {fedavg: [1, 2]}\nclean: {fedbn: [3, 4]}\n", ("'clean'", "twice")),
    "not_a_mapping": ("- 1\n", ("must map client -> method",)),
    "not_utf8": (b"clean: caf\xe9\n", ("reference file", "not UTF-8")),
}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_bad_reference(battery, name: str) -> None:
    content, words = REFERENCES[name]
    if content is not None:
        battery.write("ref.yaml", content)
    run = battery.finished_run()
    battery.fails(["report", str(run), "--out", "rep", "--reference", "ref.yaml"], *words, code=2)


def test_run_dirs_after_flags_are_accepted(battery) -> None:
    run = battery.finished_run()
    battery.succeeds(["report", "--out", "rep", str(run)])
    assert (battery.root / "rep" / "report.md").is_file()

"""docs/export.md runs as written: its shell lines in page order (a tiny run: `fedhet run` lines get TINY, `fedhet
adapt` lines two epochs), then its python block, which reproduces the run's final accuracy from the export."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.data.examples import main as write_example

DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"
TINY = ["rounds=2", "train.local_steps=2", "data.image_size=16", "model.args={width: 4}", "run.num_threads=1",
        "--quiet"]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _shell(line: str) -> None:
    """One command line of the page; anything this test does not know fails it (so the page stays tested)."""
    argv = shlex.split(line, comments=True)
    if not argv:
        return
    if argv[0] == "fedhet":
        extra = TINY if argv[1] == "run" else ["novel.epochs=2", "--quiet"] if argv[1] == "adapt" else []
        assert main([*argv[1:], *extra]) == 0, line
    elif argv[:3] == ["python", "-m", "fedhet.data.examples"]:
        write_example(argv[3:])
    elif argv[:2] == ["mkdir", "-p"]:
        Path(argv[2]).mkdir(parents=True, exist_ok=True)
    elif argv[0] == "mv":
        shutil.move(argv[1], argv[2])
    else:
        raise AssertionError(f"docs/export.md runs a command this test cannot: {line}")


def test_the_pages_commands_run_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for block in _blocks("bash"):
        for line in block.splitlines():
            _shell(line)
    capsys.readouterr()
    export = json.loads((tmp_path / "exports/shapes-fedbn/export.json").read_text())
    assert set(export["clients"]) == {"plain", "inverted"} and export["global"]["file"] is None
    site = json.loads((tmp_path / "exports/textured-clinic/export.json").read_text())
    assert set(site["clients"]) == {"textured-clinic"}
    assert "personal@site=textured-clinic" in json.loads((tmp_path / "runs/shapes-fedbn/novel.json").read_text())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_blocks("python")[0], str(DOC), "exec"), {})  # noqa: S102 - our own documentation
    final = json.loads((tmp_path / "runs/shapes-fedbn/summary.json").read_text())["final"]
    assert float(printed.getvalue().split()[-1]) == final["plain"]["accuracy"]

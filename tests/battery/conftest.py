"""Fixtures of the bad-input battery; see `harness.py` for the API (`battery.fails(argv, *words)`, ...)."""

from __future__ import annotations

from pathlib import Path

import pytest

from battery.harness import TINY, Battery, run_cli


@pytest.fixture(scope="session")
def template_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished tiny run of 2 rounds for the whole session (tests get copies: `battery.finished_run()`)."""
    path = tmp_path_factory.mktemp("battery-template") / "run"
    tiny = [o for o in TINY if not o.startswith("rounds=")]
    result = run_cli(["run", "--quiet", "--run-dir", str(path), *tiny, "rounds=2", f"run.out_dir={path.parent}"])
    assert result.code == 0, result.err
    return path


@pytest.fixture
def battery(tmp_path: Path, template_run: Path, monkeypatch: pytest.MonkeyPatch) -> Battery:
    """A sandbox in `tmp_path` (the working directory for the test) with the assertions of `Battery`."""
    monkeypatch.chdir(tmp_path)
    return Battery(tmp_path, template_run)

"""benchmarks/run_archive.py: finished runs survive a save / restore round trip without their checkpoints."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def archive_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_archive", ROOT / "benchmarks" / "run_archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_run(run: Path, finished: bool = True) -> None:
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "round_10.pt").write_bytes(b"weights")
    (run / "config.yaml").write_text("method: fedavg\n")
    (run / "metrics.jsonl").write_text('{"round": 1, "accuracy": 0.5}\n' * 50)
    (run / ".lock").write_text("")
    if finished:
        (run / "summary.json").write_text(json.dumps({"rounds_completed": 10}))


def test_round_trip_keeps_the_finished_runs_files_and_drops_checkpoints(tmp_path: Path) -> None:
    ra = archive_module()
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    make_run(runs / "sweep" / "data" / "fedavg" / "seed1")
    make_run(runs / "sweep" / "data" / "fedavg" / "seed2", finished=False)
    (runs / "backbones").mkdir()
    (runs / "backbones" / "net.pt").write_bytes(b"pretrained")

    assert ra.save([runs / "sweep", runs / "backbones" / "net.pt"], runs, archive) == 2
    kept = sorted(str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file())
    assert kept == ["backbones/net.pt", "sweep/data/fedavg/seed1/config.yaml",
                    "sweep/data/fedavg/seed1/metrics.jsonl.gz", "sweep/data/fedavg/seed1/summary.json"]

    fresh = tmp_path / "fresh"
    assert ra.restore(fresh, archive) == 4
    assert ra.restore(fresh, archive) == 0  # what exists is left alone
    run = fresh / "sweep" / "data" / "fedavg" / "seed1"
    assert (run / "metrics.jsonl").read_text() == (runs / "sweep/data/fedavg/seed1/metrics.jsonl").read_text()
    assert json.loads((run / "summary.json").read_text()) == {"rounds_completed": 10}
    assert (fresh / "backbones" / "net.pt").read_bytes() == b"pretrained"
    assert not (run / "checkpoints").exists()

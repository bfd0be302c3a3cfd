"""Flower is an optional extra: without it the core runs, and the Flower commands say which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
sys.modules["flwr"] = None  # as if flwr were not installed: any import of it raises ImportError
from fedhet.cli import main
rc = main(["run", "configs/quickstart.yaml", "rounds=1", "data.max_test_per_client=20", "train.local_steps=1",
           "run.out_dir={out}", "--quiet"])
assert rc == 0, rc
sys.exit(0 if main(["flower", "simulate", "configs/quickstart.yaml"]) == 2 else 3)
"""


def test_core_runs_without_flower_and_flower_commands_name_the_extra(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(out=tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "quickstart").exists()
    assert "pip install 'fedhet[flower]'" in proc.stderr + proc.stdout

"""Keep tests light on the shared CPU; make `src/` importable when fedhet is not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("fedhet") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

torch.set_num_threads(1)


import json  # noqa: E402
from collections.abc import Callable  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

RunFactory = Callable[..., Path]


@pytest.fixture
def make_run(tmp_path: Path) -> RunFactory:
    """Write a fabricated run directory: final accuracies per client, and optional per-round avg curve."""

    def make(
        method: str,
        seed: int,
        final: dict[str, float],
        dataset: str = "digits",
        curve: list[float] | None = None,
        root: Path | None = None,
        rounds: int | None = None,
    ) -> Path:
        run = (root or tmp_path / "runs") / f"{dataset}_{method}_s{seed}"
        run.mkdir(parents=True)
        curve = curve or []
        n_rounds = rounds if rounds is not None else max(len(curve), 1)
        cfg = {"name": f"{method}-{dataset}", "method": method, "seed": seed, "rounds": n_rounds}
        cfg["data"] = {"dataset": dataset}
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
        rows = []
        for r, acc in enumerate(curve, start=1):
            for client in final:
                rows.append(
                    {
                        "round": r,
                        "client": client,
                        "split": "test",
                        "accuracy": acc,
                        "balanced_accuracy": acc,
                        "loss": 1 - acc,
                        "num_examples": 10,
                    }
                )
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        summary = {
            "method": method,
            "dataset": dataset,
            "seed": seed,
            "rounds_completed": len(curve),
            "final": {c: {"accuracy": a, "balanced_accuracy": a / 2, "loss": 1 - a} for c, a in final.items()},
            "wall_time_s": 1.5,
        }
        (run / "summary.json").write_text(json.dumps(summary))
        return run

    return make

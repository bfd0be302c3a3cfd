"""A run directory: resolved config, per-round per-client metrics, summary, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from fedhet.engine.atomic import atomic_write_text

METRIC_KEYS = ("accuracy", "balanced_accuracy", "loss")


class RunDirectory:
    """Paths and writers for one run; every file is written atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def latest_checkpoint(self) -> Path:
        return self.checkpoints / "latest.pt"

    def is_finished(self) -> bool:
        return self.summary_path.is_file()

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.config_path, yaml.safe_dump(config, sort_keys=False))

    def write_metrics(self, rows: list[dict[str, Any]]) -> None:
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2))


def client_rows(rnd: int, split: str, per_client: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Metric rows for one round and split, plus the uniform client average ('avg') as in the papers."""
    rows = [{"round": rnd, "client": name, "split": split, **m} for name, m in per_client.items()]
    if per_client:
        avg: dict[str, Any] = {"round": rnd, "client": "avg", "split": split}
        for key in METRIC_KEYS:
            values = [m[key] for m in per_client.values() if not math.isnan(m[key])]
            avg[key] = sum(values) / len(values) if values else float("nan")
        avg["num_examples"] = sum(int(m.get("num_examples", 0)) for m in per_client.values())
        rows.append(avg)
    return rows

"""Experiment tracking: each round's numbers sent to the loggers a config names (`run.loggers`).

Built in: `csv` (run_dir/tracking.csv, long format) and `tensorboard` (run_dir/tensorboard/, through
`torch.utils.tensorboard`; needs the `tensorboard` package: pip install 'fedhet[tracking]'). When installed:
`mlflow` (a run named after the run folder, in MLflow's configured tracking URI) and `wandb` (project = the
config's `name`; WANDB_MODE=offline works without a network). Per round, per client and as the client average:
the training loss the clients report (`train_loss` in their replies), every evaluated metric of each split,
the round's wall time and the mean traffic per sampled client (parameters and bytes, down and up).

metrics.jsonl stays the record a run is resumed and reported from; trackers are views of it. A resumed run
continues its trackers: the CSV drops the rows after the checkpoint's round and TensorBoard purges those steps,
so a round that was replayed after an interruption is not shown twice.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fedhet.atomic import atomic_write_text
from fedhet.engine.rundir import TRAIN_TIME
from fedhet.errors import ConfigError
from fedhet.yaml_input import JSONDict

EXTRAS = {"tensorboard": ("tensorboard", "pip install 'fedhet[tracking]' (or pip install tensorboard)"),
          "mlflow": ("mlflow", "pip install mlflow"), "wandb": ("wandb", "pip install wandb")}


@dataclass
class RoundRecord:
    """One round's numbers: name -> value per client ("avg" = the uniform client mean), plus round-level ones."""

    round: int
    per_client: dict[str, dict[str, float]] = field(default_factory=dict)  # client -> {"test/accuracy": ...}
    scalars: dict[str, float] = field(default_factory=dict)  # "round/time_s", "traffic/up_bytes", ...

    def flat(self) -> dict[str, float]:
        """'test/accuracy/avg' -> value, ..., and the round-level scalars."""
        out = {f"{key}/{client}": value for client, values in self.per_client.items() for key, value in values.items()}
        return {**out, **self.scalars}


def round_record(rnd: int, rows: Sequence[JSONDict], train_losses: Mapping[str, float], seconds: float,
                 traffic: Mapping[str, float]) -> RoundRecord:
    """The record of round `rnd` from its metric rows (metrics.jsonl's), the clients' reported training losses,
    the round's wall time and its traffic."""
    record = RoundRecord(rnd, scalars={"round/time_s": seconds, **{f"traffic/{k}": v for k, v in traffic.items()}})
    for row in reversed(rows):  # rows are appended round by round: this round's are the last
        if row.get("round") != rnd:
            break
        values = record.per_client.setdefault(str(row["client"]), {})
        for key, value in row.items():
            if key == TRAIN_TIME and isinstance(value, (int, float)):
                record.scalars["round/train_time_s"] = float(value)  # fit + aggregate: a round's number
            elif key not in ("round", "client", "split", "num_examples") and isinstance(value, (int, float)):
                values[f"{row['split']}/{key}"] = float(value)
    finite = [v for v in train_losses.values() if math.isfinite(v)]
    for client, loss in train_losses.items():
        record.per_client.setdefault(client, {})["train/loss"] = loss
    if finite:
        record.per_client.setdefault("avg", {})["train/loss"] = sum(finite) / len(finite)
    return record


class Tracker(Protocol):
    def log_round(self, record: RoundRecord) -> None: ...

    def close(self) -> None: ...


class CSVTracker:
    """run_dir/tracking.csv: round, name, value (e.g. 3, test/accuracy/avg, 0.61), rewritten atomically."""

    HEADER = ("round", "name", "value")

    def __init__(self, run_dir: Path, resumed_round: int) -> None:
        self.path = run_dir / "tracking.csv"
        self.rows: list[tuple[int, str, float]] = []
        if resumed_round and self.path.is_file():
            kept = list(csv.reader(io.StringIO(self.path.read_text(encoding="utf-8"))))[1:]
            self.rows = [(int(r[0]), r[1], float(r[2])) for r in kept if len(r) == 3 and int(r[0]) <= resumed_round]

    def log_round(self, record: RoundRecord) -> None:
        self.rows += [(record.round, name, value) for name, value in sorted(record.flat().items())]
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.HEADER)
        writer.writerows(self.rows)
        atomic_write_text(self.path, buf.getvalue())

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """run_dir/tensorboard/: one scalar per name, the round as the step."""

    def __init__(self, run_dir: Path, resumed_round: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"),
                                    purge_step=resumed_round + 1 if resumed_round else None)

    def log_round(self, record: RoundRecord) -> None:
        for name, value in record.flat().items():
            self.writer.add_scalar(name, value, record.round)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """An MLflow run named after the run folder (MLflow's own tracking URI and experiment settings apply)."""

    def __init__(self, run_dir: Path, resumed_round: int, name: str) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(name)
        mlflow.start_run(run_name=str(run_dir))

    def log_round(self, record: RoundRecord) -> None:
        self.mlflow.log_metrics({_key(k): v for k, v in record.flat().items()}, step=record.round)

    def close(self) -> None:
        self.mlflow.end_run()


class WandbTracker:
    """A W&B run in project `name`, its files under the run folder (WANDB_MODE=offline: no network)."""

    def __init__(self, run_dir: Path, resumed_round: int, name: str, config: JSONDict) -> None:
        import wandb

        self.run = wandb.init(project=name, dir=str(run_dir), name=run_dir.name, config=dict(config))

    def log_round(self, record: RoundRecord) -> None:
        self.run.log(record.flat(), step=record.round)

    def close(self) -> None:
        self.run.finish()


def _key(name: str) -> str:
    return name.replace("/", ".")  # MLflow keys: slashes are allowed in new versions, dots everywhere


def check_loggers(names: Iterable[str]) -> None:
    """`run.loggers` (names already checked by `RunConfig.validate`): their packages are installed, else one
    ConfigError naming the fix."""
    for name in names:
        if name in EXTRAS and importlib.util.find_spec(EXTRAS[name][0]) is None:
            raise ConfigError(f"run.loggers: '{name}' needs the {EXTRAS[name][0]} package: {EXTRAS[name][1]}")


def open_trackers(names: Sequence[str], run_dir: Path, resumed_round: int, name: str,
                  config: JSONDict) -> list[Tracker]:
    """The trackers `run.loggers` names, continuing after `resumed_round` (0: a new run)."""
    check_loggers(names)
    makers: dict[str, Callable[[], Tracker]] = {
        "csv": lambda: CSVTracker(run_dir, resumed_round),
        "tensorboard": lambda: TensorBoardTracker(run_dir, resumed_round),
        "mlflow": lambda: MLflowTracker(run_dir, resumed_round, name),
        "wandb": lambda: WandbTracker(run_dir, resumed_round, name, config)}
    return [makers[n]() for n in dict.fromkeys(names)]

"""Where lanes pay: which clients the batched runtime trains as lanes and which one after another, measured.

Whether a vectorized step of L lanes beats L plain steps depends on the model, the batch, the number of lanes and
the machine (docs/results/runtimes.md "Lanes near vmap (issue 42)": on one 2-core CPU lanes paid up to 159k
parameters although a fixed rule said 64k). So, unless `run.batched_min_lanes` is set, the first batch-size group
of at least `floor` clients (CPU_MIN_LANES on a CPU, 2 on a GPU) is decided by a short calibration (calibrate.py:
a few lane steps against as many plain steps of this model and batch, about a second), cached per machine
fingerprint, model shape, optimizer, batch size and lane count (a power of two) under the fedhet cache folder
(`$FEDHET_CACHE/lanes/`), and said in one line of the run's output. `run.batched_min_lanes` set: a group of at
least that many clients trains as lanes, no measurement (1: always lanes; `run.runtime=inprocess`: never).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fedhet.atomic import atomic_write_text
from fedhet.cache import cache_root

log = logging.getLogger(__name__)
CPU_MIN_LANES = 8  # a group of fewer clients trains one after another on a CPU without measuring (too few to pay)
GPU_MIN_LANES = 2
KEY_VERSION = 1  # bump when the calibration changes what it measures: older cached answers are then ignored


@dataclass(frozen=True)
class Measured:
    """One calibration: seconds per vectorized step of `lanes` lanes, and per plain step of one client."""

    lanes: int
    lane_step_s: float
    seq_step_s: float
    when: str = ""

    @property
    def speedup(self) -> float:
        """How many times faster `lanes` clients take a step as lanes than one after another."""
        return self.seq_step_s * self.lanes / max(self.lane_step_s, 1e-12)


def machine_fingerprint(device: torch.device) -> dict[str, object]:
    """What the speed of a step depends on besides the model: CPU / GPU, cores, threads, torch."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return {"machine": platform.machine(), "processor": platform.processor(), "node": platform.node(),
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": device.type, "gpu": gpu}


def bucket(lanes: int) -> int:
    """The lane count a group is calibrated at: the largest power of two not above it (at least 2)."""
    return max(2, 1 << (max(lanes, 1).bit_length() - 1))


class LanePolicy:
    """Decides, per (batch size, lane count), whether a group trains as lanes; see the module docstring.
    `measure(batch_size, lanes)` runs the calibration; `model` names what is trained (its shapes, the method,
    the optimizer), part of the cache key."""

    def __init__(self, chosen: int | None, device: torch.device, model: dict[str, object],
                 measure: Callable[[int, int], Measured], folder: Path | None = None) -> None:
        self.chosen, self.device, self.model, self.measure = chosen, device, model, measure
        self.floor = chosen if chosen is not None else CPU_MIN_LANES if device.type == "cpu" else GPU_MIN_LANES
        self.folder = folder if folder is not None else cache_root() / "lanes"
        self.decided: dict[tuple[int, int], bool] = {}

    def key(self, batch_size: int, lanes: int) -> dict[str, object]:
        return {"version": KEY_VERSION, "machine": machine_fingerprint(self.device), "model": self.model,
                "batch_size": batch_size, "lanes": lanes}

    def path(self, key: dict[str, object]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
        return self.folder / f"{digest}.json"

    def lanes_pay(self, batch_size: int, clients: int) -> bool:
        """Whether a group of `clients` clients of this batch size (at most a chunk) trains as lanes."""
        if clients < self.floor:
            return False
        if self.chosen is not None:
            return True
        at = bucket(clients)
        if (batch_size, at) not in self.decided:
            self.decided[batch_size, at] = self._decide(batch_size, clients, at)
        return self.decided[batch_size, at]

    def _decide(self, batch_size: int, clients: int, at: int) -> bool:
        key = self.key(batch_size, at)
        path, source = self.path(key), "cached in"
        measured = self._cached(path)
        if measured is None:
            try:
                measured = dataclasses.replace(self.measure(batch_size, at), when=time.strftime("%Y-%m-%d %H:%M"))
            except Exception as e:  # noqa: BLE001 - a calibration that fails must not fail the run
                log.warning("lanes: %d clients one after another (the calibration of lanes failed: %s: %s)",
                            clients, type(e).__name__, e)
                return False
            source = "saved to"
            try:
                atomic_write_text(path, json.dumps({"key": key, **dataclasses.asdict(measured)}, indent=1) + "\n")
            except OSError as e:
                source = f"not saved ({e}), was for"
        pays = measured.speedup >= 1.0
        what = "as lanes" if pays else "one after another"
        log.warning("lanes: %d clients %s (lanes measured %.2fx %s than one after another at %d lanes, batch %d, on "
                    "this machine %s; %s %s; run.batched_min_lanes overrides)", clients, what,
                    measured.speedup if pays else 1 / max(measured.speedup, 1e-12), "faster" if pays else "slower",
                    at, batch_size, measured.when, source, path)
        return pays

    @staticmethod
    def _cached(path: Path) -> Measured | None:
        try:
            raw = json.loads(path.read_text())
            return Measured(int(raw["lanes"]), float(raw["lane_step_s"]), float(raw["seq_step_s"]), str(raw["when"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

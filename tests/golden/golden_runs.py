"""Run a golden case and fingerprint its run directory; the machine fingerprint that decides exact vs tolerance.

The fingerprint does not depend on how client or server states are laid out: it is (a) every metrics.jsonl row
(the fields in `ROW_FIELDS`, floats at full precision) and (b) per tensor of the global model weights: dtype,
shape, sha256 of the bytes, float64 sum and norm. Personalized methods' client models are fingerprinted by their
per-client metric rows. `global_weights` is the one place that knows where the checkpoint keeps the global model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy
import torch
from golden.golden_cases import GoldenCase

from fedhet.engine.safe_load import load_trusted

ROW_FIELDS = ("round", "client", "split", "accuracy", "balanced_accuracy", "loss", "num_examples")


def global_weights(checkpoint: Mapping[str, Any]) -> Mapping[str, torch.Tensor]:
    """The global model's tensors, by state-dict key, in a checkpoint (`checkpoints/latest.pt`) of any method
    that has one. Adapt this function, and only it, when the checkpoint layout changes: contract v2 keeps a
    `ServerState` with the shared model in `.model`; the recorded tree kept a dict with it under "global"."""
    server = checkpoint["server"]
    weights: Mapping[str, torch.Tensor] = server["global"] if isinstance(server, Mapping) else server.model
    return weights


def tensor_digest(t: torch.Tensor) -> dict[str, Any]:
    """dtype, shape, sha256 of the raw bytes, and float64 sum and L2 norm (for the tolerance comparison)."""
    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    d = t.to(torch.float64)
    return {"dtype": str(t.dtype), "shape": list(t.shape), "sha256": hashlib.sha256(raw).hexdigest(),
            "sum": d.sum().item(), "norm": d.norm().item()}


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl, restricted to `ROW_FIELDS` (json keeps floats at full precision)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    missing = [(i, f) for i, r in enumerate(rows) for f in ROW_FIELDS if f not in r]
    if missing:
        raise AssertionError(f"metrics.jsonl row {missing[0][0]} has no field {missing[0][1]!r}")
    return [{f: r[f] for f in ROW_FIELDS} for r in rows]


def fingerprint(case: GoldenCase, run_dir: Path) -> dict[str, Any]:
    """What golden.json keeps of one run: its metric rows and, if the case has one, its global model."""
    result: dict[str, Any] = {"metrics": metric_rows(run_dir), "global": None}
    if case.global_model:
        checkpoint = load_trusted(run_dir / "checkpoints" / "latest.pt", "the golden run's checkpoint")
        result["global"] = {k: tensor_digest(v) for k, v in sorted(global_weights(checkpoint).items())}
    return result


@contextlib.contextmanager
def private_flower_home() -> Iterator[None]:
    """Flower writes FLWR_HOME (default ~/.flwr) and may send telemetry: a private home, telemetry off."""
    saved = {k: os.environ.get(k) for k in ("FLWR_HOME", "FLWR_TELEMETRY_ENABLED")}
    with tempfile.TemporaryDirectory(prefix="golden-flwr-home-") as home:
        os.environ["FLWR_HOME"], os.environ["FLWR_TELEMETRY_ENABLED"] = home, "0"
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def run_case(case: GoldenCase, run_dir: Path) -> dict[str, Any]:
    """Run `case` into the (new) `run_dir` through the public entry points and return its fingerprint."""
    torch.set_num_threads(1)
    cfg = case.config()
    if case.runtime == "flower-simulation":
        with private_flower_home():
            from fedhet.runtimes.flower.simulation import run_flower_simulation

            run_flower_simulation(cfg, run_dir, num_cpus=2)
    else:
        run_experiment = _run_experiment()
        run_experiment(cfg, run_dir, progress=False)
    return fingerprint(case, run_dir)


def _run_experiment() -> Callable[..., Any]:
    """`run_experiment`: in fedhet.launch.run since issue 14's layer moves, in fedhet.engine.loop before (the tree
    golden.json was recorded from)."""
    try:
        from fedhet.launch.run import run_experiment
    except ModuleNotFoundError:
        from fedhet.engine.loop import run_experiment  # type: ignore[no-redef,attr-defined,unused-ignore]
    return run_experiment  # type: ignore[no-any-return,unused-ignore]


def machine() -> dict[str, str]:
    """What float results depend on besides the code: equal fingerprints allow a bit-for-bit comparison."""
    return {"torch": torch.__version__, "numpy": numpy.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
            "python": platform.python_version(), "cpu": _cpu_model()}


def _cpu_model() -> str:
    """The CPU's model name and a digest of its feature flags: two CPUs with the same capability (AVX512 on an AMD
    EPYC and on an Intel Xeon) round differently in the last bit (seen 2026-11-28), and a VM's generic name
    ("Intel(R) Xeon(R) Processor @ 2.80GHz") can stand for several generations, whose flags differ (oneDNN picks
    its kernels by them)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        fields = dict(line.split(":", 1) for line in cpuinfo.read_text().split("\n\n")[0].splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        flags = hashlib.sha256(" ".join(sorted(fields.get("flags", "").split())).encode()).hexdigest()[:12]
        return f"{fields.get('model name', 'unknown')} (flags {flags})"
    return platform.processor() or "unknown"

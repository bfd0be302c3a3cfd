"""The cost table: parameters per client per round come from the run's own messages (FedAvg sends the whole
state, FedBN keeps its BatchNorm), wall times from the summaries."""

from __future__ import annotations

from pathlib import Path

import torch

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.launch.run import run_experiment
from fedhet.report.cost import cost_section
from fedhet.report.runs import load_runs

TINY = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "rounds=2",
        "train.local_steps=1", "run.quiet=true", "data.max_test_per_client=20", "run.num_threads=1"]


def test_traffic_is_counted_from_the_messages_and_reported(tmp_path: Path) -> None:
    for method in ("fedavg", "fedbn"):
        run_experiment(load_config(None, [*TINY, f"method={method}"]), tmp_path / method)
    runs = {r.method: r for r in load_runs(tmp_path)}
    model = build_experiment(load_config(None, TINY)).model_fn()
    whole = sum(v.numel() for v in model.state_dict().values())
    norm = sum(v.numel() for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
               for v in m.state_dict().values())
    fedavg, fedbn = (runs[m].summary["traffic_per_client_round"] for m in ("fedavg", "fedbn"))
    assert fedavg["up_params"] == fedavg["down_params"] == whole
    assert fedavg["up_bytes"] >= 4 * whole - 8 * len(model.state_dict())  # float32 (+ int64 counters)
    assert 0 < fedbn["up_params"] < whole and fedbn["up_params"] == whole - norm
    table = cost_section(list(runs.values()))
    row = next(line for line in table.splitlines() if "| fedavg |" in line)
    assert f"| {whole / 1e3:.1f}k | {whole / 1e3:.1f}k |" in row and row.endswith("| 1 |")

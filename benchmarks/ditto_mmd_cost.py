"""Ditto + MMD: wall time per local step of each feature penalty relative to plain Ditto (spec ditto_mmd.md §5.7:
"kernel optimization is the main overhead").

For one config (default: configs/ditto_mmd/synthetic.yaml at alpha = beta = 0.5), every row of
configs/ditto_mmd/rows.yaml (FedAvg, Ditto, the penalties alone and added to Ditto) runs one client's `fit` of
round 1 and round 2 (round 2 is timed: at round 1 the personal and global models start equal and the first
re-fit is skipped); the time is divided by the number of local steps of the global model (Ditto's personal
pass takes as many again, so the ratios compare whole client rounds). Rows are repeated
`repeats` times, interleaved, and the median is reported with the ratio to Ditto.

    python benchmarks/ditto_mmd_cost.py --out docs/results/ditto_mmd_cost_synthetic.json
    FEDHET_DATA=... python benchmarks/ditto_mmd_cost.py --config configs/ditto_mmd/fashion_mnist.yaml \
        --out docs/results/ditto_mmd_cost_fmnist.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.core.seeding import seeded
from fedhet.engine.experiment import build_experiment
from fedhet.engine.local import fit_client
from fedhet.launch.sweep import plan_sweep


def time_fit(exp: Any, client: int) -> tuple[float, int]:
    """Seconds of the client's round-2 fit (after a round-1 fit) and its number of local steps."""
    alg = exp.algorithm
    server = alg.init_server()
    state = alg.init_client(client)
    for rnd in (1, 2):
        ctx = exp.context(client, rnd)
        with seeded(exp.config.seed, rnd, client, "fit"):
            start = time.perf_counter()
            reply, state = fit_client(alg, alg.broadcast(server, ctx.info, client), state, ctx)
            elapsed = time.perf_counter() - start
    steps = int(reply.scalars.get("steps", 0)) or 1
    return elapsed, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ditto_mmd/synthetic.yaml")
    parser.add_argument("--dataset", default="synthetic_a05_b05")
    parser.add_argument("--client", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    datasets = [args.dataset] if cfg.data.dataset.startswith("synthetic") else None
    plan = plan_sweep(cfg, seeds=[0], datasets=datasets)
    experiments = {c.variant: build_experiment(c) for c in plan.configs}
    times: dict[str, list[float]] = {label: [] for label in experiments}
    steps: dict[str, int] = {}
    for _ in range(args.repeats):
        for label, exp in experiments.items():
            seconds, n = time_fit(exp, args.client)
            times[label].append(seconds / n)
            steps[label] = n
    ditto = statistics.median(times["ditto"])
    rows = [{"row": label, "method": experiments[label].config.method,
             "method_args": experiments[label].config.method_args, "steps": steps[label],
             "ms_per_step": 1e3 * statistics.median(t), "vs_ditto": statistics.median(t) / ditto}
            for label, t in times.items()]
    for r in rows:
        print(f"{r['row']:<16} {r['ms_per_step']:8.3f} ms/step  x{r['vs_ditto']:.2f} vs Ditto  ({r['steps']} steps)")
    report = {"config": args.config, "dataset": plan.configs[0].data.dataset, "client": args.client,
              "repeats": args.repeats, "threads": args.threads,
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__, "cpus": torch.get_num_threads()},
              "rows": rows}
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

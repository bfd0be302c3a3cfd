"""Resident memory across rounds: a 50-round run must not grow after round 2.

    python benchmarks/memory_flat.py --rounds 50 --method fedbn --out docs/results/memory.json
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.engine.loop import RoundLoop
from fedhet.launch.run import make_executor


def rss_mib() -> float:
    """Resident set size of this process (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--method", default="fedbn")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(None, ["data.dataset=offline_digits", "model.name=small_cnn", f"method={args.method}",
                             f"rounds={args.rounds}", "train.local_steps=5", "run.quiet=true",
                             "run.checkpoint_every=10", f"run.out_dir=/tmp/fedhet_mem_{args.method}"])
    exp = build_experiment(cfg)
    loop = RoundLoop(exp, Path(cfg.run.out_dir) / "run", make_executor(exp), progress=False)
    rss = []
    for rnd in range(1, args.rounds + 1):
        loop.train_round(rnd)
        loop.evaluate_round(rnd)
        loop.round = rnd
        if rnd % cfg.run.checkpoint_every == 0:
            loop.checkpoint()
        gc.collect()
        rss.append(rss_mib())
    result = {"method": args.method, "rounds": args.rounds, "rss_mib_per_round": [round(r, 1) for r in rss],
              "rss_round2_mib": rss[1], "rss_max_after_round2_mib": max(rss[2:]),
              "growth_after_round2_mib": max(rss[2:]) - rss[1], "metrics_rows_kept": len(loop.metrics)}
    print(json.dumps({k: v for k, v in result.items() if k != "rss_mib_per_round"}, indent=2))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

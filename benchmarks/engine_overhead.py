"""Engine overhead: per-round wall time of fedhet FedAvg vs a bare PyTorch loop doing the same work.

Both run in this process on the same client datasets, the same model and the same number of local SGD
steps per client; the bare loop loads the global weights into one model, trains each client, averages the
state dicts by sample count and moves on. Evaluation is excluded from both (fedhet evaluates only after the
last round here). We report the median per-round time over rounds after a warm-up, alternating the two
loops so that machine noise hits both alike.

    python benchmarks/engine_overhead.py --model digits_cnn --rounds 12 --out docs/results/engine_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.core.seeding import seeded
from fedhet.engine.batching import batches
from fedhet.engine.experiment import build_experiment
from fedhet.engine.local import make_optimizer
from fedhet.engine.loop import RoundLoop
from fedhet.launch.run import make_executor


def bare_round(model: nn.Module, global_state: dict, datasets: list, cfg, rnd: int, seed: int) -> dict:
    """One FedAvg round written directly in PyTorch."""
    states, sizes = [], []
    for cid, ds in enumerate(datasets):
        model.load_state_dict(global_state)
        opt = make_optimizer(model.parameters(), cfg.train)
        model.train()
        with seeded(seed, rnd, cid, "fit"):
            for x, y in batches(ds, cfg.train):
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        sizes.append(len(ds))
    total = sum(sizes)
    return {k: sum(s[k].double() * (n / total) for s, n in zip(states, sizes, strict=True)).to(states[0][k].dtype)
            for k in states[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(None, ["data.dataset=offline_digits", f"model.name={args.model}", "method=fedavg",
                             f"rounds={args.rounds + args.warmup}", f"train.local_steps={args.local_steps}",
                             "train.batch_size=32", "run.quiet=true", "data.augment=false", "run.device=cpu"])
    exp = build_experiment(cfg)
    loop = RoundLoop(exp, Path("/tmp/fedhet_overhead_run"), make_executor(exp), progress=False)
    model = exp.model_fn()
    bare_state = {k: v.clone() for k, v in model.state_dict().items()}
    datasets = [c.train for c in exp.data.clients]
    fed_times, bare_times = [], []
    for rnd in range(1, args.rounds + args.warmup + 1):
        t0 = time.perf_counter()
        loop.train_round(rnd)
        t1 = time.perf_counter()
        bare_state = bare_round(model, bare_state, datasets, cfg, rnd, cfg.seed)
        t2 = time.perf_counter()
        if rnd > args.warmup:
            fed_times.append(t1 - t0)
            bare_times.append(t2 - t1)
    same = all(torch.allclose(loop.server.model[k].double(), bare_state[k].double(), atol=1e-5)
               for k in bare_state)
    result = {
        "model": args.model, "clients": len(datasets), "local_steps": args.local_steps, "batch_size": 32,
        "rounds_timed": args.rounds, "fedhet_median_s": statistics.median(fed_times),
        "bare_median_s": statistics.median(bare_times),
        "ratio": statistics.median(fed_times) / statistics.median(bare_times),
        "same_weights_as_bare_loop": same, "threads": args.threads,
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, CPU",
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Per-client cost of the in-process engine against a bare loop (issue 42 item 1; docs/results/runtimes.md
"Per-client cost (issue 42)").

`micro`: fedpop_lanes.py's micro workload (64 clients x `--steps` SGD steps of batch 32, MLPs of 778 to 159k
parameters): `InProcessClients.fit` against the bare sequential loop, side by side in this process, `--repeats`
times each (alternating, so machine noise hits both alike); the median ratio and its spread (min-max).
`clients1000`: configs/flower_sim_100.yaml with 1000 clients, 2 local steps, every client training each round:
`RoundLoop.train_round` (fit and aggregate) against engine_overhead.py's bare FedAvg round on the same data.
`profile`: cProfile of the in-process fit of one micro size, its time split into the engine's per-client work
(seeding, state restore, optimizer construction, batch drawing, NaN checks, reply and state copies, aggregation)
and the torch work that the bare loop does too (forward, backward, optimizer step).

    python benchmarks/client_cost.py micro --repeats 3
    FEDHET_DATA=/work/shared/data python benchmarks/client_cost.py clients1000 --repeats 3
    python benchmarks/client_cost.py profile --size 60-20
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_overhead import bare_round  # noqa: E402
from fedpop_lanes import CLIENTS, SIZES, bare, experiment  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.loop import RoundLoop  # noqa: E402
from fedhet.launch.run import make_executor  # noqa: E402
from fedhet.runtimes.inprocess import InProcessClients  # noqa: E402

# (label, file suffix, function name): cumulative time of these functions, per client
PARTS = [("seeding: per client seeded (save / seed / restore)", "core/seeding.py", "seeded"),
         ("seeding: per client reseed", "core/seeding.py", "reseed"),
         ("seeding: one save / restore per round", "core/seeding.py", "rngs_kept"),
         ("state restore (broadcast into the workspace)", "algorithms/base.py", "start"),
         ("optimizer construction", "engine/local.py", "__init__"),
         ("optimizer state copies (persisted)", "engine/local.py", "persisted"),
         ("batch drawing (indices, gather, transform)", "engine/batching.py", "batches"),
         ("NaN / inf check of each loss", "losses/descent.py", "check_finite"),
         ("reply and state copies (finish)", "algorithms/base.py", "finish"),
         ("client context", "engine/experiment.py", "context"),
         ("forward + loss (bare loop too)", "losses/classification.py", "cross_entropy"),
         ("backward (bare loop too)", "torch/_tensor.py", "backward"),
         ("optimizer step (bare loop too)", "torch/optim/optimizer.py", "wrapper"),
         ("zero_grad (bare loop too)", "torch/optim/optimizer.py", "zero_grad"),
         ("float64 aggregation", "core/aggregation.py", "average")]


def alternate(first: Callable[[], object], second: Callable[[], object], repeats: int) -> dict[str, float]:
    """Both timed `repeats` times, alternating after one warm-up each: median seconds and the ratio's median and
    spread (min-max), by wall clock and by this process's CPU time (`cpu_`: what other processes on a loaded
    machine take from the wall clock does not count; one torch thread)."""
    first(), second()
    wall: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for k, fn in enumerate((first, second)):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - start_cpu)
    out = {}
    for prefix, (a, b) in (("", wall), ("cpu_", cpu)):
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        out |= {f"{prefix}bare_s": statistics.median(a), f"{prefix}fedhet_s": statistics.median(b),
                f"{prefix}ratio": statistics.median(ratios), f"{prefix}ratio_min": min(ratios),
                f"{prefix}ratio_max": max(ratios)}
    return out


def micro(args: argparse.Namespace) -> list[dict[str, object]]:
    rows = []
    for d_in, hidden in SIZES:
        exp = experiment(d_in, hidden, args.steps)
        alg = exp.algorithm
        msg = alg.broadcast(alg.init_server(), exp.round_info(1), 0)
        messages = {cid: msg for cid in range(CLIENTS)}
        seq, _ = bare(exp, args.steps)
        inproc = InProcessClients(exp)
        row = {"mlp": f"{d_in}-{hidden}-10", "params": sum(p.numel() for p in alg.parts.new().parameters()),
               **alternate(seq, lambda: inproc.fit(1, messages), args.repeats)}  # noqa: B023 (called at once)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def clients1000(args: argparse.Namespace) -> list[dict[str, object]]:
    cfg = load_config("configs/flower_sim_100.yaml", ["data.num_clients=1000", f"train.local_steps={args.steps}",
                                                      "server.fraction_fit=1.0", "run.quiet=true", "rounds=100"])
    exp = build_experiment(cfg)
    loop = RoundLoop(exp, Path("/tmp/fedhet_client_cost_run"), make_executor(exp), progress=False)
    model = exp.model_fn()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    datasets = [c.train for c in exp.data.clients]
    rnd = iter(range(1, 1000))
    row = {"config": "flower_sim_100 x 1000 clients", "local_steps": args.steps,
           **alternate(lambda: bare_round(model, state, datasets, cfg, 1, cfg.seed),
                       lambda: loop.train_round(next(rnd)), args.repeats)}
    print(json.dumps(row), flush=True)
    return [row]


def profile(args: argparse.Namespace) -> list[dict[str, object]]:
    d_in, hidden = (int(v) for v in args.size.split("-"))
    exp = experiment(d_in, hidden, args.steps)
    alg = exp.algorithm
    msg = alg.broadcast(alg.init_server(), exp.round_info(1), 0)
    messages = {cid: msg for cid in range(CLIENTS)}
    inproc = InProcessClients(exp)
    inproc.fit(1, messages)
    prof = cProfile.Profile()
    prof.enable()
    replies = inproc.fit(1, messages)
    alg.aggregate(alg.init_server(), replies, exp.round_info(1))
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())  # (calls, primitive calls, own time, cumulative, callers)
    rows: list[dict[str, object]] = []
    for label, suffix, name in PARTS:
        cum = sum(v[3] for (file, _, func), v in stats.items() if file.endswith(suffix) and func == name)
        rows.append({"part": label, "ms_per_client": 1000 * cum / CLIENTS, "share": cum / total})
    rows.append({"part": "total (fit of 64 clients + aggregation)", "ms_per_client": 1000 * total / CLIENTS,
                 "share": 1.0})
    for row in rows:
        print(f"{row['part']:<48} {row['ms_per_client']:7.3f} ms/client {100 * row['share']:5.1f} %")  # type: ignore[operator]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["micro", "clients1000", "profile"])
    parser.add_argument("--steps", type=int, default=None, help="local steps (micro / profile 10, clients1000 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="60-20", help="profile: the MLP d_in-hidden")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    args.steps = args.steps or (2 if args.part == "clients1000" else 10)
    torch.set_num_threads(args.threads)
    rows = {"micro": micro, "clients1000": clients1000, "profile": profile}[args.part](args)
    load = os.getloadavg()
    print(json.dumps({"part": args.part, "load_avg": load, "threads": args.threads, "rows": len(rows)}))


if __name__ == "__main__":
    main()

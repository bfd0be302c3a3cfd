"""Local-training time per round: the in-process runtime (clients one after another) vs the batched runtime.

For each model and number of clients N, every client holds the training split of one offline_digits domain
(cycled over the 4 domains: ~360 samples of 3x28x28, so every mini-batch is full), pre-transformed into a
TensorDataset so that the per-sample torchvision pipeline (the same cost in both runtimes, see
docs/runtimes_batched.md) is not what is timed. One round = `fit` of all N clients from the same global model
(`local_steps` mini-batches of `batch_size` each); server aggregation and evaluation are excluded. Timed after
`warmup` rounds, median over `rounds`. The first timed round's replies of the two runtimes are compared
(`max_abs_diff` over every shared array) as a sanity check.

Models: `digits_cnn_nobn` (the FedBN Digits CNN with norm none, as in the issue's probe; FedAvg),
`digits_cnn_bn` (with BatchNorm; FedBN, BatchNorm kept per client) and `mlp` (hidden 256, 128; FedAvg).

    python benchmarks/batched_speed.py --out docs/results/batched_speed_cpu.json              # full grid
    python benchmarks/batched_speed.py --models mlp --clients 4 --local-steps 1 --rounds 1 --warmup 0  # smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from typing import Any

import torch
from torch.utils.data import TensorDataset

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.core.messages import Message, Reply
from fedhet.data import ClientData
from fedhet.engine.experiment import Experiment, arrange, build_experiment
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.inprocess import InProcessClients

MODELS: dict[str, list[str]] = {
    "digits_cnn_nobn": ["model.name=digits_cnn", "model.args={norm: none}", "method=fedavg"],
    "digits_cnn_bn": ["model.name=digits_cnn", "model.args={norm: bn}", "method=fedbn"],
    "mlp": ["model.name=mlp", "model.args={hidden: [256, 128]}", "method=fedavg"],
}


def tensor_clients(exp: Experiment, n: int) -> list[ClientData]:
    """n clients, client k holding the (pre-transformed) training split of domain k mod 4."""
    domains = []
    for client in exp.data.clients:
        xs, ys = zip(*(client.train[i] for i in range(client.num_train)), strict=True)
        ds = TensorDataset(torch.stack(xs), torch.stack(ys))
        domains.append(ClientData(client.name, client.domain, ds, None, ds, ds))
    return [dataclasses.replace(domains[k % len(domains)], name=f"client{k}") for k in range(n)]


def experiment(model: str, n: int, args: argparse.Namespace) -> Experiment:
    cfg = load_config(None, ["data.dataset=offline_digits", "data.augment=false", *MODELS[model],
                             f"train.local_steps={args.local_steps}", f"train.batch_size={args.batch_size}",
                             "train.lr=0.01", "train.momentum=0.5", f"run.device={args.device}", "run.quiet=true",
                             "run.runtime=batched", *args.set])
    exp = build_experiment(cfg)
    data = dataclasses.replace(exp.data, clients=tensor_clients(exp, n))
    return dataclasses.replace(exp, data=data, arrangement=arrange(exp.algorithm, data))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(clients: InProcessClients, messages: dict[int, Message], device: torch.device, warmup: int,
                rounds: int) -> tuple[list[float], list[Reply]]:
    """Seconds per `fit` over `rounds` timed rounds (after `warmup`), and the first timed round's replies."""
    times, first = [], []
    for r in range(warmup + rounds):
        sync(device)
        start = time.perf_counter()
        replies = clients.fit(r + 1, messages)
        sync(device)
        if r >= warmup:
            times.append(time.perf_counter() - start)
            first = first or replies[:KEEP_REPLIES]
        del replies
    return times, first


KEEP_REPLIES = 8  # replies compared between the runtimes (all N would hold N full models twice: 256 x 57 MB x 2)


def max_diff(a: list[Reply], b: list[Reply]) -> float:
    """Largest |difference| between the two runtimes' replies, over every floating-point array."""
    return max(float((x - rb.message.arrays[k]).double().abs().max())
               for ra, rb in zip(a, b, strict=True) for k, x in ra.message.arrays.items() if x.is_floating_point())


def measure(model: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    exp = experiment(model, n, args)
    alg = exp.algorithm
    server = alg.init_server()
    shared = alg.broadcast(server, exp.round_info(1), 0)  # the same global model for every client: one copy, not N
    messages = {cid: shared for cid in range(n)}
    batched = BatchedClients(exp)
    row: dict[str, Any] = {"model": model, "method": exp.config.method, "clients": n,
                           "local_steps": args.local_steps, "batch_size": args.batch_size,
                           "params_per_client": sum(p.numel() for p in alg.parts.new().parameters()),
                           "chunk_size": batched.chunk_size}
    b_times, b_replies = time_rounds(batched, messages, exp.device, args.warmup, args.rounds)
    row["batched_s"] = statistics.median(b_times)
    if args.sequential_max is None or n <= args.sequential_max:
        s_times, s_replies = time_rounds(InProcessClients(exp), messages, exp.device, args.warmup, args.rounds)
        row["sequential_s"] = statistics.median(s_times)
        row["speedup"] = row["sequential_s"] / row["batched_s"]
        row["sequential_ms_per_client_step"] = 1e3 * row["sequential_s"] / (n * args.local_steps)
        row["max_abs_diff"] = max_diff(s_replies, b_replies)
    row["batched_ms_per_client_step"] = 1e3 * row["batched_s"] / (n * args.local_steps)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits_cnn_nobn,mlp", help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--clients", default="4,16,64,256")
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sequential-max", type=int, default=None, help="time the sequential runtime only up to "
                        "this many clients (it is the slow one)")
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides, e.g. run.batched_max_clients=64")
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for model in args.models.split(","):
        for n in (int(c) for c in args.clients.split(",")):
            row = measure(model, n, args)
            results.append(row)
            print(json.dumps(row), flush=True)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    payload = {"benchmark": "batched_speed", "torch": torch.__version__, "python": platform.python_version(),
               "machine": platform.machine(), "processor": platform.processor(), "threads": torch.get_num_threads(),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "args": vars(args), "results": results}
    if args.out:
        atomic_write_text(args.out, json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()

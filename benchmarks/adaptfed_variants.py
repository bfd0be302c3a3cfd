"""AdaptFED's variants side by side (issue 17, item 4 and the cost line): the generator's parameters, what one
client receives and sends per round, and the server's hypernetwork time per round against a client's local
training time, for the configuration of configs/adaptfed/common.yaml (50 clients, 5 sampled per round).

    python benchmarks/adaptfed_variants.py --out docs/results/adaptfed/variants.md

Per variant: build the experiment, time one round by hand (5 clients: broadcast = generating P_i, fit = the
client's local training, aggregate = FedAvg of xi + the hypernetwork's VJP step), and count the messages.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.core.messages import Reply, traffic
from fedhet.engine.experiment import build_experiment
from fedhet.engine.local import fit_client
from fedhet.models.hypernet import hypernet_param_count
from fedhet.report.cost import format_params

VARIANTS: dict[str, list[str]] = {
    "AdaptFED (full rank)": [],
    "AdaptFED, rank 8 (ours)": ["method_args.rank=8"],
    "AdaptFED, rank 2 (ours)": ["method_args.rank=2"],
    "AdaptFED, LoRA factors r=4 (ours)": ["method_args.lora_rank=4"],
    "AdaptFED, LoRA factors r=2 (ours)": ["method_args.lora_rank=2"],
    "AdaptFED, task-aware (ours)": ["method_args.descriptor=label_histogram"],
    "Vanilla-T": ["method_args.generator=local"],
    "pFedHN-T": ["method_args.personalize=[all]"],
    "FedTP-T (ViT)": ["model.name=vit", "model.init_from=runs/adaptfed/vit_mnist.pt",
                      "method_args.personalize=[attention_qkv]"],
}


def measure(overrides: list[str], clients: int = 5) -> dict[str, Any]:
    exp = build_experiment(load_config("configs/adaptfed/common.yaml", overrides))
    alg, info = exp.algorithm, exp.round_info(1)
    server = exp.init_server()
    t0 = time.perf_counter()
    sent = {cid: alg.broadcast(server, info, cid) for cid in range(clients)}
    t1 = time.perf_counter()
    replies = [Reply(cid, fit_client(alg, msg, alg.init_client(cid), exp.context(cid, 1))[0],
                     exp.data.clients[cid].num_train) for cid, msg in sent.items()]
    t2 = time.perf_counter()
    alg.aggregate(server, replies, info)
    t3 = time.perf_counter()
    counts = hypernet_param_count(alg.hypernet()) if alg.params.generator == "hypernet" else {}
    flows = traffic(list(sent.values()), [r.message for r in replies])
    return {"counts": counts, "p": alg.partition.p_numel, "traffic": flows, "generate_s": (t1 - t0) / clients,
            "fit_s": (t2 - t1) / clients, "aggregate_s": t3 - t2}


def row(name: str, m: dict[str, Any]) -> str:
    c, t = m["counts"], m["traffic"]
    gen = f"{format_params(c['phi'])} + {format_params(c['embedding'])}" if c else "– (P_i kept by each client)"
    emitted = format_params(c["emitted"]) if c else "–"
    return (f"| {name} | {format_params(m['p'])} | {gen} | {emitted} | "
            f"{t['down_params']:,.0f} / {t['up_params']:,.0f} | "
            f"{t['down_bytes'] / 1024:.0f} / {t['up_bytes'] / 1024:.0f} KiB | "
            f"{1000 * m['generate_s']:.0f} ms + {1000 * m['aggregate_s']:.0f} ms | {m['fit_s']:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = ["| variant | D_s (P per client) | generator phi + z | emitted per client | params down / up per "
             "client-round | bytes down / up | server: generate per client + VJP step per round | client: local "
             "training |", "|---|---|---|---|---|---|---|---|"]
    for name, overrides in VARIANTS.items():
        lines.append(row(name, measure(overrides)))
        print(lines[-1], flush=True)
    atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Cross-domain accuracy matrix: train on one domain, test on every domain (proves the shift is real).

A model trained on domain i is evaluated on the test split of each domain j. Strong diagonal, weak
off-diagonal = a real feature shift.

    python benchmarks/cross_domain_matrix.py --dataset offline_digits --epochs 15 \
        --out docs/results/offline_digits_shift.md
"""

from __future__ import annotations

import argparse
import platform

import torch

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.core.seeding import seeded
from fedhet.data import build_federated_data
from fedhet.engine.evaluation import evaluate
from fedhet.engine.experiment import make_model_fn, resolve_device
from fedhet.engine.local import train_local


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="offline_digits")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(None, [f"data.dataset={args.dataset}", f"model.name={args.model}", f"seed={args.seed}",
                             f"train.local_epochs={args.epochs}", "train.lr=0.05", "data.augment=false",
                             *args.overrides])
    device = resolve_device(cfg.run.device)
    data = build_federated_data(cfg.data, cfg.seed)
    model_fn = make_model_fn(cfg, data)
    names = [c.name for c in data.clients]
    rows = []
    for i, source in enumerate(data.clients):
        model = model_fn().to(device)
        with seeded(cfg.seed, "cross-domain", i):
            train_local(model, source.train, cfg.train, device)
        rows.append([evaluate(model, target.test, device)["accuracy"] for target in data.clients])
    lines = [f"| train \\ test | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|"]
    for name, row in zip(names, rows, strict=True):
        cells = [f"**{100 * a:.1f}**" if j == k else f"{100 * a:.1f}" for k, a in enumerate(row)
                 for j in [names.index(name)]]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    diag = sum(rows[i][i] for i in range(len(rows))) / len(rows)
    off = [rows[i][j] for i in range(len(rows)) for j in range(len(rows)) if i != j]
    table = "\n".join(lines)
    text = (f"{table}\n\nmean in-domain accuracy {100 * diag:.1f}%, mean cross-domain accuracy "
            f"{100 * sum(off) / len(off):.1f}% (test accuracy, %; {args.model}, {args.epochs} epochs, seed "
            f"{args.seed}, {platform.machine()} CPU, torch {torch.__version__})\n")
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()

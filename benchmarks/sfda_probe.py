"""Probe of the Fed-SFDA drop (docs/results/adaptfed.md, "Fed-SFDA"): from a finished run's source model, one
client's local round under several training regimes, each evaluated on the pooled target test split.

The source model is a client's `source` state in the run's checkpoint (runs made with kd_teacher=source keep it).
Regimes, each from the same start with the run's optimizer settings and the client's own batches:
  supervised-train   cross-entropy on the true labels, model in train mode (the upper bound of one round)
  supervised-eval    the same with the model in eval mode (no dropout / drop-connect, BatchNorm frozen)
  kd-self-train      KD to the identical source model, train mode (what the kd-only run did in its round 2)
  kd-self-eval       the same in eval mode
  sfda-train         the run's client loss, L_PSEUDO (threshold 0.9) + L_KD (T = 2) to the source, train mode
each at every learning rate of --lrs (default: the run's train.lr and a tenth of it).
Usage: python benchmarks/sfda_probe.py RUN_DIR [--client 0] [--epochs 1] [--lrs 0.01,0.001]
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from fedhet.algorithms.fed_sfda_parts import kd_loss, pseudo_label_loss
from fedhet.config.loading import load_config
from fedhet.data.federated import build_federated_data
from fedhet.engine.evaluation import evaluate
from fedhet.models.base import build_model

Loss = Callable[[nn.Module, nn.Module, Tensor, Tensor], Tensor]


def accuracy(model: nn.Module, data: Dataset) -> float:
    """Top-1 accuracy (%) in eval mode (the engine's own evaluation)."""
    return 100.0 * evaluate(model, data, torch.device("cpu"))["accuracy"]


def supervised(model: nn.Module, source: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(model(x), y)


def kd_self(model: nn.Module, source: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    with torch.no_grad():
        target = source(x)
    return kd_loss(model(x), target, 2.0)


def sfda(model: nn.Module, source: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    with torch.no_grad():
        target = source(x)
    student = model(x)
    return pseudo_label_loss(student, target, 0.9)[0] + kd_loss(student, target, 2.0)


def local_round(start: nn.Module, data: Dataset, loss_fn: Loss, train_mode: bool, lr: float, momentum: float,
                batch_size: int, epochs: int, seed: int) -> nn.Module:
    """One client's local round from `start` (SGD); the source model stays in eval mode."""
    torch.manual_seed(seed)  # dropout and drop-connect draw the same masks in every regime
    model, source = copy.deepcopy(start), copy.deepcopy(start).eval()
    model.train(train_mode)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for x, y in DataLoader(data, batch_size=batch_size, shuffle=True, generator=gen):
            opt.zero_grad()
            loss_fn(model, source, x, y).backward()
            opt.step()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--client", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lrs", default="", help="comma-separated learning rates (default: train.lr, train.lr/10)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.run / "config.yaml")
    ckpt = torch.load(args.run / "checkpoints" / "latest.pt", map_location="cpu", weights_only=False)
    source_state = ckpt["clients"][args.client].source
    if source_state is None:
        raise SystemExit(f"{args.run}: client {args.client} keeps no source model (run with kd_teacher=source)")
    data = build_federated_data(cfg.data, cfg.seed)
    model = build_model(cfg.model.name, data.num_classes, data.input_shape, cfg.model.pretrained, **cfg.model.args)
    model.load_state_dict(source_state)
    test, train = data.pooled_test(), data.clients[args.client].train
    t = cfg.train
    results = {"source (eval mode)": accuracy(model, test)}
    lrs = [float(v) for v in args.lrs.split(",")] if args.lrs else [t.lr, t.lr / 10]
    regimes = [("supervised-train", supervised, True), ("supervised-eval", supervised, False),
               ("kd-self-train", kd_self, True), ("kd-self-eval", kd_self, False), ("sfda-train", sfda, True)]
    for lr in lrs:
        for name, loss_fn, train_mode in regimes:
            after = local_round(model, train, loss_fn, train_mode, lr, t.momentum, t.batch_size, args.epochs,
                                cfg.seed)
            key = f"{name} lr {lr:g}"
            results[key] = accuracy(after, test)
            print(f"{key:28s} {results[key]:6.2f}", flush=True)
    sizes = {"train_images": len(train), "test_images": len(test)}  # type: ignore[arg-type]
    print(json.dumps({"run": str(args.run), "client": args.client, "epochs": args.epochs, **sizes,
                      "accuracy": results}, indent=1))


if __name__ == "__main__":
    main()

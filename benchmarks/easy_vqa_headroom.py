"""Headroom of the easy-VQA benchmarks: does a plain model saturate a client's test set?

A plain VQA model (a 3-layer CNN on the image pooled to 4x4 and a linear layer, mean-pooled word embeddings for the
question, concatenated, MLP head over the 13 answers; ~144k parameters) is trained with Adam (lr 1e-3, batch 64)
in three settings and scored on every client's own test set (Task clients: argmax over the client's answer pool):
- `pooled`: centrally on the union of the benchmark's client training sets (the data-sharing oracle);
- `local`: on each client's training set alone (the "-L" baselines);
- `source`: centrally on `easy_vqa_source` (clean images, answer-balanced, its five family domains pooled; 9,661
  questions), then applied to the clients as is (a model that has seen other data: the premise of a frozen
  pretrained backbone).

    python benchmarks/easy_vqa_headroom.py --out docs/results/easy_vqa_headroom.json
    python benchmarks/easy_vqa_headroom.py --benchmarks easy_vqa_task --epochs 2 --source-epochs 0   # smoke
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from fedhet.config import DataConfig
from fedhet.core.batches import restrict_logits
from fedhet.data import build_federated_data
from fedhet.data.easy_vqa import PAD, VOCAB_SIZE

BENCHMARKS = ("easy_vqa_domain", "easy_vqa_function", "easy_vqa_scene", "easy_vqa_task")


class PlainVQA(nn.Module):
    """CNN image features ++ mean word embedding -> MLP -> 13 answer logits."""

    def __init__(self, num_answers: int = 13, width: int = 32, emb: int = 64) -> None:
        super().__init__()
        w = width
        self.cnn = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(4), nn.Flatten(),
            nn.Linear(2 * w * 16, 2 * w), nn.ReLU())
        self.words = nn.Embedding(VOCAB_SIZE, emb, padding_idx=PAD)
        self.head = nn.Sequential(nn.Linear(2 * w + emb, 128), nn.ReLU(), nn.Linear(128, num_answers))

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        image, question = x
        mask = (question != PAD).float().unsqueeze(-1)
        q = (self.words(question) * mask).sum(1) / mask.sum(1).clamp_min(1)
        return self.head(torch.cat([self.cnn(image), q], dim=1))


def train(model: nn.Module, data: Dataset, epochs: int, seed: int) -> float:
    """Adam lr 1e-3, batch 64, `epochs` passes; returns the seconds taken."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(seed))
    start = time.perf_counter()
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return time.perf_counter() - start


@torch.no_grad()
def accuracy(model: nn.Module, data: Dataset, classes: tuple[int, ...] | None) -> float:
    model.eval()
    hits, n = 0, 0
    for x, y in DataLoader(data, batch_size=256):
        hits += int((restrict_logits(model(x), classes).argmax(1) == y).sum())
        n += len(y)
    return hits / max(n, 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, torch threads 1",
                           "image_size": args.image_size, "seed": args.seed, "epochs": args.epochs, "results": {}}
    source_model = None
    if args.source_epochs > 0:
        torch.manual_seed(args.seed)
        src = build_federated_data(DataConfig(dataset="easy_vqa_source", image_size=args.image_size), args.seed)
        source_model = PlainVQA()
        secs = train(source_model, src.pooled_train(), args.source_epochs, args.seed)
        out["source"] = {"epochs": args.source_epochs, "seconds": round(secs, 1),
                         "test_acc": round(accuracy(source_model, src.pooled_test(), None), 4)}
        print("source", out["source"], flush=True)
    for name in args.benchmarks:
        fed = build_federated_data(DataConfig(dataset=name, image_size=args.image_size), args.seed)
        torch.manual_seed(args.seed)
        pooled = PlainVQA()
        secs = train(pooled, ConcatDataset([c.train for c in fed.clients]), args.epochs, args.seed)
        rows = {}
        for c in fed.clients:
            torch.manual_seed(args.seed)
            local = PlainVQA()
            train(local, c.train, args.epochs, args.seed)
            rows[c.name] = {"pooled": accuracy(pooled, c.test, c.classes), "local": accuracy(local, c.test, c.classes)}
            if source_model is not None:
                rows[c.name]["source"] = accuracy(source_model, c.test, c.classes)
        avg = {k: sum(r[k] for r in rows.values()) / len(rows) for k in next(iter(rows.values()))}
        out["results"][name] = {"clients": rows, "average": avg, "pooled_seconds": round(secs, 1)}
        print(name, json.dumps({k: {m: round(v, 3) for m, v in r.items()} for k, r in {**rows, "AVG": avg}.items()}),
              flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--source-epochs", type=int, default=10)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    out = run(args)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()

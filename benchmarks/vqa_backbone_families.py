"""Accuracy of a pretrained VQA backbone (its own head) on each domain's test split of its pretraining data:
for easy_vqa_source, one domain per question family (docs/results/feddat.md, "Setting").

    python benchmarks/vqa_backbone_families.py configs/feddat/pretrain.yaml runs/feddat/backbone.pt
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader

from fedhet.config import load_config
from fedhet.data import build_federated_data
from fedhet.models import build_model
from fedhet.models.vl_pretrain import evaluate_accuracy, load_backbone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config, [])
    data = build_federated_data(cfg.data, cfg.seed)
    model = build_model(cfg.model.name, data.num_classes, data.input_shape, vocabulary=data.vocabulary,
                        **{k: v for k, v in cfg.model.args.items() if k != "checkpoint"})
    load_backbone(model, args.checkpoint)
    print("| domain | test questions | accuracy (%) |\n|---|---|---|")
    for client in data.clients:
        accuracy = evaluate_accuracy(model.eval(), DataLoader(client.test, batch_size=256))
        print(f"| {client.name} | {len(client.test)} | {100 * accuracy:.1f} |")


if __name__ == "__main__":
    main()

"""`fedhet pretrain`: train a backbone centrally on a source dataset, then keep it as a frozen starting point.

FedDAT's premise is a frozen foundation model that has seen other data. No ViLT weights exist here, so the
stand-in is pretrained on the config's data (e.g. `easy_vqa_source`: easy-VQA images no benchmark client uses)
with its model, optimizer and batch size (`train.*`), for `epochs` epochs or `minutes` of wall time, and written
with `models.vl_pretrain.save_backbone` (atomically). The file records the config's fingerprint: asking again for
the same pretraining finds it and returns at once (`--force` trains again). Federated runs load it with
`model.args.checkpoint=PATH`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from fedhet.config import ExperimentConfig
from fedhet.core.seeding import seeded
from fedhet.data import build_federated_data
from fedhet.engine.checkpoint import fingerprint
from fedhet.errors import ConfigError
from fedhet.models import build_model
from fedhet.models.vl_pretrain import evaluate_accuracy, load_backbone, pretrain, save_backbone
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pretrained:
    """Where the backbone is, its held-out accuracy, and whether this call trained it (False: cached)."""

    path: Path
    accuracy: float
    trained: bool
    meta: JSONDict


def pretrain_key(cfg: ExperimentConfig, epochs: int, minutes: float | None) -> str:
    """What identifies a pretraining: the results-relevant config and the budget."""
    return fingerprint({**cfg.to_dict(), "pretrain": {"epochs": epochs, "minutes": minutes}})


def pretrain_backbone(cfg: ExperimentConfig, out: str | Path, epochs: int = 1, minutes: float | None = None,
                      force: bool = False, progress: bool = False) -> Pretrained:
    """Pretrain `cfg.model` on the pooled training data of `cfg.data` and save it to `out` (or find it there)."""
    if epochs < 1 or (minutes is not None and minutes <= 0):
        raise ConfigError("fedhet pretrain: --epochs must be >= 1 and --minutes > 0")
    out, key = Path(out), pretrain_key(cfg, epochs, minutes)
    data = build_federated_data(cfg.data, cfg.seed)
    with seeded(cfg.seed, "model-init"):
        args = {k: v for k, v in cfg.model.args.items() if k != "checkpoint"}
        model = build_model(cfg.model.name, data.num_classes, data.input_shape, pretrained=False,
                            vocabulary=data.vocabulary, **args)
    test = DataLoader(data.pooled_test(), batch_size=256)
    if out.is_file() and not force:
        meta = load_backbone(model, out)
        if meta.get("key") == key:
            log.info("pretrained backbone %s found (same config and budget)", out)
            return Pretrained(out, float(meta.get("accuracy", float("nan"))), False, meta)
    torch.set_num_threads(cfg.run.num_threads or torch.get_num_threads())
    with seeded(cfg.seed, "pretrain"):
        generator = torch.Generator().manual_seed(cfg.seed)
        train = DataLoader(data.pooled_train(), batch_size=cfg.train.batch_size, shuffle=True, generator=generator)
        result = pretrain(model, train, epochs=epochs, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                          max_seconds=None if minutes is None else 60.0 * minutes, log=log.info,
                          progress=progress)
    accuracy = evaluate_accuracy(model, test)
    meta = {"key": key, "accuracy": accuracy, "dataset": cfg.data.dataset, "model": cfg.model.name,
            "seed": cfg.seed, "steps": result.steps, "epochs": result.epochs, "seconds": round(result.seconds, 1)}
    save_backbone(model, out, meta)
    return Pretrained(out, accuracy, True, meta)

"""Helpers for tests: tiny synthetic clients and a tiny split model (import as `from fedhet_testing import ...`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

SHARED_DATA = Path(os.environ.get("FEDHET_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


# the smallest vision-language setting (FedDAT's methods): easy-VQA's Task benchmark (4 clients) on a 1-block
# ViLT-shaped transformer
TINY_VL = ["data.dataset=easy_vqa_task", "model.name=vl_transformer", "model.args={d: 16, depth: 1, heads: 2}",
           "train.optimizer=adamw", "train.lr=0.001"]


TINY_FOCAL = ["model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}"]


def tiny_ldm_dir() -> Path:
    """A tiny random diffusers LDM checkpoint folder (16 px, BERT text encoder with the MiniLM tokenizer), written
    once per test process into the temp folder."""
    import tempfile

    root = Path(tempfile.gettempdir()) / f"fedhet_tiny_ldm_{os.getpid()}"
    if not (root / "unet").is_dir():
        from fedhet.models.ldm import save_components, tiny_components

        save_components(tiny_components("bert"), root)
    return root


def tiny_ldm() -> list[str]:
    """FedBiP on the tiny LDM, as small as it goes: one round, a short concept pass, 2 PNDM steps, 1x data."""
    return ["rounds=1", f"method_args.ldm={tiny_ldm_dir()}", "method_args.concept_epochs=1",
            "method_args.steps=2", "method_args.multiplier=1", "method_args.classifier_epochs=1",
            "method_args.cache=false", "data.max_train_per_client=24"]


def for_method(method: str, overrides: list[str]) -> list[str]:
    """`overrides` plus method=<method>, and the tiny VL setting when the method needs a transformer over VQA data,
    the tiny FocalNet when it needs focal modulation or the tiny LDM when it needs latent diffusion
    (`Algorithm.capabilities.modality`): so tests over every registered method run each on a model and data it
    can train on."""
    from fedhet.algorithms import ALGORITHMS

    modality = ALGORITHMS.get(method).capabilities.modality
    extra = tiny_ldm() if modality == "latent-diffusion" else \
        {"vision-language": TINY_VL, "focal-modulation": TINY_FOCAL}.get(modality, [])
    one_shot = ["rounds=1"] if ALGORITHMS.get(method).one_shot else []  # FedD3: one round only
    return [*CHEAP.get(method, []), *overrides, *extra, *one_shot, f"method={method}"]


# method_args that keep a method's every-method test cheap without changing what the test checks (FedRep's
# default 5 full head epochs a round dominated its runs); the caller's overrides come after and win
CHEAP = {"fedrep": ["method_args.head_epochs=1"]}


def tiny_model(in_dim: int = 4, feat_dim: int = 3, num_classes: int = 2, bn: bool = False):
    """A linear feature extractor (+ optional BatchNorm1d) and a linear head, as a SplitModel."""
    from fedhet.models import SplitModel

    layers: list[nn.Module] = [nn.Linear(in_dim, feat_dim)]
    if bn:
        layers.append(nn.BatchNorm1d(feat_dim))
    return SplitModel(nn.Sequential(*layers), nn.Linear(feat_dim, num_classes), feat_dim, num_classes)


def tiny_client(n: int = 8, in_dim: int = 4, num_classes: int = 2, seed: int = 0, name: str = "c0"):
    """A ClientData with n random samples (same tensors for train, test and train_eval)."""
    from fedhet.data import ClientData

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=g)
    y = torch.arange(n) % num_classes
    ds = TensorDataset(x, y)
    return ClientData(name=name, domain=name, train=ds, val=None, test=ds, train_eval=ds)


def metric_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl without `train_time_s` (a measured time: the one field two runs of the
    same config do not share, fedhet.engine.rundir.TRAIN_TIME)."""
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "train_time_s"} for row in rows]


def assert_same_run(a: Path, b: Path) -> None:
    """Two run directories hold the same run: round, global and local weights bit for bit, metrics.jsonl row
    for row (its floats exact; all but the measured train_time_s)."""
    from fedhet.engine.safe_load import load_trusted

    ca = load_trusted(a / "checkpoints" / "latest.pt", "checkpoint")
    cb = load_trusted(b / "checkpoints" / "latest.pt", "checkpoint")
    assert ca["round"] == cb["round"]
    for key, value in ca["server"].model.items():
        assert torch.equal(value, cb["server"].model[key]), key
    for cid, state in ca["clients"].items():
        for key, value in state.local.items():
            assert torch.equal(value, cb["clients"][cid].local[key]), (cid, key)
    assert metric_rows(a) == metric_rows(b)


def first_round_reply(exp, cid: int = 0):  # noqa: ANN001, ANN201 - an Experiment, the algorithm's reply
    """Client `cid`'s reply to round 1's broadcast from the initial server state, seeded as the engine seeds it."""
    from fedhet.core.seeding import seeded
    from fedhet.engine.local import fit_client

    alg = exp.algorithm
    msg = alg.broadcast(alg.init_server(), exp.round_info(1), cid)
    with seeded(exp.config.seed, "fit", cid):
        reply, _ = fit_client(alg, msg, alg.init_client(cid), exp.context(cid, 1))
    return reply

"""`fedhet privacy RUN_DIR --attack inversion`: invert one client's real upload and score the reconstruction.

From the run's latest checkpoint, client `client` trains one local round through the engine (uploads.py) on a batch
of `batch` of its training images (drawn from (seed, "inversion-batch", client name), without augmentation so that the
true images are well defined), `steps` local SGD steps on that batch, with the run's lr, momentum and weight
decay. The attacker then reconstructs the batch from the upload minus the broadcast, over the uploaded parameters
only (inversion.py; the best of `restarts` tries), and each true image is scored against its best reconstruction
(PSNR, SSIM: image_quality.py). The entry goes to privacy.json under "inversion_<method>_<client>_b<batch>_k<steps>".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Subset

from fedhet.config import TrainConfig
from fedhet.core.protocols import num_samples
from fedhet.core.seeding import torch_generator
from fedhet.data import ClientData
from fedhet.errors import FedhetError
from fedhet.privacy.image_quality import best_matches
from fedhet.privacy.inversion import METHODS, TV_WEIGHT, LocalSGD, Observed, infer_label, reconstruct
from fedhet.privacy.rundir import AttackedRun, attacked_run, write_privacy
from fedhet.privacy.uploads import (
    Upload,
    check_uploads_weights,
    client_id,
    client_upload,
    server_copy,
    uploaded_weights,
    with_data,
)
from fedhet.yaml_input import JSONDict


def chosen_batch(client: ClientData, size: int, seed: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """`size` of the client's training samples (indices, images N x C x H x W, labels), drawn from the seed."""
    data = client.train_eval
    n = num_samples(data)
    if size > n:
        raise FedhetError(f"--batch {size} is larger than client '{client.name}''s {n} training samples; give "
                          f"--batch {n} or fewer")
    gen = torch_generator(seed, "inversion-batch", client.name)
    indices = [int(i) for i in torch.randperm(n, generator=gen)[:size]]
    samples = [data[i] for i in indices]
    images = [x for x, _ in samples]
    if not all(isinstance(x, torch.Tensor) and x.dim() == 3 for x in images):
        raise FedhetError(f"client '{client.name}''s samples are not C x H x W images; the inversion attack "
                          "reconstructs images (an image dataset)")
    return indices, torch.stack(images), torch.tensor([int(y) for _, y in samples])


def local_sgd(run: AttackedRun, batch: int, steps: int) -> tuple[TrainConfig, LocalSGD]:
    """The local training of the attacked round (`steps` full-batch steps) and the attacker's copy of it."""
    train = run.exp.config.train
    if train.optimizer != "sgd":
        raise FedhetError(f"the inversion attack simulates local SGD, but this run trains with train.optimizer="
                          f"{train.optimizer}; attack a run trained with sgd")
    sgd = LocalSGD(train.lr, train.momentum, weight_decay=train.weight_decay, steps=steps)
    return dataclasses.replace(train, batch_size=batch, local_steps=steps, local_epochs=1), sgd


def head_weight(model: nn.Module) -> str | None:
    """The state key of the last linear layer's weight in the model's head (None without one)."""
    head = getattr(model, "head", None)
    linears = [name for name, m in head.named_modules() if isinstance(m, nn.Linear)] if head is not None else []
    return None if not linears else "head." + (f"{linears[-1]}." if linears[-1] else "") + "weight"


def observed(run: AttackedRun, upload: Upload, sgd: LocalSGD, classes: tuple[int, ...] | None) -> Observed:
    """The attacker's view: its copy of the model from the broadcast, the update of each uploaded parameter."""
    uploaded = set(uploaded_weights(run, upload))
    model = server_copy(run, upload.sent.arrays)
    sent, received = upload.sent.arrays, upload.received.arrays
    matched = [k for k, p in model.named_parameters() if p.requires_grad and k in uploaded]
    if not matched:
        raise FedhetError(f"method '{run.exp.config.method}' uploads no trainable parameter of the model (only "
                          "buffers), so there is no update to invert")
    device = next(model.parameters()).device
    update = {k: (received[k].detach().cpu().double() - sent[k].detach().cpu().double()).float().to(device)
              for k in matched}  # the broadcast may live on the run's device, a reply on the CPU
    return Observed(model, update, sgd, classes)


def invert_run(run_dir: str | Path, client: str | None = None, batch: int = 1, iters: int = 200,
               method: str = "ig", steps: int = 1, tv: float = TV_WEIGHT, restarts: int = 1, write: bool = True
               ) -> JSONDict:
    """Invert client `client`'s upload of one round on `batch` images (module docstring); the result, merged into
    privacy.json with `write`. Bad input is one FedhetError before anything is written."""
    if method not in METHODS or min(batch, iters, steps, restarts) < 1:
        raise FedhetError(f"--method {method} --batch {batch} --iters {iters} --steps {steps} --restarts {restarts}: "
                          f"give a method among {', '.join(METHODS)} and a batch, iterations, steps and restarts >= 1")
    with attacked_run(run_dir) as run:
        check_uploads_weights(run)
        cid = client_id(run, client)
        data, seed = run.exp.data.clients[cid], run.exp.config.seed
        indices, images, labels = chosen_batch(data, batch, seed)
        if batch == 1 and any(isinstance(m, nn.BatchNorm1d) for m in run.exp.algorithm.parts.template.modules()):
            raise FedhetError("this model has BatchNorm1d, which cannot train on a batch of one image; give --batch 2 "
                              "or more")
        train, sgd = local_sgd(run, batch, steps)
        upload = client_upload(run, cid, with_data(data, Subset(data.train_eval, indices)), train)
        obs = observed(run, upload, sgd, data.classes)
        inferred = infer_label(obs, head_weight(obs.model)) if batch == 1 else None
        used = torch.tensor([inferred]) if inferred is not None else labels
        recon, objective = reconstruct(obs, used, images.shape, method, iters, seed, tv, restarts)
        matches = best_matches(images, recon)
        result: JSONDict = {
            "attack": "inversion", "inversion": method, "client": data.name, "batch": batch, "steps": steps,
            "iters": iters, "restarts": restarts, "tv": tv if method == "ig" else None, "round": upload.round,
            "indices": indices,
            "labels": "inferred" if inferred is not None else "given",
            "label_correct": None if inferred is None else inferred == int(labels[0]),
            "matched_keys": sorted(obs.update), "local_dp": run.exp.config.privacy.dp.mode == "local",
            "objective": objective, "images": matches,
            "psnr": sum(float(m["psnr"]) for m in matches) / batch,
            "ssim": sum(float(m["ssim"]) for m in matches) / batch, **run.facts()}
        if write:
            write_privacy(run.rundir.path, result, f"inversion_{method}_{data.name}_b{batch}_k{steps}")
    return result

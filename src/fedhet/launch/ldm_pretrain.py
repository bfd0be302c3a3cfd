"""`fedhet ldm pretrain`: pretrain the small LDM FedBiP's server and clients share (spec fedbip.md §7.1 item 1;
docs/fedbip.md "Pretraining the small LDM"), cached, resumable, within a time budget.

The result is a diffusers checkpoint folder `out` (vae/ unet/ text_encoder/ tokenizer/ scheduler/ as
`save_components` writes it, plus fedhet_ldm.json: the settings, their key, steps, seconds, losses; loss.csv; and
samples.png), that `load_components(out)` reads. It is written into a temporary folder beside `out` and renamed
into place, so `out` is either absent, the old result or the new one. Asking again for the same settings (the
same `LDMPretrainConfig.key()`) finds it and returns at once; other settings over an existing result need
`overwrite`.

While training, `.<out>.pretrain/state.pt` holds everything needed to continue bit for bit: stage, step, the
networks, the optimizers, the EMA weights, the losses, the elapsed time and the global RNG state. It is written
atomically every `save_every` steps and at the end of the VAE stage. Every random draw of step s of a stage comes
from its own generator seeded from (seed, stage, s), and initialisations from (seed, stage), so `resume` after an
interruption gives the same weights as an uninterrupted run. Like `fedhet run`: a partial state and neither
`resume` nor `overwrite` is an error, and so is `resume` with no state or with other settings.
`minutes` bounds the training time: the VAE stage gets `vae_share` of it, the UNet stage the rest; a stage cut
short by time counts as done (fedhet_ldm.json records the steps it made).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from fedhet.atomic import current_umask
from fedhet.engine.rundir import RunDirectory
from fedhet.errors import CheckpointError, FedhetError
from fedhet.launch.ldm_trainer import LDMTrainer, TrainerState
from fedhet.models.ldm.checkpoint import FEDHET_META, load_components
from fedhet.models.ldm.pretrain_config import LDMPretrainConfig, SampleSettings
from fedhet.models.ldm.samples import write_sample_grid
from fedhet.outpaths import check_plot_file
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)
META_FILE = FEDHET_META


@dataclass(frozen=True)
class LDMPretrained:
    """Where the checkpoint is, whether this call trained it (False: found), whether it is complete (False:
    stopped by `stop_after`, continue with resume) and its fedhet_ldm.json."""

    path: Path
    trained: bool
    finished: bool
    meta: JSONDict


def read_meta(out: Path) -> JSONDict | None:
    """fedhet_ldm.json of a checkpoint folder written by `pretrain_ldm`, or None."""
    try:
        meta = json.loads((out / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def work_dir(out: Path) -> Path:
    """The folder of the training state: `.<name>.pretrain` beside `out`."""
    return out.parent / f".{out.name}.pretrain"


def check_out(out: Path, key: str, overwrite: bool, resume: bool = False) -> JSONDict | None:
    """The metadata of a finished pretraining with this key at `out` (reuse it), None to train; a FedhetError
    when `out` cannot take the result. (A resumed pretraining may replace a result with other settings: it was
    started with overwrite; `start_state` checks its settings.)"""
    for parent in (out, *out.parents):
        if parent.exists():
            if not parent.is_dir():
                raise FedhetError(f"--out '{out}': '{parent}' is a file, not a folder; give a folder path for the "
                                  "LDM checkpoint")
            writable = parent.parent if parent == out else parent  # the result is renamed into out's parent
            if not os.access(writable, os.W_OK | os.X_OK):
                raise FedhetError(f"--out '{out}': cannot write in '{writable}' (permission denied); give a folder "
                                  "you can write for the LDM checkpoint")
            break
    if not out.is_dir():
        return None
    meta = read_meta(out)
    if meta is not None and meta.get("key") == key and not overwrite:
        return meta
    if meta is None and any(out.iterdir()):
        raise FedhetError(f"--out '{out}' is a folder that fedhet ldm pretrain did not write (no {META_FILE}); it is "
                          "not replaced: choose another --out")
    if meta is not None and not (overwrite or resume):
        raise FedhetError(f"--out '{out}' holds an LDM pretrained with other settings (key {meta.get('key')}, these "
                          f"settings: {key}); pass --overwrite to replace it, or choose another --out")
    return None


def start_state(work: Path, key: str, resume: bool, overwrite: bool) -> TrainerState | None:
    """The training state to continue (resume), or None to start; errors as `fedhet run`'s."""
    path = work / "state.pt"
    if resume and not path.is_file():
        raise FedhetError(f"--resume: there is no interrupted pretraining at '{work}' to continue; run without "
                          "--resume to start it")
    if not resume and not overwrite and path.is_file():
        raise FedhetError(f"'{work}' holds an interrupted pretraining: pass --resume to continue it, --overwrite "
                          "to start again")
    if not resume:
        path.unlink(missing_ok=True)
        return None
    try:
        state: TrainerState = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise CheckpointError(f"cannot read the pretraining state '{path}' ({type(e).__name__}); start again with "
                              "--overwrite") from e
    if state.get("key") != key:
        raise CheckpointError(f"the interrupted pretraining at '{work}' has other settings (key {state.get('key')}, "
                              f"these: {key}); resume it with its settings, or pass --overwrite to start again")
    return state


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` (None: unchanged) for the block."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def publish(tmp: Path, out: Path) -> None:
    """Move the finished folder `tmp` to `out`, replacing an old result only once the new one is complete."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        out.rename(old / "ckpt")
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp's folders are private
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def pretrain_ldm(cfg: LDMPretrainConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, stop_after: int | None = None) -> LDMPretrained:
    """Pretrain (or find, or continue) the small LDM of `cfg` into the checkpoint folder `out` (module doc).
    `stop_after`: stop with a saved state after this many steps in all (VAE + UNet), e.g. to test resuming."""
    out, key = Path(out), cfg.key()
    if resume and overwrite:
        raise FedhetError("--resume and --overwrite exclude each other: continue the pretraining, or start it again")
    if stop_after is not None and stop_after < 1:
        raise FedhetError(f"stop_after must be >= 1, got {stop_after}")
    cached = check_out(out, key, overwrite, resume)
    if cached is not None:
        log.info("LDM checkpoint %s found (same settings)", out)
        return LDMPretrained(out, False, True, cached)
    work = work_dir(out)
    with RunDirectory(work).locked():
        state = start_state(work, key, resume, overwrite)
        with torch_threads(cfg.num_threads):
            trainer = LDMTrainer(cfg, work / "state.pt", state, progress)
            if not trainer.train(stop_after):
                return LDMPretrained(out, True, False, trainer.meta())
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
            try:
                meta = trainer.write(tmp, META_FILE)
                publish(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return LDMPretrained(out, True, True, meta)


def ldm_samples(ckpt: str | Path, out: Path, settings: SampleSettings, seed: int = 0, progress: bool = False,
                num_threads: int | None = None) -> Path:
    """Write the PNG sample grid (`write_sample_grid`: domain x class) of the checkpoint `ckpt` that
    `pretrain_ldm` wrote (its fedhet_ldm.json names the prompts) to `out`, with `num_threads` torch threads
    (default: `default_threads`)."""
    if out.is_dir() or out.suffix.lower() != ".png":
        raise FedhetError(f"--out '{out}': give a .png file name for the sample grid")
    check_plot_file(out, "--out")
    if settings.per_prompt < 1 or settings.steps < 1:
        raise FedhetError(f"--per-prompt and --steps must be >= 1, got {settings.per_prompt} and {settings.steps}")
    root = Path(ckpt)
    meta = read_meta(root)
    if meta is None or "sources" not in meta or "template" not in meta:
        what = "is not a folder" if not root.is_dir() else f"has no {META_FILE} (with the prompts it was trained on)"
        raise FedhetError(f"'{root}' {what}: fedhet ldm samples takes a checkpoint folder written by fedhet ldm "
                          "pretrain")
    if num_threads is not None and num_threads < 1:
        raise FedhetError(f"--num-threads must be >= 1, got {num_threads}")
    with torch_threads(num_threads or default_threads()):
        parts = load_components(root)
        sources = [(str(s["domain"]), [str(c) for c in s["classes"]]) for s in meta["sources"]]
        return write_sample_grid(parts, str(meta["template"]), sources, settings, out, seed, progress)


def default_threads() -> int:
    """torch threads for sampling when none are given: the cores this process may use, at most 4 (more threads
    only add contention for a small UNet)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))

"""The two-stage training loop of `fedhet ldm pretrain` (spec fedbip.md §7.1 item 1; docs/fedbip.md), with its
resumable state; `fedhet.launch.ldm_pretrain` owns the cache, the folders and the locking.

Stage "vae" trains the AutoencoderKL; then the pool is encoded once (posterior mean and std of every image) and
the latent scaling factor fixed; stage "unet" trains the UNet on fresh posterior samples. Step s of a stage draws
everything from `torch_generator(seed, "ldm-<stage>", s)`; the networks are initialised under
`seeded(seed, "ldm-<stage>-init")`. The state (see ldm_pretrain's doc) is a plain dict saved with torch.save.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fedhet.atomic import atomic_torch_save, atomic_write_text, strict_json
from fedhet.core.seeding import seeded, torch_generator
from fedhet.errors import FedhetError
from fedhet.models.ldm.checkpoint import minilm_text_encoder, save_components
from fedhet.models.ldm.components import SD_SCHEDULER, assemble, make_schedulers, prompt_limit
from fedhet.models.ldm.deps import import_transformers_ldm
from fedhet.models.ldm.pool import load_pool
from fedhet.models.ldm.pretrain import (
    build_unet,
    build_vae,
    ema_update,
    encode_pool,
    latent_scale,
    prompt_contexts,
    sample_latents,
    unet_step,
    vae_step,
    warmup_lr,
)
from fedhet.models.ldm.pretrain_config import LDMPretrainConfig
from fedhet.models.ldm.samples import write_sample_grid
from fedhet.models.vl_common import quiet_transformers
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)
STAGES = ("vae", "unet")
SMOOTH = 50  # the final loss reported: the mean of the last SMOOTH steps
TrainerState = dict[str, Any]  # Any: torch-saved training state (models, optimizers, RNG, losses, counters)


def resolve_device(name: str) -> torch.device:
    """cpu, cuda, or auto (cuda when available); a FedhetError for cuda without a GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise FedhetError("ldm pretrain: device=cuda but no CUDA GPU is available; use device=cpu or device=auto")
    return torch.device(name)


def _count(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


class LDMTrainer:
    """The pool, the frozen MiniLM and its prompt states, the VAE and UNet with their optimizers, and the state."""

    def __init__(self, cfg: LDMPretrainConfig, state_path: Path, state: TrainerState | None,
                 progress: bool = True) -> None:
        self.cfg, self.path, self.progress = cfg, state_path, progress
        self.device = resolve_device(cfg.device)
        self.pool = load_pool(cfg)
        text, self.tokenizer = minilm_text_encoder()
        self.text = text.to(self.device)
        self.contexts = prompt_contexts(self.text, self.tokenizer, cfg.template, self.pool.prompts,
                                        prompt_limit(self.tokenizer, self.text)).to(self.device)
        with seeded(cfg.seed, "ldm-vae-init"):
            self.vae = build_vae(cfg).to(self.device)
        self.vae_opt = torch.optim.AdamW(self.vae.parameters(), lr=cfg.vae.lr)
        self.state: TrainerState = state or {"key": cfg.key(), "stage": "vae", "step": 0,
                                               "elapsed": dict.fromkeys(STAGES, 0.0), "losses": {s: [] for s in STAGES}}
        if state is not None:
            self.vae.load_state_dict(state["vae"])
            if state["stage"] == "vae":
                self.vae_opt.load_state_dict(state["vae_opt"])
            torch.set_rng_state(state["torch_rng"])
        self.scale, self.latents = 1.0, (torch.zeros(0), torch.zeros(0))
        self.unet: Any = None  # Any: diffusers' UNet (untyped), built at the UNet stage
        self.unet_opt: Any = None  # Any: its AdamW, built with it (None until then)
        self.ema: dict[str, torch.Tensor] = {}
        self.scheduler: Any = None  # Any: a diffusers scheduler (untyped)

    def done(self) -> int:
        """Steps made in all (both stages)."""
        return sum(len(v) for v in self.state["losses"].values())

    def save(self) -> None:
        """Write the state atomically (module doc of ldm_pretrain)."""
        s = {k: v for k, v in self.state.items() if k in ("key", "stage", "step", "elapsed", "losses")}
        s.update(vae=self.vae.state_dict(), torch_rng=torch.get_rng_state())
        if self.state["stage"] == "vae":
            s["vae_opt"] = self.vae_opt.state_dict()
        elif self.unet is not None:
            s.update(unet=self.unet.state_dict(), unet_opt=self.unet_opt.state_dict(), ema=self.ema)
        atomic_torch_save(s, self.path)

    def train(self, stop_after: int | None = None) -> bool:
        """Run what is left of both stages; False when stopped by `stop_after` (state saved)."""
        cfg, budget = self.cfg, None if self.cfg.minutes is None else self.cfg.minutes * 60
        bar = tqdm(total=cfg.vae.steps + cfg.unet.steps, initial=self.done(), unit="step", disable=not self.progress,
                   desc="ldm pretrain")
        try:
            if self.state["stage"] == "vae":
                vae_budget = None if budget is None else budget * cfg.vae_share
                if not self._loop("vae", cfg.vae.steps, self._vae_step, vae_budget, stop_after, bar):
                    return False
                bar.update(cfg.vae.steps - self.state["step"])
                self.state.update(stage="unet", step=0)
                self.save()
            bar.set_description(f"ldm pretrain: encoding the pool ({len(self.pool.images)} images)")
            started = time.monotonic()
            self._prepare_unet()  # the pool's encoding counts against the budget (it takes minutes on a CPU)
            encode = self.state["elapsed"].get("encode", 0.0) + time.monotonic() - started
            self.state["elapsed"]["encode"] = encode
            bar.set_description("ldm pretrain")
            unet_budget = None if budget is None else budget - self.state["elapsed"]["vae"] - encode
            return self._loop("unet", cfg.unet.steps, self._unet_step, unet_budget, stop_after, bar)
        finally:
            bar.close()

    def _loop(self, stage: str, total: int, step_fn: Callable[[int, torch.Generator], float],
              budget: float | None, stop_after: int | None, bar: Any) -> bool:  # Any: a tqdm bar
        """Steps state["step"]..total-1 of `stage` within `budget` seconds; False if `stop_after` stopped it."""
        s, start = self.state, time.monotonic()
        base = s["elapsed"][stage]
        while s["step"] < total:
            if budget is not None and s["step"] > 0 and base + time.monotonic() - start >= budget:
                log.warning("ldm pretrain: the time budget ended the %s stage after %d of %d steps", stage,
                            s["step"], total)
                break
            if stop_after is not None and self.done() >= stop_after:
                self.save()
                return False
            loss = step_fn(s["step"], torch_generator(self.cfg.seed, f"ldm-{stage}", s["step"]))
            s["losses"][stage].append(loss)
            s["step"] += 1
            s["elapsed"][stage] = base + time.monotonic() - start
            bar.update(1)
            recent = s["losses"][stage][-SMOOTH:]
            bar.set_postfix(stage=stage, loss=f"{sum(recent) / len(recent):.4f}")
            if s["step"] % self.cfg.save_every == 0 and s["step"] < total:
                self.save()
        return True

    def _vae_step(self, step: int, generator: torch.Generator) -> float:
        idx = self.pool.sample_indices(self.cfg.vae.batch_size, generator)
        return vae_step(self.vae, self.vae_opt, self.pool.images[idx], self.cfg, generator)

    def _prepare_unet(self) -> None:
        """Encode the pool with the trained VAE, fix the scaling, build (or restore) the UNet, optimizer, EMA."""
        cfg = self.cfg
        self.vae.eval()
        self.latents = encode_pool(self.vae, self.pool.images)
        self.scale = latent_scale(*self.latents)
        with seeded(cfg.seed, "ldm-unet-init"):
            self.unet = build_unet(cfg, int(self.text.config.hidden_size)).to(self.device)
        self.unet_opt = torch.optim.AdamW(self.unet.parameters(), lr=cfg.unet.lr, weight_decay=cfg.unet.weight_decay)
        self.ema = {n: p.detach().clone() for n, p in self.unet.named_parameters()}
        if "unet" in self.state:
            self.unet.load_state_dict(self.state["unet"])
            self.unet_opt.load_state_dict(self.state["unet_opt"])
            self.ema = {n: t.to(self.device) for n, t in self.state["ema"].items()}
        self.scheduler = make_schedulers(dict(SD_SCHEDULER))[0]

    def _unet_step(self, step: int, generator: torch.Generator) -> float:
        cfg, (mean, std) = self.cfg, self.latents
        idx = self.pool.sample_indices(cfg.unet.batch_size, generator)
        z0 = sample_latents(mean[idx.to(self.device)], std[idx.to(self.device)], self.scale, generator)
        loss = unet_step(self.unet, self.unet_opt, self.scheduler, z0, self.pool.prompt_ids[idx], self.contexts, cfg,
                         generator, warmup_lr(step, cfg.unet.lr, cfg.unet.warmup))
        ema_update(self.ema, self.unet, cfg.unet.ema_decay, step)
        return loss

    def meta(self) -> JSONDict:
        """fedhet_ldm.json: the settings and key, pool, steps, seconds, final losses, sizes."""
        s, losses = self.state, self.state["losses"]
        return {"key": s["key"], "settings": self.cfg.to_dict(), "template": self.cfg.template,
                "sources": [{"domain": d, "classes": w, "images": b - a}
                            for (d, w), (a, b) in zip(self.pool.sources, self.pool.spans, strict=True)],
                "steps": {k: len(v) for k, v in losses.items()},
                "seconds": {k: round(v, 3) for k, v in s["elapsed"].items()},
                "final_loss": {k: sum(v[-SMOOTH:]) / len(v[-SMOOTH:]) if v else None for k, v in losses.items()},
                "scaling_factor": self.scale,
                "parameters": {"vae": _count(self.vae), "unet": _count(self.unet) if self.unet is not None else None}}

    def write(self, folder: Path, meta_file: str) -> JSONDict:
        """Write the finished LDM into `folder`: diffusers layout (EMA UNet weights), meta, loss.csv, samples."""
        self.vae.register_to_config(scaling_factor=self.scale)
        self.unet.load_state_dict({**self.unet.state_dict(), **self.ema})
        parts = assemble(self.vae, self.unet, self.text, self.tokenizer)
        with quiet_transformers(import_transformers_ldm("saving the LDM")):
            save_components(parts, folder)
        rows = [f"{stage},{i},{v!r}" for stage in STAGES for i, v in enumerate(self.state["losses"][stage])]
        atomic_write_text(folder / "loss.csv", "\n".join(["stage,step,loss", *rows]) + "\n")
        meta = self.meta()
        if self.cfg.samples.per_prompt > 0:
            write_sample_grid(parts, self.cfg.template, self.pool.sources, self.cfg.samples, folder / "samples.png",
                              self.cfg.seed)
            meta["samples"] = "samples.png"
        atomic_write_text(folder / meta_file, strict_json(meta, indent=2))
        return meta

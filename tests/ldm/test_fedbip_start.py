"""Where FedBiP's server starts each image and which S it prompts with (issue 37 parts 3 and 6), pinned so that a
named broken variant fails:
- `start_latent: fresh` (default, the official generate.py lines 285-290): the upload holds the centre √ᾱ_T z̄(0)
  of z(T)'s Gaussian and every image starts from centre + √(1 − ᾱ_T) ξ with its own ξ, so two copies of one upload
  start apart (broken variant checked: copies reuse one start latent, i.e. `redraw` ignored);
- `start_latent: upload` (the paper's Eq. 5 read literally): every copy starts from the one uploaded z(T);
- the server prompts with the uploaded domain vector S (broken variant checked: generation ignores the upload's
  S, e.g. `perturb_domain` on zeros or the encoder fed the domain word's vectors)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fedbip_testing import experiment, fit

import fedhet.algorithms.fedbip as fedbip_module
from fedhet.core.messages import Message, Reply
from fedhet.models.ldm import FedBiPUpload, GenerationConfig
from fedhet.models.ldm.client import max_noise_std, max_timestep_alpha

STARTS: list[torch.Tensor] = []


def recording(up: FedBiPUpload, cfg: GenerationConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A stand-in generation that keeps the start latents the server hands it."""
    STARTS.append(up.latents.clone())
    return torch.rand(len(up.labels), 3, 16, 16, generator=g), up.labels.clone()


def starts_of(start: str) -> tuple[Any, Message, list[torch.Tensor]]:
    """(method, the client's reply, the start latents of copies 0 and 1) under `start_latent=start`."""
    alg, _, _, reply, _ = fit(experiment("method_args.size=S", f"method_args.start_latent={start}"))
    STARTS.clear()
    alg.synthetic_set(Reply(0, reply, 1), 0, recording)
    return alg, reply, list(STARTS)


def test_fresh_uploads_the_centre_and_draws_a_new_start_for_every_image(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = fedbip_module.instance_latents
    monkeypatch.setattr(fedbip_module, "instance_latents", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    alg, reply, (first, second) = starts_of("fresh")
    sched = alg.encoder().parts.train_scheduler
    centre = reply.arrays["latents"]
    assert torch.equal(centre, made[0][1].cpu())
    # the centre is √ᾱ_T z̄(0): for SD's schedule √ᾱ_T = 0.068, so it is small where z(T) would have std 1
    assert math.isclose(float(max_timestep_alpha(sched)), 0.0047, rel_tol=0.02) and float(centre.std()) < 0.2
    s = max_noise_std(sched)
    assert math.isclose(s, math.sqrt(1 - float(max_timestep_alpha(sched))), rel_tol=1e-9)
    xi = [(start - centre) / s for start in (first, second)]  # each copy's ξ: standard normal, and its own
    assert all(abs(float(x.std()) - 1) < 0.1 and abs(float(x.mean())) < 0.1 for x in xi)
    corr = float((xi[0] * xi[1]).mean())
    assert abs(corr) < 0.1 and float((first - second).abs().mean()) > 0.9  # E|ξ − ξ'| s = 2 / √π s ≈ 1.13


def test_upload_restarts_every_copy_from_the_one_z_t() -> None:
    _, reply, (first, second) = starts_of("upload")
    assert torch.equal(first, reply.arrays["latents"]) and torch.equal(second, reply.arrays["latents"])
    assert abs(float(reply.arrays["latents"].std()) - 1) < 0.15  # z(T) itself: almost pure N(0, I)


def generated(alg: Any, reply: Message, domain: torch.Tensor) -> torch.Tensor:
    """The server's real generation (tiny LDM, σ = 0) of one copy, with the upload's S replaced by `domain`."""
    arrays = dict(reply.arrays, domain=domain)
    images, _, _, _ = alg.synthetic_set(Reply(0, Message(arrays=arrays, scalars=reply.scalars), 1), 0,
                                        fedbip_module.TimedGeneration(alg.encoder()))
    return images.float()


def test_the_server_prompts_with_the_uploaded_domain_vector() -> None:
    alg, _, _, reply, _ = fit(experiment("method_args.domain_noise=0", "method_args.mode=output",
                                         "method_args.guidance_scale=1"))
    s = reply.arrays["domain"]
    same = generated(alg, reply, s.clone())
    assert torch.equal(same, generated(alg, reply, s.clone()))  # deterministic for one upload
    other = generated(alg, reply, s + 3 * torch.randn(s.shape, generator=torch.Generator().manual_seed(1)))
    assert float((same - other).abs().mean()) > 0.5  # uint8 levels: another S, other images

"""Client-level differential privacy of the shared model: DP-FedAvg (McAfee et al. 2018), with fixed or adaptive
clipping (Andrew et al. 2021), noised on the server or by each client (docs/privacy.md "Differential privacy").

Each sampled client's update, its shared floating-point arrays minus the global model it started from, is clipped
to L2 norm C over all those arrays together. Server mode: the clipped updates are averaged with equal weights and
N(0, (sigma * C / m)^2) is added to each coordinate of the average (m sampled clients), as Flower's
DifferentialPrivacyServerSideFixedClipping. Local mode: each client adds N(0, (sigma * C)^2) to its own clipped
update before it is sent (Flower's LocalDpMod). Only the keys the method sends are touched: personal parts (FedBN's
BatchNorm, FedRep's head, Ditto's personal model) never reach the server. Integer buffers (BatchNorm's
num_batches_tracked) carry no data and are averaged as they are.

`privatize` rewrites the replies so that the method's own mean of them is the private aggregate: reply i carries
current + clip(update_i) + xi with the same server noise xi for all and weight 1, so their mean is current +
mean(clipped) + xi. The noise comes from the (seed, round) streams, so a rerun or a resume draws it again.
Local mode is the client's own step (`local_message`): the in-process server takes it for each client, a Flower
ClientApp takes it itself before it sends, and marks the reply (LOCAL) so the server does not take it twice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from fedhet.config.privacy import DPConfig
from fedhet.core.contract import ServerState
from fedhet.core.messages import Message, Reply
from fedhet.core.params import StateDict
from fedhet.core.robust import rule_keys
from fedhet.core.seeding import torch_generator
from fedhet.errors import ConfigError

CLIP, STEPS = "dp/clip", "dp/steps"  # the DP state kept in ServerState.opt (checkpointed, rolled back with it)
LOCAL = "dp/local"  # a reply's scalar, 1: its client clipped and noised its update itself (mode local, on Flower)


def update_of(state: StateDict, current: StateDict, keys: Sequence[str]) -> StateDict:
    """A client's update over `keys`: its state minus the global model it started from (float64)."""
    return {k: state[k].detach().to(torch.float64) - current[k].detach().to(torch.float64) for k in keys}


def global_norm(update: StateDict) -> float:
    """The L2 norm of all arrays of `update` together."""
    return math.sqrt(sum(float(v.pow(2).sum()) for v in update.values()))


def clip_update(update: StateDict, clip: float) -> tuple[StateDict, bool]:
    """`update` scaled by min(1, clip / norm) (Flower's compute_clip_model_update), and whether it was within
    the clip norm (the bit adaptive clipping counts)."""
    norm = global_norm(update)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {k: v * scale for k, v in update.items()}, norm <= clip


def gaussian_noise(like: StateDict, std: float, generator: torch.Generator) -> StateDict:
    """N(0, std^2) per coordinate, shaped like `like`, drawn on the CPU from `generator` (device independent)."""
    return {k: (torch.randn(v.shape, generator=generator, dtype=torch.float64) * std).to(v.device)
            for k, v in like.items()}


def count_noise_std(cfg: DPConfig, m: int) -> float:
    """sigma_b, the noise std of the unclipped count (default m / 20, Andrew et al. Sec. 3.1, Flower's)."""
    return cfg.adaptive.count_noise_std if cfg.adaptive.count_noise_std is not None else m / 20


def model_noise_multiplier(cfg: DPConfig, m: int) -> float:
    """The noise multiplier of the model under adaptive clipping, z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2), so
    that the model and the count together are one Gaussian mechanism of multiplier z (Andrew et al. Thm. 1,
    Flower's compute_adaptive_noise_params); z itself with fixed clipping."""
    z = cfg.noise_multiplier
    if not cfg.adaptive.enabled:
        return z
    sigma_b = count_noise_std(cfg, m)
    if z >= 2 * sigma_b:
        raise ConfigError(f"adaptive clipping with {m} clients per round needs privacy.dp.noise_multiplier < 2 * "
                          f"sigma_b = {2 * sigma_b:g} (sigma_b: privacy.dp.adaptive.count_noise_std, default m/20); "
                          "raise count_noise_std, sample more clients, or use fixed clipping")
    return float((z ** -2 - (2 * sigma_b) ** -2) ** -0.5)


def next_clip(cfg: DPConfig, clip: float, unclipped: int, m: int, generator: torch.Generator) -> float:
    """Andrew et al.'s geometric update: C * exp(-lr * (b - gamma)), b the noised share of unclipped updates."""
    noise = float(torch.randn((), generator=generator, dtype=torch.float64)) * count_noise_std(cfg, m)
    share = (unclipped + noise) / m
    return clip * math.exp(-cfg.adaptive.lr * (share - cfg.adaptive.target_quantile))


def released(current: StateDict, arrays: StateDict, update: StateDict, noise: StateDict) -> StateDict:
    """What a client's reply carries after DP: current + clipped update + noise on the update's keys (in the
    model's dtype), its other arrays as they were."""
    out = dict(arrays)
    for k in update:
        out[k] = (current[k].to(torch.float64) + update[k] + noise[k]).to(current[k].dtype)
    return out


def local_message(cfg: DPConfig, sent: StateDict, reply: Message, seed: int, rnd: int, client_id: int) -> Message:
    """Local DP, a client's own step before it sends (privacy.dp.mode=local): its update of the floating arrays
    of `sent` (the global model it received) clipped to privacy.dp.clip, plus N(0, (sigma * clip)^2) from its
    (seed, round, client) stream; the reply marked LOCAL. The same call in-process (`privatize`, for each client)
    and on a Flower ClientApp (runtimes/flower/client.py), so both send the same bits."""
    update, _ = clip_update(update_of(reply.arrays, sent, rule_keys(sent)), cfg.clip)
    noise = gaussian_noise(update, cfg.noise_multiplier * cfg.clip, torch_generator(seed, rnd, client_id, "dp-local"))
    return Message(arrays=released(sent, reply.arrays, update, noise), scalars={**reply.scalars, LOCAL: 1})


def privatize(cfg: DPConfig, server: ServerState, replies: list[Reply], seed: int, rnd: int
              ) -> tuple[list[Reply], dict[str, torch.Tensor | int]]:
    """The replies whose equal-weight mean is the private aggregate of round `rnd`, and the new DP state for
    `server.opt` (clip norm, steps taken). Local mode: each reply as its client's `local_message` (taken here for
    a client that has not taken it itself)."""
    current, m = server.model, len(replies)
    clip = float(server.opt.get(CLIP, cfg.clip))
    if cfg.mode == "local":
        messages = [r.message if r.message.scalars.get(LOCAL) else
                    local_message(cfg, current, r.message, seed, rnd, r.client_id) for r in replies]
        unclipped = 0  # adaptive clipping needs server mode (config/privacy.py)
    else:
        updates = [clip_update(update_of(r.message.arrays, current, rule_keys(current)), clip) for r in replies]
        unclipped = sum(within for _, within in updates)
        noise = gaussian_noise(updates[0][0], model_noise_multiplier(cfg, m) * clip / m,
                               torch_generator(seed, rnd, "dp-noise"))  # one draw, the same for every reply
        messages = [dataclasses.replace(r.message, arrays=released(current, r.message.arrays, update, noise))
                    for r, (update, _) in zip(replies, updates, strict=True)]
    out = [dataclasses.replace(r, message=msg, num_examples=1) for r, msg in zip(replies, messages, strict=True)]
    new_clip = next_clip(cfg, clip, unclipped, m, torch_generator(seed, rnd, "dp-count")) \
        if cfg.adaptive.enabled else clip
    steps = int(server.opt.get(STEPS, 0)) + 1
    return out, {CLIP: torch.tensor(new_clip, dtype=torch.float64), STEPS: steps}


def dp_steps(server: ServerState) -> int:
    """The DP rounds a server state has taken (the accountant's state)."""
    return int(server.opt.get(STEPS, 0))


def dp_aggregate(cfg: DPConfig, aggregate: Callable[[ServerState, list[Reply]], ServerState], server: ServerState,
                 replies: list[Reply], seed: int, rnd: int) -> ServerState:
    """`aggregate` (the method's) of the replies, privately when privacy.dp is on (`privatize`), the DP state
    recorded in the new server state's `opt`."""
    if not cfg.active:
        return aggregate(server, replies)
    private, state = privatize(cfg, server, replies, seed, rnd)
    new = aggregate(server, private)
    return dataclasses.replace(new, opt={**new.opt, **state})

"""AdaptFED / TransFed (Ashraf & Gillani; TransFed, WACV 2024; spec adaptfed.md): a server hypernetwork
h(phi; z_i) generates each client's focal-modulation projections P_i; everything else, xi, is FedAvg-ed.

Algorithm 1 (spec §2.2), one round:
- client i receives xi-bar and P_i = h(phi; z_i) (`broadcast`: every client its own P_i), trains (P_i, xi) for
  the local epochs with the train config's optimizer (Eq. 7: SGD lr 0.01) and sends both back;
- the server averages xi (Eq. 3, sample-weighted; `server.aggregation`) and steps phi and each z_i by the
  vector-Jacobian product with Delta P_i (Eqs. 8-11; `fedhet.models.hypernet_update`: sign, weighting, one step
  per round as FedTP);
- a client deploys xi-bar with its generated P_i (no local fine-tuning; the paper evaluates "the personalized
  models").

P is chosen by `personalize` (`fedhet.models.param_partition`: "focal_modulation" = each block's f and h, the
paper; Table 9's "mlp" / "norm" / "encoder"; any selector list; "all" = every parameter, pFedHN-T).
`generator="local"` is Vanilla-T (§2.1): each client keeps its own P_i, no hypernetwork.

Our choices where the paper is silent, with the reasons (docs/adaptfed.md): `init_from_model`, the generator's
size, its SGD (FedTP's, the lr scaled to the run's rounds: `HyperUpdateConfig.lr_for`) and, for the paper's
"low-rank hypernetwork conditioning" (spec §2.6), `rank` (P_i = B + U_i V_i^T, B in phi, P_i sent in full) and
`lora_rank` (P_i = LoRA factors on frozen layers, sent alone).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.adaptfed_params import AdaptFEDParams
from fedhet.algorithms.base import Algorithm, ArraySpec, Capabilities
from fedhet.algorithms.peft_fl import seed_of
from fedhet.algorithms.registry import register
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, ClientState, FitStats, NovelModel, RoundInfo, ServerState, Work
from fedhet.core.messages import Message, Reply
from fedhet.core.params import StateDict, keys_under, state_of
from fedhet.data.show import split_labels
from fedhet.errors import ConfigError
from fedhet.models import SplitModel
from fedhet.models.hypernet import HyperNetwork
from fedhet.models.hypernet_update import ClientUpdate, HyperNetworkUpdater
from fedhet.models.param_partition import ParamPartition, split_parameters
from fedhet.models.peft.lora import LoraSplit, lora_on_parameters

log = logging.getLogger(__name__)
HEADS_WARN = 100_000_000  # warn above this many parameters in the hypernetwork's full-rank heads


@dataclass(frozen=True)
class TaskDescriptor:
    """s_i of the task-aware variant, as a client's reply carries it: its training label frequencies. On the wire it
    is one more array of the reply (a `Message` maps 1:1 onto Flower's records), under a name no state-dict key
    has, declared by `AdaptFED.reply_layout` (a reply without it is rejected)."""

    frequencies: torch.Tensor
    wire_name: ClassVar[str] = "@task_descriptor"

    def add_to(self, reply: Message) -> None:
        reply.arrays[self.wire_name] = self.frequencies

    @classmethod
    def of(cls, reply: Message) -> TaskDescriptor:
        return cls(reply.arrays[cls.wire_name])

    @classmethod
    def layout(cls, num_classes: int) -> dict[str, ArraySpec]:
        return {cls.wire_name: ((num_classes,), torch.float32)}


@dataclass(kw_only=True)
class HyperServerState(ServerState):
    """xi-bar (`model`), the hypernetwork's weights phi and z (`hnet`) and its optimizer's state (`hopt`)."""

    hnet: StateDict = field(default_factory=dict)
    hopt: dict[str, Any] = field(default_factory=dict)  # Any: torch optimizer state (state_dict)


def partition_of(model: nn.Module, personalize: list[str]) -> ParamPartition:
    """P and xi of `model`: "all" = every parameter is P (pFedHN-T); a ConfigError saying how to choose P."""
    try:
        return split_parameters(model, ["*"] if personalize == ["all"] else personalize)
    except ConfigError as err:
        raise ConfigError(f"adaptfed: {err}. P defaults to FocalNet's focal-modulation projections: use "
                          "model.name=focalnet, or name the parameters to personalize in "
                          "method_args.personalize") from err


@register
class AdaptFED(Algorithm[HyperServerState, ClientState, Work, AdaptFEDParams]):
    """Algorithm 1 of AdaptFED / TransFed (module docstring)."""

    name = "adaptfed"
    Params = AdaptFEDParams
    personalized = True
    capabilities = Capabilities(modality="focal-modulation")  # its default P needs a FocalNet backbone
    server_state_type, client_state_type, work_type = HyperServerState, ClientState, Work

    def __init__(self, params: AdaptFEDParams, model_fn: Callable[[], SplitModel], train: TrainConfig,
                 server: ServerConfig, num_classes: int, device: torch.device, num_clients: int = 0) -> None:
        self.lora: LoraSplit | None = None
        build = model_fn if params.lora_rank is None else (lambda: self.with_lora(model_fn(), params))
        super().__init__(params, build, train, server, num_classes, device, num_clients)
        self.partition = self.personal_split(self.parts.template)

    def with_lora(self, model: SplitModel, params: AdaptFEDParams) -> SplitModel:
        """`model` with LoRA factors on the layers owning P (drawn from a seed of its initial weights)."""
        assert params.lora_rank is not None
        personalized = partition_of(model, list(params.personalize)).p
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_of(model))
            self.lora = lora_on_parameters(model, personalized, params.lora_rank)
        return model

    def personal_split(self, model: nn.Module) -> ParamPartition:
        """P (the LoRA factors with lora_rank, else `personalize`'s parameters) and xi of `model`."""
        return partition_of(model, list(self.lora.factors) if self.lora else list(self.params.personalize))

    def shared_keys(self, model: nn.Module) -> set[str]:
        """Everything travels both ways (xi-bar and the generated P_i down, the trained xi and P_i up); with
        generator=local, P stays on the client, and with local_head the head; with lora_rank, P is the LoRA
        factors and the frozen weights under them never travel."""
        personal = set(self.personal_split(model).p)
        keys = set(model.state_dict()) - set(self.lora.frozen if self.lora else ())
        if self.params.local_head:  # +FedPER: the head is the client's own
            head = keys & keys_under(model, "head")
            if head & personal:
                raise ConfigError("adaptfed: local_head keeps the classification head on each client, so the "
                                  "hypernetwork cannot generate it; personalize parameters outside the head")
            keys -= head
        return keys - personal if self.params.generator == "local" else keys

    # ------------------------------------------------------------------ the hypernetwork
    def hypernet(self, server: HyperServerState | None = None) -> HyperNetwork:
        """The hypernetwork (on the CPU, whatever the clients' device) with the server's phi and z; None: freshly
        drawn (torch's global RNG: the run's server seed)."""
        if self.num_clients < 1:
            raise ConfigError("adaptfed needs the number of clients to size the client embeddings; build the "
                              "algorithm through the engine (fedhet run / build_experiment)")
        p = self.params
        init = {n: self.parts.init_state[n].detach().cpu() for n in self.partition.p} if p.init_from_model else None
        hnet = HyperNetwork(self.partition.shapes(), self.num_clients, embedding_dim=p.embedding_dim,
                            hidden_dim=p.hidden_dim, n_hidden=p.n_hidden, rank=p.rank,
                            descriptor_dim=self.num_classes if p.descriptor == "label_histogram" else None,
                            heads=dict(zip(self.partition.group_keys, self.partition.groups, strict=True)),
                            init_values=init)
        if server is not None:
            hnet.load_state_dict(server.hnet)
        return hnet

    def finish(self, work: Work, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """The trained xi and P_i; with the task-aware variant also s_i, the client's label frequencies."""
        reply, new_state = super().finish(work, state, stats)
        if self.params.descriptor == "label_histogram":
            TaskDescriptor(self.descriptor(work.ctx)).add_to(reply)
        if self.lora:  # frozen weights are the initial ones on every client: not kept per client
            frozen = set(self.lora.frozen)
            new_state = dataclasses.replace(new_state, local={k: v for k, v in new_state.local.items()
                                                              if k not in frozen})
        return reply, new_state

    def descriptor(self, ctx: ClientContext) -> torch.Tensor:
        """s_i of the task-aware variant: the client's training label frequencies."""
        counts = np.bincount(split_labels(ctx.data.train), minlength=self.num_classes)
        return torch.as_tensor(counts / max(counts.sum(), 1), dtype=torch.float32)

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        """The arrays received (xi-bar and P_i), and s_i with the task-aware variant."""
        task = TaskDescriptor.layout(self.num_classes) if self.params.descriptor != "none" else {}
        return {**super().reply_layout(broadcast), **task}

    # ------------------------------------------------------------------ server side
    def init_server(self) -> HyperServerState:
        """xi-bar = the initial xi; phi and z drawn from the run's server seed."""
        shared = {k: v for k, v in super().init_server().model.items() if k not in self.partition.p}
        if self.params.generator == "local":
            return HyperServerState(model=shared)
        warn_heads(self.partition, self.params)
        hnet = self.hypernet()
        hopt = HyperNetworkUpdater(hnet, self.params.update).state_dict()
        return HyperServerState(model=shared, hnet=state_of(hnet), hopt=hopt)

    def broadcast(self, server: HyperServerState, info: RoundInfo, client_id: int) -> Message:
        """xi-bar and client `client_id`'s P_i = h(phi; z_i)."""
        if self.params.generator == "local":
            return Message(arrays=server.model)
        with torch.no_grad():
            generated = self.hypernet(server)(client_id)
        return Message(arrays={**server.model, **{k: v.detach().clone() for k, v in generated.items()}})

    def novel_model(self, server: HyperServerState, ctx: ClientContext, part: str, trained: list[int]
                    ) -> NovelModel | None:
        """A held-out client: xi-bar and P = h(phi; z_new), z_new starting at the mean of the trained clients'
        embeddings (spec §2.8 [S]), conditioned on its own label frequencies when task-aware; part embedding /
        auto trains z_new only, hypernetwork trains phi too; with local_head the site's head trains as well.
        Other parts (and Vanilla-T): the engine's."""
        if self.params.generator == "local" or part not in ("auto", "embedding", "hypernetwork"):
            return None
        hnet = self.hypernet(server)
        z_new = hnet.embeddings.weight.detach()[trained].mean(dim=0)
        model = self.server_model(server).requires_grad_(False)
        hnet.requires_grad_(False)
        generated = GeneratedModel(model, hnet, z_new, self.descriptor(ctx) if self.params.descriptor != "none"
                                   else None)
        # +FedPER: the new site has no head of its own yet; it trains one from the initial head beside z_new
        head = list(model.head.parameters()) if self.params.local_head else []
        phi = hnet.phi_parameters() if part == "hypernetwork" else []
        for p in [*head, *phi]:
            p.requires_grad_(True)
        return NovelModel(generated, [generated.z, *phi, *head], "hypernetwork" if phi else "embedding")

    def aggregate(self, server: HyperServerState, replies: list[Reply], info: RoundInfo) -> HyperServerState:
        """FedAvg of xi (Eq. 3), then the hypernetwork's VJP step with each client's Delta P_i (Eqs. 8-11)."""
        server = super().aggregate(server, replies, info)
        if self.params.generator == "local":
            return server
        hnet = self.hypernet(server)
        if self.params.descriptor != "none":  # s_i as last reported (before the step: P_i was generated with it)
            table = hnet.get_buffer("descriptors").clone()
            for r in replies:
                table[r.client_id] = TaskDescriptor.of(r.message).frequencies.float().cpu()
            hnet.set_descriptors(table)
        update = self.params.update  # its lr scaled to this run's rounds (hypernet_update.scaled_lr)
        updater = HyperNetworkUpdater(hnet, dataclasses.replace(update, lr=update.lr_for(info.rounds)))
        updater.load_state_dict(copy.deepcopy(server.hopt))  # a copy: step() would change loaded tensors in place
        with torch.no_grad():
            sent = {r.client_id: hnet(r.client_id) for r in replies}
        updater.step([ClientUpdate.from_params(r.client_id, r.num_examples, sent[r.client_id],
                                               {k: r.message.arrays[k].detach().cpu() for k in self.partition.p})
                      for r in replies])
        return dataclasses.replace(server, hnet=state_of(hnet), hopt=updater.state_dict())  # the updater's own


def warn_heads(partition: ParamPartition, p: AdaptFEDParams) -> None:
    """Warn when the full-rank heads, (hidden_dim + 1) x D_s parameters, are large: a real FocalNet-T's focal
    modulation (D_s ~ 6.5M) gives ~656M with hidden_dim 100; `rank` / `lora_rank` shrink them."""
    heads = (p.hidden_dim + 1) * sum(math.prod(s) for s in partition.shapes().values())
    if p.rank is None and p.lora_rank is None and heads > HEADS_WARN:
        log.warning("adaptfed: the hypernetwork's heads have %s parameters ((hidden_dim %d + 1) x %s generated "
                    "values per client, %.1f GB in float32); set method_args.rank or lora_rank to shrink them",
                    f"{heads:,}", p.hidden_dim, f"{heads // (p.hidden_dim + 1):,}", heads * 4 / 1e9)


class GeneratedModel(nn.Module):
    """A novel client's model (Sec. 4.2.6, spec §2.8): xi-bar fixed, P = h(phi; z_new) regenerated at every
    forward, so training it moves z_new (and phi when the hypernetwork is trainable)."""

    def __init__(self, model: nn.Module, hnet: HyperNetwork, z: torch.Tensor,
                 descriptor: torch.Tensor | None = None) -> None:
        super().__init__()
        self.model, self.hnet, self.z, self.descriptor = model, hnet, nn.Parameter(z.clone()), descriptor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generated = self.hnet.generate_from_embedding(self.z, self.descriptor)
        return torch.func.functional_call(self.model, generated, (x,), strict=False)  # type: ignore[no-any-return]

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """xi-bar with P = h(phi; z_new): the weights it predicts with, as the plain model's (`fedhet export`)."""
        return {**self.model.state_dict(), **self.hnet.generate_from_embedding(self.z, self.descriptor)}

"""The server hypernetwork h(phi; z_i) of AdaptFED / TransFed (spec §2.2-2.6; update rule: hypernet_update.py).

Architecture (spec §2.4; TransFed's `ViTHyper` and FedTP's hypernetwork follow the same pattern):

* client embeddings z_i: an `nn.Embedding(num_clients, embedding_dim)` (D = 32 by default, spec §2.10);
* trunk: `Linear(in, hidden)` then `n_hidden` x [`ReLU`, `Linear(hidden, hidden)`], no activation after the
  last layer (as in pFedHN / FedTP / TransFed); defaults hidden 100, n_hidden 1 (spec §7b, TransFed's default);
* one output head (a `Linear(hidden, .)`) per *block*: "each transformer block's last layer is unique" (§2.4).
  A head emits all of its block's tensors, concatenated, then split and reshaped. By default a block is a
  tensor name less its last two dotted parts (`blocks.3.modulation.f.weight` -> `blocks.3.modulation`); pass
  `heads` to group otherwise. With full-rank output one head per block is the same function as one head per
  tensor, with the same parameter count; grouping only names the heads.

Our design, not the paper's (spec §2.6 gives no method text for either):

* `rank=r` (low-rank conditioning): every target of 2 or more dims, seen as a (rows, cols) matrix, is
  `P = B + U V^T` with a shared learned base B (part of phi) and per-client factors U (rows x r), V (cols x r)
  emitted by the head; 1-d targets (biases) are emitted in full.
* `descriptor_dim=k` (task-aware embeddings): the trunk's input is `[z_i ; g_psi(s_i)]`, s_i a fixed client
  descriptor (e.g. its label histogram, set with `set_descriptors`), g_psi a small MLP in phi. FedRoD's
  hypernetwork conditions on the label distribution the same way; the server then knows each client's s_i.
* `init_values`: start the generated P at given tensors: B (low-rank) or the head's bias is set to them and
  the head's weight rows for them are scaled by 0.1, so clients start near the values but still differ.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from fedhet.errors import ConfigError, FedhetError


class HyperNetworkError(FedhetError):
    """A client id, embedding, descriptor or P/Delta tensor does not fit the hypernetwork."""


def block_heads(names: Iterable[str], strip: int = 2) -> dict[str, list[str]]:
    """One head per block: each name less its last `strip` dotted parts (module and tensor), in first-seen order."""
    heads: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        heads.setdefault(".".join(parts[:-strip]) if len(parts) > strip else parts[0], []).append(name)
    return heads


def _matrix(shape: Sequence[int]) -> tuple[int, int]:
    """(rows, cols) of a tensor seen as a matrix: the first dim by the product of the rest."""
    return shape[0], math.prod(shape[1:])


class HyperNetwork(nn.Module):
    """h(phi; z_i) -> P_i, a dict name -> tensor of the target shapes (spec §1, §2.4).

    phi = every parameter but the embedding table (`phi_parameters`); z_i = row i of `embeddings.weight`.
    """

    def __init__(self, targets: Mapping[str, Sequence[int]], num_clients: int, *, embedding_dim: int = 32,
                 hidden_dim: int = 100, n_hidden: int = 1, heads: Mapping[str, Sequence[str]] | None = None,
                 rank: int | None = None, descriptor_dim: int | None = None, task_dim: int = 16,
                 init_values: Mapping[str, Tensor] | None = None) -> None:
        super().__init__()
        self.shapes = {name: tuple(int(s) for s in shape) for name, shape in targets.items()}
        _check_sizes(self.shapes, num_clients, embedding_dim, hidden_dim, n_hidden, rank, descriptor_dim, task_dim)
        self.num_clients, self.embedding_dim, self.rank, self.descriptor_dim = \
            num_clients, embedding_dim, rank, descriptor_dim
        self.head_names = _check_heads(dict(heads) if heads is not None else block_heads(self.shapes), self.shapes)
        self.embeddings = nn.Embedding(num_clients, embedding_dim)
        width = embedding_dim
        self.descriptor_net: nn.Module | None = None
        if descriptor_dim is not None:
            self.descriptor_net = nn.Sequential(nn.Linear(descriptor_dim, task_dim), nn.ReLU(),
                                                nn.Linear(task_dim, task_dim))
            self.register_buffer("descriptors", torch.zeros(num_clients, descriptor_dim))
            width += task_dim
        layers: list[nn.Module] = [nn.Linear(width, hidden_dim)]
        for _ in range(n_hidden):
            layers += [nn.ReLU(), nn.Linear(hidden_dim, hidden_dim)]
        self.trunk = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hidden_dim, sum(self.piece_numel(n) for n in names))
                                   for names in self.head_names.values())
        self.factored = [n for n in self.shapes if rank is not None and len(self.shapes[n]) >= 2]
        self.bases = nn.ParameterList(nn.Parameter(_fan_in_uniform(self.shapes[n])) for n in self.factored)
        if init_values is not None:
            self._start_at(init_values)

    def piece_numel(self, name: str) -> int:
        """How many numbers a head emits for target `name`: r (rows + cols) when factored, else its numel."""
        shape = self.shapes[name]
        if self.rank is not None and len(shape) >= 2:
            return self.rank * sum(_matrix(shape))
        return math.prod(shape)

    def phi_parameters(self) -> list[nn.Parameter]:
        """phi: trunk, heads, low-rank bases and descriptor net; everything but the client embeddings."""
        return [p for name, p in self.named_parameters() if not name.startswith("embeddings.")]

    def set_descriptors(self, descriptors: Tensor) -> None:
        """Set the fixed client descriptors s_i (num_clients x descriptor_dim) of the task-aware variant."""
        if self.descriptor_dim is None:
            raise HyperNetworkError("set_descriptors needs a task-aware hypernetwork: build it with descriptor_dim")
        want = (self.num_clients, self.descriptor_dim)
        if tuple(descriptors.shape) != want:
            raise HyperNetworkError(f"descriptors have shape {tuple(descriptors.shape)}; expected {want}")
        self.get_buffer("descriptors").copy_(descriptors)

    def check_client(self, client_id: int) -> int:
        """`client_id` as an int in [0, num_clients), or a HyperNetworkError saying the valid range."""
        if isinstance(client_id, bool) or not isinstance(client_id, int) or not 0 <= client_id < self.num_clients:
            raise HyperNetworkError(f"unknown client id {client_id!r}: the hypernetwork has clients "
                                    f"0..{self.num_clients - 1}; build it with num_clients covering every client")
        return client_id

    def forward(self, client_id: int) -> dict[str, Tensor]:
        """P_i = h(phi; z_i) for a known client (Algorithm 1, line 'P_i^{c,0} <- h(phi, z_i)')."""
        i = self.check_client(client_id)
        descriptor = self.get_buffer("descriptors")[i] if self.descriptor_net is not None else None
        return self._generate(self.embeddings.weight[i], descriptor)

    def generate_from_embedding(self, z: Tensor, descriptor: Tensor | None = None) -> dict[str, Tensor]:
        """P = h(phi; z) for any embedding z (a novel client, spec §2.8); `descriptor` iff task-aware."""
        if tuple(z.shape) != (self.embedding_dim,):
            raise HyperNetworkError(f"embedding has shape {tuple(z.shape)}; expected ({self.embedding_dim},)")
        if (descriptor is None) != (self.descriptor_dim is None):
            raise HyperNetworkError("pass a descriptor exactly when the hypernetwork is task-aware "
                                    f"(descriptor_dim={self.descriptor_dim})")
        if descriptor is not None and tuple(descriptor.shape) != (self.descriptor_dim,):
            raise HyperNetworkError(f"descriptor has shape {tuple(descriptor.shape)}; "
                                    f"expected ({self.descriptor_dim},)")
        return self._generate(z, descriptor)

    def _generate(self, z: Tensor, descriptor: Tensor | None) -> dict[str, Tensor]:
        """Trunk, then each head's output split into its targets (factored ones: B + U V^T)."""
        if self.descriptor_net is not None and descriptor is not None:
            z = torch.cat([z, self.descriptor_net(descriptor)])
        features = self.trunk(z)
        bases = dict(zip(self.factored, self.bases, strict=True))
        out: dict[str, Tensor] = {}
        for names, head in zip(self.head_names.values(), self.heads, strict=True):
            pieces = head(features).split([self.piece_numel(n) for n in names])
            for name, piece in zip(names, pieces, strict=True):
                shape = self.shapes[name]
                if name in bases and self.rank is not None:
                    rows, cols = _matrix(shape)
                    u, v = piece.split([rows * self.rank, cols * self.rank])
                    piece = bases[name] + (u.view(rows, self.rank) @ v.view(cols, self.rank).T).view(shape)
                out[name] = piece.view(shape)
        return {name: out[name] for name in self.shapes}

    @torch.no_grad()
    def _start_at(self, values: Mapping[str, Tensor]) -> None:
        """Make the generated P start at `values` for every z: set B (factored) or the head's bias slice."""
        bases = dict(zip(self.factored, self.bases, strict=True))
        for names, head in zip(self.head_names.values(), self.heads, strict=True):
            offset = 0
            for name in names:
                size = self.piece_numel(name)
                if name in values:
                    if tuple(values[name].shape) != self.shapes[name]:
                        raise ConfigError(f"init_values['{name}'] has shape {tuple(values[name].shape)}; "
                                          f"expected {self.shapes[name]}")
                    if name in bases:
                        bases[name].copy_(values[name])
                    else:
                        assert isinstance(head, nn.Linear)
                        head.bias[offset:offset + size] = values[name].reshape(-1)
                        head.weight[offset:offset + size].mul_(0.1)
                offset += size
        unknown = sorted(set(values) - set(self.shapes))
        if unknown:
            raise ConfigError(f"init_values has tensors that are not targets: {unknown}")


def _fan_in_uniform(shape: Sequence[int]) -> Tensor:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the scale of torch's default Linear / Conv weight init."""
    bound = 1.0 / math.sqrt(max(_matrix(shape)[1], 1))
    return torch.empty(tuple(shape)).uniform_(-bound, bound)


def _check_sizes(shapes: Mapping[str, tuple[int, ...]], num_clients: int, embedding_dim: int, hidden_dim: int,
                 n_hidden: int, rank: int | None, descriptor_dim: int | None, task_dim: int) -> None:
    """ConfigError for no targets, an empty shape or a non-positive size."""
    if not shapes:
        raise ConfigError("hypernetwork: no target tensors; pass the personalized parameters' names and shapes")
    for name, shape in shapes.items():
        if not shape or min(shape) < 1:
            raise ConfigError(f"hypernetwork: target '{name}' has shape {shape}; every dim must be >= 1")
    sizes = {"num_clients": num_clients, "embedding_dim": embedding_dim, "hidden_dim": hidden_dim,
             "task_dim": task_dim, "rank": 1 if rank is None else rank,
             "descriptor_dim": 1 if descriptor_dim is None else descriptor_dim}
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"hypernetwork: {key} must be an integer >= 1, got {value!r}")
    if isinstance(n_hidden, bool) or not isinstance(n_hidden, int) or n_hidden < 0:
        raise ConfigError(f"hypernetwork: n_hidden must be an integer >= 0, got {n_hidden!r}")


def _check_heads(heads: Mapping[str, Sequence[str]], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, list[str]]:
    """The head grouping, checked to cover every target exactly once."""
    listed = [name for names in heads.values() for name in names]
    if sorted(listed) != sorted(shapes):
        missing, extra = sorted(set(shapes) - set(listed)), sorted(set(listed) - set(shapes))
        twice = sorted({n for n in listed if listed.count(n) > 1})
        raise ConfigError(f"hypernetwork heads must list every target once: missing {missing}, "
                          f"not targets {extra}, listed twice {twice}")
    return {head: list(names) for head, names in heads.items()}


def hypernet_param_count(hnet: HyperNetwork) -> dict[str, int]:
    """Parameter counts: embedding (N x D), trunk, heads, bases, descriptor_net, phi (all but the embedding),
    total; `generated` = D_s (numbers in one P_i), `emitted` = numbers the heads emit per client (D_s full-rank,
    the factors when low-rank) and `vanilla` = N x D_s, the per-client P tables of Vanilla-T (spec §2.3)."""
    def count(module: nn.Module | None) -> int:
        return 0 if module is None else sum(p.numel() for p in module.parameters())

    counts = {"embedding": count(hnet.embeddings), "trunk": count(hnet.trunk), "heads": count(hnet.heads),
              "bases": count(hnet.bases), "descriptor_net": count(hnet.descriptor_net)}
    counts["phi"] = sum(p.numel() for p in hnet.phi_parameters())
    counts["total"] = counts["phi"] + counts["embedding"]
    counts["generated"] = sum(math.prod(s) for s in hnet.shapes.values())
    counts["emitted"] = sum(hnet.piece_numel(n) for n in hnet.shapes)
    counts["vanilla"] = hnet.num_clients * counts["generated"]
    return counts

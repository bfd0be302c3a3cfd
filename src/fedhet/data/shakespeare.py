"""Tiny Shakespeare split by speaking role, LEAF-style: one client per role, next-character prediction.

Source: Karpathy's tiny Shakespeare (`<root>/tiny_shakespeare/input.txt`, speeches as "Name:\\nline\\nline\\n\\n").
As LEAF (Caldas et al. 2018, `data/shakespeare`) prepares the complete works, per client:
- a client is a speaking role; LEAF groups lines by (play, character), but tiny Shakespeare has no play
  boundaries, so a role here is a character *name* (e.g. every play's "First Citizen" is one client);
- the role's speeches are joined and every run of whitespace (newlines included) becomes one space;
- samples are windows of `seq_len` (80) characters -> the next character, with stride 1 (LEAF) or `stride`;
- the split is in time order: the first int(train_fraction * n) windows train, and test windows start only
  after the last training window's input ends (LEAF's `num_train + 80 - 1` gap; `leaf_gap: false` drops it);
- the vocabulary is `string.printable` (as TransFed's / FedEM's SHAKESPEARE_CONFIG), any other character
  maps to one extra `<unk>` id: 101 token ids, which are also the 101 classes.
Roles with fewer than `min_samples` windows (or no window on one side of the split) are dropped;
`max_clients` keeps the largest roles (or a seeded sample), `max_samples_per_client` keeps evenly spaced
windows of each split. Windows are uint8 views of the role's text (no copies); a client's transform turns
them into LongTensor (seq_len,) token ids.
"""

from __future__ import annotations

import dataclasses
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedhet.data.files import missing_dataset
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, Transform, register_dataset
from fedhet.errors import ConfigError, DatasetNotFoundError, nearest

if TYPE_CHECKING:
    from fedhet.config import DataConfig
    from fedhet.data.datasets import IndexedDataset

VOCAB = string.printable  # 100 characters, ids 0..99
UNK_ID = len(VOCAB)  # every other character
TOKENS = (*VOCAB, "<unk>")
CLASSES = tuple(repr(c) if c.isspace() else c for c in VOCAB) + ("<unk>",)
SELECTIONS = ("largest", "random")
FILES = ("tiny_shakespeare/input.txt", "tinyshakespeare/input.txt", "shakespeare/input.txt")
SHAKESPEARE_SRC = ("Karpathy's tiny Shakespeare (char-rnn, 2015), "
                   "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt; "
                   "LEAF (Caldas et al. 2018, https://github.com/TalwalkarLab/leaf) for the per-role split")
_SPACES = re.compile(r"\s+")
_LOOKUP = np.full(256, UNK_ID, np.uint8)
_LOOKUP[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB), dtype=np.uint8)


@dataclass
class ShakespeareOptions:
    """`data.options` of dataset `shakespeare` (module docstring)."""

    seq_len: int = 80  # characters per input window (LEAF / SHAKESPEARE_CONFIG chunk length)
    stride: int = 1  # characters between consecutive windows (LEAF: 1)
    train_fraction: float = 0.8  # the first share of each role's windows trains, the rest tests (time order)
    leaf_gap: bool = True  # drop the seq_len - 1 windows between train and test whose inputs overlap training text
    min_samples: int = 100  # roles with fewer windows are dropped
    max_clients: int | None = None  # keep this many roles (None: all that pass min_samples)
    client_selection: str = "largest"  # largest (most windows first) | random (seeded by selection_seed)
    selection_seed: int = 0  # the seed of client_selection: random (fixed: the same roles for every run seed)
    max_samples_per_client: int | None = None  # cap on train + test windows per role (evenly spaced in time)

    def validate(self) -> None:
        where = "data.options"
        for key in ("seq_len", "stride", "min_samples"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{where}.{key} must be >= 1, got {getattr(self, key)}")
        if not 0.0 < self.train_fraction < 1.0:
            raise ConfigError(f"{where}.train_fraction must be in (0, 1), got {self.train_fraction}")
        for key, least in (("max_clients", 1), ("max_samples_per_client", 2)):
            value = getattr(self, key)
            if value is not None and value < least:
                raise ConfigError(f"{where}.{key} must be null or >= {least}, got {value}")
        if self.client_selection not in SELECTIONS:
            raise ConfigError(f"{where}.client_selection must be one of {', '.join(SELECTIONS)}"
                              f"{nearest(self.client_selection, SELECTIONS)}, got '{self.client_selection}'")


def parse_roles(text: str) -> dict[str, str]:
    """Speeches ("Name:" line, then its lines, blank-line separated) -> role name -> its text, whitespace runs
    collapsed to one space (LEAF). Names keep their case, spaces become '_'; a block without a "Name:" line
    continues the previous speech; speakers with no lines add nothing."""
    roles: dict[str, list[str]] = {}
    current: str | None = None
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        head = lines[0].strip()
        if head.endswith(":") and len(head) > 1:
            current, lines = "_".join(head[:-1].split()), lines[1:]
        if current is not None and lines:
            roles.setdefault(current, []).append(" ".join(lines))
    return {name: _SPACES.sub(" ", " ".join(parts)).strip() for name, parts in roles.items()}


def encode(text: str) -> torch.Tensor:
    """Characters -> uint8 token ids (string.printable index, UNK_ID for anything else)."""
    codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    ids = np.full(len(codes), UNK_ID, np.uint8)
    ascii_ = codes < 256
    ids[ascii_] = _LOOKUP[codes[ascii_]]
    return torch.from_numpy(ids)


def windows(ids: torch.Tensor, seq_len: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, seq_len) input windows (a view of `ids`) and their next-character labels (int64); window k starts
    at character k * stride, its label is character k * stride + seq_len."""
    if len(ids) <= seq_len:
        return ids.new_zeros((0, seq_len)), torch.zeros(0, dtype=torch.int64)
    x = ids[:-1].unfold(0, seq_len, stride)
    y = ids[seq_len::stride][: len(x)].long()
    return x, y


def split_in_time(n: int, opts: ShakespeareOptions) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) window positions: the first int(train_fraction * n) train; test starts after the gap."""
    n_train = max(1, int(opts.train_fraction * n))
    gap = -(-(opts.seq_len - 1) // opts.stride) if opts.leaf_gap else 0  # windows whose inputs overlap training
    train, test = np.arange(n_train), np.arange(n_train + gap, n)
    cap = opts.max_samples_per_client
    if cap is not None and len(train) + len(test) > cap:
        k_train = max(1, int(opts.train_fraction * cap))
        train, test = _evenly(train, k_train), _evenly(test, cap - k_train)
    return train, test


def _evenly(positions: np.ndarray, k: int) -> np.ndarray:
    """At most k evenly spaced entries of `positions`, in order."""
    if len(positions) <= k:
        return positions
    return positions[np.unique(np.linspace(0, len(positions) - 1, k).round().astype(np.int64))]


def _take(t: torch.Tensor, positions: np.ndarray) -> torch.Tensor:
    """Rows `positions` of `t`: a view when they are consecutive (the uncapped split), else a copy."""
    if len(positions) and positions[-1] - positions[0] == len(positions) - 1:
        return t[int(positions[0]): int(positions[-1]) + 1]
    return t[torch.from_numpy(positions)]


def role_domains(roles: dict[str, str], opts: ShakespeareOptions) -> dict[str, DomainData]:
    """Role -> DomainData (time-ordered train / test windows) for the roles kept by min_samples / max_clients."""
    data: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, text in roles.items():
        x, y = windows(encode(text), opts.seq_len, opts.stride)
        train, test = split_in_time(len(y), opts)
        if len(y) >= opts.min_samples and len(train) and len(test):
            data[name] = (x, y)
    names = sorted(data, key=lambda n: (-len(data[n][1]), n))
    if opts.max_clients is not None and opts.client_selection == "random" and len(names) > opts.max_clients:
        rng = np.random.default_rng(opts.selection_seed)
        names = [names[i] for i in sorted(rng.choice(len(names), opts.max_clients, replace=False))]
    names = names[: opts.max_clients]
    out = {}
    for name in names:
        x, y = data[name]
        tr, te = split_in_time(len(y), opts)
        note = f"role {name}: {len(y)} windows, {len(tr)} train / {len(te)} test (time order)"
        out[name] = DomainData(_take(x, tr), _take(y, tr), _take(x, te), _take(y, te), note=note)
    return out


def find_text(root: Path | None) -> Path:
    """The tiny Shakespeare file under the data root; a DatasetNotFoundError saying where to put it."""
    looked = [root / f for f in FILES] if root is not None else []
    for path in looked:
        if path.is_file():
            return path
    raise missing_dataset("shakespeare", "(every role)", root, looked, SHAKESPEARE_SRC, FILES[0])


def token_ids(x: torch.Tensor) -> torch.Tensor:
    """A window of uint8 token ids -> LongTensor ids (the model's embedding input)."""
    return x.long()


def text_transforms(train: IndexedDataset, cfg: DataConfig, size: int) -> tuple[Transform, Transform]:
    """Both splits: uint8 ids -> int64 ids (no augmentation; input noise does not apply to tokens)."""
    if cfg.input_noise_std > 0:
        raise ConfigError("data.input_noise_std does not apply to dataset 'shakespeare' (its inputs are token "
                          "ids); set it to 0")
    return token_ids, token_ids


def resolve(spec: DatasetSpec, opts: ShakespeareOptions, cfg: DataConfig) -> DatasetSpec:
    """The concrete spec: one domain (client) per kept role, read from the data root."""
    path = find_text(cfg.resolved_root())
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DatasetNotFoundError(f"{path} is not UTF-8 text ({err}); give Karpathy's tiny Shakespeare "
                                   "input.txt") from None
    domains = role_domains(parse_roles(text), opts)
    if not domains:
        raise ConfigError(f"dataset 'shakespeare': no role in {path} has >= {opts.min_samples} windows of "
                          f"{opts.seq_len} characters on both sides of the split; lower data.options.min_samples")
    for d in domains.values():
        d.note = f"{path}; {d.note}"

    def load(ctx: LoadContext, domain: str) -> DomainData:
        return domains[domain]

    return dataclasses.replace(spec, domains=tuple(domains), loader=load, feature_dim=opts.seq_len, resolve=None)


def _unresolved(ctx: LoadContext, domain: str) -> DomainData:
    raise ConfigError("dataset 'shakespeare' must be resolved first: use fedhet.data.registry.resolve_spec(cfg)")


register_dataset(DatasetSpec(
    name="shakespeare", domains=(), classes=CLASSES, modality="text", loader=_unresolved, source=SHAKESPEARE_SRC,
    layout=f"{FILES[0]} (one client per speaking role)", feature_dim=80, options=ShakespeareOptions,
    resolve=resolve, transforms=text_transforms, vocabulary=TOKENS,
))

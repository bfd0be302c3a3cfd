"""Build the federated view of a dataset: load domains, partition into clients, split and attach transforms.

Order of operations for each (cfg, seed), all random choices from numpy generators seeded by
(seed, stage, index), so the same (cfg, seed) always gives the same clients:

1. per domain, a test pool: the official test split when the source has one, else a stratified
   `test_fraction` hold-out of the domain (seed stage 1); a benchmark protocol (`fedhet.data.protocols`:
   Digits with `fedbn_percent`, Fed-Heart-Disease as FLamby) sets a fixed split for every seed instead;
2. clients from the training pools: `domain` (one client per domain, or `clients_per_domain` IID clients per
   domain), or `dirichlet` / `pathological` / `pathological_uniform` / `pachinko` / `quantity` / `iid` over the
   pooled domains (stage 2; `fedhet.data.label_skew` for the pFedHN / Pachinko splits);
3. test splits: a domain's test pool is split IID among that domain's clients; for the other partitions the
   pooled test set is dealt so each client's test split follows its own training label distribution (stage 3);
4. per client: a stratified `val_fraction` hold-out of its training data (stage 4), then `fraction`
   subsampling of the rest (stratified, >= min_train_per_client, >= 1 per class when possible; stage 5; a
   `max_train_per_client` cap is applied first, stratified, stage 7), then
   the `max_test_per_client` cap (stratified; stage 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset

from fedhet.config import DataConfig
from fedhet.data import label_skew as L
from fedhet.data import partition as P
from fedhet.data.datasets import IndexedDataset, Part
from fedhet.data.protocols import apply_protocols, check_protocols
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, load_domains, resolve_domains, resolve_spec
from fedhet.data.transforms import feature_transforms, image_transforms
from fedhet.errors import ConfigError, unknown_choice

PARTITIONS = ("domain", "dirichlet", "pathological", "pathological_uniform", "pachinko", "quantity", "iid")


@dataclass
class ClientData:
    """One client's splits. `train` applies train-time augmentation; the others the eval transform."""

    name: str  # the domain name, "<domain>#<k>" with several clients per domain, or "client<k>"
    domain: str  # the client's domain, or "mixed" when a label-skew partition pools several domains
    train: Dataset[Any]  # Any: samples (x, y); x's type is the modality's (an image tensor, an (image, question) pair)
    val: Dataset[Any] | None  # Any: as train's
    test: Dataset[Any]  # Any: as train's
    train_eval: Dataset[Any]  # Any: as train's; the training samples with the eval transform (e.g. for prototypes)
    classes: tuple[int, ...] | None = None  # the class ids this client's head may predict (None: all of them)

    @property
    def num_train(self) -> int:
        return len(self.train)  # type: ignore[arg-type]


@dataclass
class FederatedData:
    """All clients of one experiment plus what a model needs to know about the data."""

    dataset: str
    clients: list[ClientData]
    num_classes: int
    classes: list[str]
    input_shape: tuple[int, ...]
    modality: str = "image"
    partition: str = "domain"
    generated_domains: list[str] = field(default_factory=list)  # domains synthesised by fedhet, not read
    notes: dict[str, str] = field(default_factory=dict)  # domain -> where its data came from
    vocabulary: list[str] = field(default_factory=list)  # text / VQA: words in word-id order (DatasetSpec)

    def pooled_test(self) -> Dataset[Any]:  # Any: as ClientData.train's
        """All clients' test splits together."""
        return ConcatDataset([c.test for c in self.clients])

    def pooled_train(self) -> Dataset[Any]:  # Any: as ClientData.train's
        """All clients' training splits together (the centralised "All" oracle)."""
        return ConcatDataset([c.train for c in self.clients])

    def describe(self) -> str:
        """A text table: client, domain, #train/#val/#test and the training class histogram."""
        from fedhet.data.show import describe

        return describe(self)


@dataclass
class _Pool:
    """Samples of several domains' tensors: sample i is row loc[i] of source src[i]."""

    sources: list[tuple[str, torch.Tensor, torch.Tensor]]
    src: np.ndarray
    loc: np.ndarray
    lab: np.ndarray

    def parts(self, positions: np.ndarray) -> list[Part]:
        positions = np.asarray(positions, dtype=np.int64)
        out = []
        for s, (name, x, y) in enumerate(self.sources):
            sel = positions[self.src[positions] == s]
            if len(sel):
                out.append(Part(name, x, y, self.loc[sel]))
        return out


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.default_rng([seed, *tags])


def _pools(data: dict[str, DomainData], test_fraction: float, seed: int) -> tuple[list[_Pool], list[_Pool]]:
    """Per-domain (train pool, test pool) pairs."""
    trains, tests = [], []
    for di, (name, d) in enumerate(data.items()):
        y = d.y_train.numpy()
        if d.x_test is not None and d.y_test is not None:
            yt = d.y_test.numpy()
            trains.append(_Pool([(name, d.x_train, d.y_train)], np.zeros(len(y), np.int64), np.arange(len(y)), y))
            tests.append(_Pool([(name, d.x_test, d.y_test)], np.zeros(len(yt), np.int64), np.arange(len(yt)), yt))
        else:
            kept, held = P.stratified_split(y, test_fraction, _rng(seed, 1, di))
            src = (name, d.x_train, d.y_train)
            trains.append(_Pool([src], np.zeros(len(kept), np.int64), kept, y[kept]))
            tests.append(_Pool([src], np.zeros(len(held), np.int64), held, y[held]))
    return trains, tests


def _concat(pools: list[_Pool]) -> _Pool:
    sources: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    src: list[np.ndarray] = []
    loc: list[np.ndarray] = []
    lab: list[np.ndarray] = []
    for p in pools:
        src.append(p.src + len(sources))
        sources += p.sources
        loc.append(p.loc)
        lab.append(p.lab)
    return _Pool(sources, np.concatenate(src), np.concatenate(loc), np.concatenate(lab))


def _partition(cfg: DataConfig, domains: list[str], trains: list[_Pool], tests: list[_Pool],
               seed: int) -> list[tuple[str, str, list[Part], list[Part]]]:
    """(name, domain, train parts, test parts) per client."""
    out = []
    if cfg.partition == "domain":
        k = cfg.clients_per_domain
        for di, (name, tr, te) in enumerate(zip(domains, trains, tests, strict=True)):
            tr_parts = P.iid_partition(len(tr.lab), k, _rng(seed, 2, di))
            te_parts = P.iid_partition(len(te.lab), k, _rng(seed, 3, di)) if k > 1 else [np.arange(len(te.lab))]
            for j in range(k):
                out.append((name if k == 1 else f"{name}#{j}", name, tr.parts(tr_parts[j]), te.parts(te_parts[j])))
        return out
    train, test = _concat(trains), _concat(tests)
    rng, n = _rng(seed, 2), len(train.lab)
    if cfg.partition == "dirichlet":
        parts = P.dirichlet_partition(train.lab, cfg.num_clients, cfg.alpha, rng)
    elif cfg.partition == "pathological":
        parts = P.pathological_partition(train.lab, cfg.num_clients, cfg.classes_per_client, rng)
    elif cfg.partition == "pathological_uniform":
        parts = L.pathological_uniform_partition(train.lab, cfg.num_clients, cfg.classes_per_client, rng,
                                                 cfg.pathological_low, cfg.pathological_high)
    elif cfg.partition == "pachinko":
        coarse = L.resolve_coarse_labels(cfg.coarse_labels, cfg.dataset)
        parts = L.pachinko_partition(train.lab, cfg.num_clients, coarse, rng, cfg.pachinko_alpha, cfg.pachinko_beta)
    elif cfg.partition == "quantity":
        parts = P.quantity_partition(n, cfg.num_clients, cfg.quantity_alpha, rng, min_size=10)
    elif cfg.partition == "iid":
        parts = P.iid_partition(n, cfg.num_clients, rng)
    else:
        raise unknown_choice("data.partition", cfg.partition, PARTITIONS)
    test_parts = P.match_label_distribution(test.lab, [train.lab[p] for p in parts], _rng(seed, 3))
    domain = domains[0] if len(domains) == 1 else "mixed"
    for k, (p, q) in enumerate(zip(parts, test_parts, strict=True)):
        out.append((f"client{k}", domain, train.parts(p), test.parts(q)))
    return out


def _select(parts: list[Part], keep: np.ndarray) -> list[Part]:
    """The samples at positions `keep` (into the concatenation of `parts`)."""
    out, start = [], 0
    for p in parts:
        sel = keep[(keep >= start) & (keep < start + len(p.index))] - start
        if len(sel):
            out.append(Part(p.domain, p.x, p.y, p.index[sel]))
        start += len(p.index)
    return out


def _labels(parts: list[Part]) -> np.ndarray:
    return IndexedDataset(parts).labels


def _input_shape(spec: DatasetSpec, data: dict[str, DomainData], size: int | None) -> tuple[int, ...]:
    if spec.modality in ("image", "vqa"):  # vqa: the image's shape (the question is QUESTION_LEN word ids)
        return (spec.channels, int(size), int(size))  # type: ignore[arg-type]
    return tuple(next(iter(data.values())).x_train.shape[1:])


def build_federated_data(cfg: DataConfig, seed: int) -> FederatedData:
    """Load `cfg.dataset`, split it into clients and attach transforms; deterministic in (cfg, seed)."""
    cfg.validate()
    spec = resolve_spec(cfg)  # options parsed; imagefolder / csv read their domains and classes here
    if cfg.partition not in PARTITIONS:
        raise unknown_choice("data.partition", cfg.partition, PARTITIONS)
    domains = resolve_domains(spec, cfg.domains)
    size = cfg.image_size or spec.default_image_size
    check_protocols(cfg, spec.name, spec.modality)
    data = load_domains(spec, domains, LoadContext(cfg.resolved_root(), int(size or 0), cfg.download))
    data = apply_protocols(cfg, spec.name, data)
    trains, tests = _pools(data, cfg.test_fraction, seed)
    clients = []
    for k, (name, domain, tr_parts, te_parts) in enumerate(_partition(cfg, domains, trains, tests, seed)):
        y = _labels(tr_parts)
        if len(y) == 0:
            raise ConfigError(f"client '{name}' got no training samples; use fewer clients or a larger alpha")
        val_parts = None
        if cfg.val_fraction > 0:
            kept, held = P.stratified_split(y, cfg.val_fraction, _rng(seed, 4, k))
            tr_parts, val_parts = _select(tr_parts, kept), _select(tr_parts, held)
            y = y[kept]
        if cfg.max_train_per_client is not None and cfg.max_train_per_client < len(y):
            tr_parts = _select(tr_parts, P.subsample(y, cfg.max_train_per_client, _rng(seed, 7, k)))
            y = _labels(tr_parts)
        if cfg.fraction < 1.0 or cfg.min_train_per_client > len(y):
            tr_parts = _select(tr_parts, P.fraction_subsample(y, cfg.fraction, cfg.min_train_per_client,
                                                               _rng(seed, 5, k)))
        if cfg.max_test_per_client is not None:
            te_parts = _select(te_parts, P.subsample(_labels(te_parts), cfg.max_test_per_client, _rng(seed, 6, k)))
        if spec.transforms is not None:  # the dataset's own (e.g. imagefolder: channels, normalisation)
            train_t, eval_t = spec.transforms(IndexedDataset(tr_parts), cfg, int(size or 0))
        elif spec.modality == "image":
            train_t, eval_t = image_transforms(int(size), cfg.augment, spec.hflip, cfg.input_noise_std)  # type: ignore[arg-type]
        else:
            norm = cfg.feature_norm or spec.feature_norm
            train_t, eval_t = feature_transforms(norm, IndexedDataset(tr_parts).raw_x(), cfg.input_noise_std)
        clients.append(ClientData(
            name=name, domain=domain, train=IndexedDataset(tr_parts, train_t),
            val=IndexedDataset(val_parts, eval_t) if val_parts is not None else None,
            test=IndexedDataset(te_parts, eval_t), train_eval=IndexedDataset(tr_parts, eval_t),
            classes=data[domain].classes if domain in data else None))
    return FederatedData(
        dataset=spec.name, clients=clients, num_classes=len(spec.classes), classes=list(spec.classes),
        input_shape=_input_shape(spec, data, size), modality=spec.modality, partition=cfg.partition,
        generated_domains=[d for d, v in data.items() if v.generated], notes={d: v.note for d, v in data.items()},
        vocabulary=list(spec.vocabulary))

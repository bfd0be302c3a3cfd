"""Partitioners: pure functions from labels (or sizes) and a numpy Generator to per-client index arrays.

Every function returns sorted int64 index arrays into the given label array; the same inputs and generator
state give the same output.
"""

from __future__ import annotations

import numpy as np

from fedhet.errors import ConfigError


def _sorted(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def allocate(weights: np.ndarray, total: int, caps: np.ndarray | None = None) -> np.ndarray:
    """Split integer `total` proportionally to `weights` by largest remainder, never exceeding `caps`."""
    weights = np.asarray(weights, dtype=np.float64)
    out = np.zeros(len(weights), dtype=np.int64)
    if total <= 0 or weights.sum() <= 0:
        return out
    caps = np.full(len(weights), total, dtype=np.int64) if caps is None else np.asarray(caps, dtype=np.int64)
    remaining = int(min(total, caps.sum()))
    while remaining > 0:
        free = out < caps
        w = np.where(free, weights, 0.0)
        if w.sum() <= 0:  # only zero-weight slots have room left
            w = free.astype(np.float64)
        exact = w / w.sum() * remaining
        add = np.minimum(np.floor(exact).astype(np.int64), caps - out)
        left = remaining - int(add.sum())
        for i in np.argsort(-(exact - np.floor(exact)), kind="stable"):
            if left == 0:
                break
            if w[i] > 0 and out[i] + add[i] < caps[i]:
                add[i] += 1
                left -= 1
        out += add
        remaining -= int(add.sum())
    return out


def iid_partition(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle 0..n-1 and cut it into `num_clients` near-equal parts."""
    if num_clients > n:
        raise ConfigError(f"cannot split {n} samples IID into {num_clients} clients")
    return _sorted(np.array_split(rng.permutation(n), num_clients))


def domain_partition(domain_ids: np.ndarray, clients_per_domain: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One client per domain, or `clients_per_domain` IID clients per domain (clients ordered by domain id)."""
    parts: list[np.ndarray] = []
    for d in np.unique(domain_ids):
        idx = np.flatnonzero(domain_ids == d)
        parts += [idx[p] for p in iid_partition(len(idx), clients_per_domain, rng)]
    return _sorted(parts)


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 10, max_tries: int = 1000) -> list[np.ndarray]:
    """Label skew: each class is spread over clients with proportions ~ Dir(alpha).

    The common recipe (Yurochkin et al. 2019; Li et al., NIID-Bench 2022): a client already holding more than
    N / num_clients samples gets no more, and the draw is repeated until every client has at least `min_size`
    samples (lowered to N // num_clients when that is infeasible). Smaller alpha gives more skew.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if num_clients > n:
        raise ConfigError(f"cannot split {n} samples into {num_clients} clients")
    min_size = min(min_size, n // num_clients)
    best: list[list[int]] | None = None
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            p = p * np.array([len(q) < n / num_clients for q in parts])
            p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for q, chunk in zip(parts, np.split(idx, cuts), strict=True):
                q.extend(chunk.tolist())
        if best is None or min(map(len, parts)) > min(map(len, best)):
            best = parts
        if min(map(len, parts)) >= min_size:
            break
    assert best is not None
    return _sorted([np.array(q) for q in best])


def pathological_partition(labels: np.ndarray, num_clients: int, classes_per_client: int,
                           rng: np.random.Generator) -> list[np.ndarray]:
    """Pathological label skew: every client holds exactly k classes (McMahan et al. 2017's shards, NIID-Bench #C=k).

    Classes are dealt in a shuffled cyclic order (client i gets classes perm[(i*k + j) % C], j < k), so all
    classes are used when num_clients * k >= C; each class is then cut into equal shards, one per client
    holding it. Classes held by no client (num_clients * k < C) are dropped.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    k = classes_per_client
    if k > len(classes):
        raise ConfigError(f"data.classes_per_client={k} exceeds the {len(classes)} classes present")
    perm = rng.permutation(classes)
    owned = [[perm[(i * k + j) % len(classes)] for j in range(k)] for i in range(num_clients)]
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders = [i for i in range(num_clients) if c in owned[i]]
        if not holders:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for i, chunk in zip(holders, np.array_split(idx, len(holders)), strict=True):
            parts[i].extend(chunk.tolist())
    return _sorted([np.array(p) for p in parts])


def quantity_partition(n: int, num_clients: int, alpha: float, rng: np.random.Generator,
                       min_size: int = 1, max_tries: int = 1000) -> list[np.ndarray]:
    """Quantity skew: client sizes ~ Dir(alpha) * n (redrawn until each has `min_size`), samples assigned IID."""
    if num_clients > n:
        raise ConfigError(f"cannot split {n} samples into {num_clients} clients")
    min_size = min(min_size, n // num_clients)
    sizes = None
    for _ in range(max_tries):
        sizes = allocate(rng.dirichlet(np.full(num_clients, alpha)), n)
        if sizes.min() >= min_size:
            break
    else:  # give up on the draw: move samples from the largest clients to the smallest
        assert sizes is not None
        while sizes.min() < min_size:
            sizes[np.argmax(sizes)] -= 1
            sizes[np.argmin(sizes)] += 1
    cuts = np.cumsum(sizes)[:-1]
    return _sorted(np.split(rng.permutation(n), cuts))


def stratified_split(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hold out about `fraction` of each class -> (kept, held); a class never loses its last sample."""
    labels = np.asarray(labels)
    kept: list[np.ndarray] = []
    held: list[np.ndarray] = []
    classes, counts = np.unique(labels, return_counts=True)
    quota = allocate(counts.astype(float), int(round(fraction * len(labels))), caps=np.maximum(counts - 1, 0))
    for c, q in zip(classes, quota, strict=True):
        idx = rng.permutation(np.flatnonzero(labels == c))
        held.append(idx[:q])
        kept.append(idx[q:])
    cat = np.concatenate if kept else (lambda _: np.zeros(0, np.int64))
    return np.sort(cat(kept)).astype(np.int64), np.sort(cat(held)).astype(np.int64)


def subsample(labels: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """Keep `keep` samples stratified by class, with at least one per class when keep >= #classes."""
    labels = np.asarray(labels)
    if keep >= len(labels):
        return np.arange(len(labels), dtype=np.int64)
    classes, counts = np.unique(labels, return_counts=True)
    base = np.ones(len(classes), np.int64) if keep >= len(classes) else np.zeros(len(classes), np.int64)
    quota = base + allocate(counts.astype(float) - base, keep - int(base.sum()), caps=counts - base)
    if keep < len(classes):  # too few to cover every class: the largest classes win, ties broken at random
        order = np.lexsort((rng.random(len(classes)), -counts))
        quota = np.zeros(len(classes), np.int64)
        quota[order[:keep]] = 1
    out = [rng.permutation(np.flatnonzero(labels == c))[:q] for c, q in zip(classes, quota, strict=True)]
    return np.sort(np.concatenate(out)).astype(np.int64)


def fraction_subsample(labels: np.ndarray, fraction: float, min_count: int, rng: np.random.Generator) -> np.ndarray:
    """Keep round(fraction * n) samples (at least `min_count` and 1, at most n), stratified by class."""
    n = len(labels)
    keep = min(n, max(int(round(fraction * n)), min_count, 1))
    return subsample(labels, keep, rng)


def match_label_distribution(labels: np.ndarray, client_labels: list[np.ndarray],
                             rng: np.random.Generator) -> list[np.ndarray]:
    """Deal a pooled (test) set to clients so each follows its own training label distribution.

    Class c's samples are split among clients in proportion to how many class-c training samples each holds
    (largest remainder), so the splits are disjoint and every sample of a class some client holds is used.
    """
    labels = np.asarray(labels)
    parts: list[list[int]] = [[] for _ in client_labels]
    for c in np.unique(labels):
        weights = np.array([(np.asarray(cl) == c).sum() for cl in client_labels], dtype=float)
        if weights.sum() == 0:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        sizes = allocate(weights, len(idx))
        for i, chunk in enumerate(np.split(idx, np.cumsum(sizes)[:-1])):
            parts[i].extend(chunk.tolist())
    return _sorted([np.array(p) for p in parts])

"""The label-skew partitions of pFedHN / FedTP / AdaptFED (spec adaptfed.md §2.10, paper Sec. 4.1.2).

- `pathological_uniform_partition`: pFedHN's split (Shamsian et al. 2021, FedTP's `noniid-labeluni`), the paper's
  "Pathological" one: every client holds `k` classes, and a holder i of class c gets the share
  a_{i,c} / sum_j a_{j,c} of its samples, a_{i,c} ~ U(0.4, 0.6), the sum running over the class's holders.
- `pachinko_partition`: two-stage Pachinko allocation (Reddi et al., ICLR 2021, for CIFAR-100; FedTP's
  `noniid-labeldir100`): per client, coarse-group weights ~ Dir(alpha 1) (paper: 0.4) and, per coarse group,
  fine-label weights ~ Dir(beta 1) (paper: 10); each client draws its samples without replacement, an exhausted
  label (or group) is dropped and the remaining weights renormalised.

Same conventions as `fedhet.data.partition`: sorted int64 index arrays into `labels`, deterministic in the
generator state, a ConfigError saying what to change when a client would get no sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.data.partition import allocate
from fedhet.errors import ConfigError, unknown_choice


def _nonempty(parts: list[np.ndarray], what: str) -> list[np.ndarray]:
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(f"{what}: client{empty[0]} (and {len(empty) - 1} more) got no samples; "
                          "use fewer clients (data.num_clients)")
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def assign_classes(num_classes: int, num_clients: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean num_clients x num_classes: client i holds k distinct classes, each class ~ k*N/C holders.

    pFedHN's greedy rule: a client picks, k times, uniformly among the classes (not yet its own) with the most
    holder slots left. pFedHN asserts that C divides k*N; here the k*N slots are spread so the classes' holder
    counts differ by at most one (which classes get the extra slot is random).
    """
    if k > num_classes:
        raise ConfigError(f"data.classes_per_client={k} exceeds the {num_classes} classes present")
    slots = np.full(num_classes, k * num_clients // num_classes, dtype=np.int64)
    slots[rng.permutation(num_classes)[: k * num_clients % num_classes]] += 1
    held = np.zeros((num_clients, num_classes), dtype=bool)
    for i in range(num_clients):
        for _ in range(k):
            left = np.where(held[i], np.iinfo(np.int64).min, slots)
            c = rng.choice(np.flatnonzero(left == left.max()))
            held[i, c] = True
            slots[c] -= 1
    return held


def uniform_class_rates(num_classes: int, num_clients: int, k: int, rng: np.random.Generator,
                        low: float = 0.4, high: float = 0.6) -> np.ndarray:
    """num_clients x num_classes matrix of a_{i,c} ~ U(low, high) where client i holds class c, else 0."""
    held = assign_classes(num_classes, num_clients, k, rng)
    return np.where(held, rng.uniform(low, high, size=held.shape), 0.0)


def deal_by_weights(labels: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Split each class c (the c-th of np.unique(labels)) among clients in proportion to weights[:, c].

    Largest remainder (`allocate`), so every sample of a class someone holds is used (pFedHN floors
    n_c * share and drops the few left over); classes nobody holds are dropped.
    """
    labels = np.asarray(labels)
    parts: list[list[int]] = [[] for _ in range(weights.shape[0])]
    for c, cls in enumerate(np.unique(labels)):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        sizes = allocate(weights[:, c], len(idx))
        for i, chunk in enumerate(np.split(idx, np.cumsum(sizes)[:-1])):
            parts[i].extend(chunk.tolist())
    return [np.array(p, dtype=np.int64) for p in parts]


def pathological_uniform_partition(labels: np.ndarray, num_clients: int, classes_per_client: int,
                                   rng: np.random.Generator, low: float = 0.4,
                                   high: float = 0.6) -> list[np.ndarray]:
    """pFedHN / AdaptFED pathological split: k classes per client, shares a_{i,c} / sum_j a_{j,c}, a ~ U(low, high)."""
    labels = np.asarray(labels)
    if not 0 < low <= high:
        raise ConfigError(f"need 0 < data.pathological_low <= data.pathological_high, got {low}, {high}")
    rates = uniform_class_rates(len(np.unique(labels)), num_clients, classes_per_client, rng, low, high)
    return _nonempty(deal_by_weights(labels, rates, rng), "data.partition=pathological_uniform")


@dataclass(frozen=True)
class PachinkoWeights:
    """Per-client Pachinko weights: `coarse` N x G (rows ~ Dir(alpha)); `fine` N x C, each client's weights of a
    group's classes ~ Dir(beta) and summing to 1 within the group."""

    coarse: np.ndarray
    fine: np.ndarray


def pachinko_weights(group_of: np.ndarray, num_clients: int, alpha: float, beta: float,
                     rng: np.random.Generator) -> PachinkoWeights:
    """Draw the two stages' weights; `group_of[c]` is class c's coarse group in 0..G-1."""
    if alpha <= 0 or beta <= 0:
        raise ConfigError(f"Pachinko concentrations must be > 0, got alpha={alpha}, beta={beta}")
    groups = int(group_of.max()) + 1
    coarse = rng.dirichlet(np.full(groups, alpha), size=num_clients)
    fine = np.zeros((num_clients, len(group_of)))
    for g in range(groups):
        members = np.flatnonzero(group_of == g)
        fine[:, members] = rng.dirichlet(np.full(len(members), beta), size=num_clients)
    return PachinkoWeights(coarse, fine)


def _normalised(w: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """w restricted to `ok` and renormalised (uniform over `ok` when those weights underflow to 0)."""
    w = np.where(ok, w, 0.0)
    return np.asarray(w / w.sum() if w.sum() > 0 else ok / ok.sum())


def _fill_group(m: int, members: np.ndarray, fine: np.ndarray, avail: np.ndarray, counts: np.ndarray,
                rng: np.random.Generator) -> int:
    """Draw m fine labels of one group (renormalising away exhausted ones); returns how many found no sample."""
    while m > 0 and avail[members].sum() > 0:
        draw = rng.multinomial(m, _normalised(fine[members], avail[members] > 0))
        take = np.minimum(draw, avail[members])
        avail[members] -= take
        counts[members] += take
        m -= int(take.sum())
    return m


def _client_counts(size: int, w: PachinkoWeights, i: int, group_of: np.ndarray, avail: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Class counts of client i: coarse draws, then fine draws within each group; a draw whose group ran out
    goes back to the coarse stage (over the groups with samples left)."""
    counts = np.zeros(len(group_of), dtype=np.int64)
    groups = w.coarse.shape[1]
    while size > 0:
        left = np.bincount(group_of, weights=avail, minlength=groups) > 0
        per_group = rng.multinomial(size, _normalised(w.coarse[i], left))
        size = sum(_fill_group(int(per_group[g]), np.flatnonzero(group_of == g), w.fine[i], avail, counts, rng)
                   for g in np.flatnonzero(per_group))
    return counts


def pachinko_sample(labels: np.ndarray, group_of: np.ndarray, weights: PachinkoWeights, size: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Each client draws `size` samples without replacement by its Pachinko weights, clients in a random order
    (FedTP shuffles its clients afterwards: the last ones drawn see depleted labels)."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    avail = np.array([len(p) for p in pools], dtype=np.int64)
    if size * weights.coarse.shape[0] > len(labels):
        raise ConfigError(f"Pachinko: {weights.coarse.shape[0]} clients x {size} samples exceed the {len(labels)} "
                          "samples; use fewer clients (data.num_clients)")
    parts: list[np.ndarray] = [np.zeros(0, np.int64)] * weights.coarse.shape[0]
    for i in rng.permutation(weights.coarse.shape[0]):
        counts = _client_counts(size, weights, int(i), group_of, avail, rng)
        start = np.array([len(p) for p in pools]) - avail - counts
        parts[i] = np.concatenate([p[s:s + n] for p, s, n in zip(pools, start, counts, strict=True)])
    return _nonempty(parts, "data.partition=pachinko")


def coarse_groups(labels: np.ndarray, coarse_labels: list[int] | np.ndarray) -> np.ndarray:
    """Coarse group (0..G-1, over the groups present) of each class of np.unique(labels)."""
    classes = np.unique(np.asarray(labels))
    coarse = np.asarray(coarse_labels, dtype=np.int64)
    if len(classes) and (classes.min() < 0 or classes.max() >= len(coarse)):
        raise ConfigError(f"data.coarse_labels has {len(coarse)} entries but the data has class id "
                          f"{int(classes.max())}; give one coarse-group id per class, in class-id order")
    return np.unique(coarse[classes], return_inverse=True)[1].astype(np.int64)


def pachinko_partition(labels: np.ndarray, num_clients: int, coarse_labels: list[int] | np.ndarray,
                       rng: np.random.Generator, alpha: float = 0.4, beta: float = 10.0,
                       size: int | None = None) -> list[np.ndarray]:
    """Two-stage Pachinko split; `coarse_labels[c]` is class c's coarse group; `size` samples per client
    (default N // num_clients, FedTP's; Reddi et al. use 100 per client on CIFAR-100's 500 clients)."""
    labels = np.asarray(labels)
    if num_clients > len(labels):
        raise ConfigError(f"cannot split {len(labels)} samples into {num_clients} clients; use fewer clients")
    group_of = coarse_groups(labels, coarse_labels)
    weights = pachinko_weights(group_of, num_clients, alpha, beta, rng)
    return pachinko_sample(labels, group_of, weights, len(labels) // num_clients if size is None else size, rng)


# Built-in label hierarchies: class id -> coarse group id. CIFAR-100's 20 superclasses, as in the dataset's
# `coarse_labels` (0 aquatic_mammals, 1 fish, ..., 19 vehicles_2; fine ids in the dataset's alphabetical order).
COARSE_LABELS: dict[str, tuple[int, ...]] = {
    "cifar100": (4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
                 6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
                 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
                 10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
                 16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13),
}


def resolve_coarse_labels(value: list[int] | str | None, dataset: str) -> list[int]:
    """`data.coarse_labels` as a list: given, a named table, or the dataset's own table (by its name)."""
    if isinstance(value, str):
        if value not in COARSE_LABELS:
            raise unknown_choice("data.coarse_labels table", value, COARSE_LABELS)
        return list(COARSE_LABELS[value])
    if value is not None:
        return list(value)
    if dataset in COARSE_LABELS:
        return list(COARSE_LABELS[dataset])
    raise ConfigError(f"data.partition=pachinko needs a label hierarchy and dataset '{dataset}' has none built in; "
                      "set data.coarse_labels to one coarse-group id per class in class-id order (e.g. "
                      f"[0,0,1,1,...]) or to a table name ({', '.join(sorted(COARSE_LABELS))})")

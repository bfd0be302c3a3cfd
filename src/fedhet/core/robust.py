"""Robust aggregation: `server.aggregation` rules beside the mean, over the clients' shared arrays (docs/robust.md).

A rule sees exactly what averaging sees: the shared keys of each reply (personal parts, e.g. FedBN's BatchNorm or
FedRep's head, never reach the server). Floating-point keys form each client's vector; integer counters
(BatchNorm's num_batches_tracked) take the sample-weighted mean, as under `weighted`. Rules defined on updates
(client state minus the current global model) use them: Krum's distances (equal between states and updates),
the norm bound and the geometric median. The coordinate-wise rules (median, trimmed mean) commute with the shift,
so they run on the states, as Flower's FedMedian / FedTrimmedAvg do; both are unweighted, as there.

    median             coordinate-wise median; numpy's for an even n (mean of the two middle values)
    trimmed_mean       per coordinate, cut int(beta * n) values from each end, average the rest (beta: server.trim)
    krum               the client whose n - f - 2 nearest others are closest in squared L2 (Blanchard et al. 2017)
    multi_krum         sample-weighted mean of the m lowest Krum scores (m: server.krum_select, default n - f)
    norm_bound         each update scaled to norm <= M (server.norm_bound), then the sample-weighted mean
                       (Sun et al. 2019, "Can you really backdoor federated learning?")
    geometric_median   RFA (Pillutla et al. 2022, Alg. 3): smoothed Weiszfeld from the sample-weighted mean,
                       server.rfa_iterations steps, distances floored at nu = server.rfa_nu, alpha_i = n_i
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cache

import torch

from fedhet.config import ServerConfig
from fedhet.config.sections import AVERAGING_RULES, MAJORITY_RULES, ROBUST_RULES
from fedhet.core.aggregation import average, client_weights
from fedhet.core.params import StateDict
from fedhet.errors import ConfigError

log = logging.getLogger(__name__)
Flat = dict[str, torch.Tensor]  # key -> the new global value of that key, flattened, float64
Rule = Callable[[Sequence[StateDict], StateDict, list[str], torch.Tensor, ServerConfig], Flat]


def aggregate_shared(states: Sequence[StateDict], num_examples: Sequence[int], current: StateDict,
                     cfg: ServerConfig) -> StateDict:
    """`server.aggregation` over the clients' shared states: the mean (weighted / uniform) or a robust rule;
    `current` is the global model the clients started from."""
    if cfg.aggregation in AVERAGING_RULES:
        return average(states, client_weights(num_examples, cfg.aggregation))
    check_clients(cfg, len(states))
    weights = client_weights(num_examples, "weighted")
    if sum(weights) <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    floats = rule_keys(states[0])
    counters = [k for k in states[0] if k not in floats]
    out = average([{k: s[k] for k in counters} for s in states], weights) if counters else {}
    alpha = torch.tensor(weights, dtype=torch.float64, device=states[0][floats[0]].device) if floats else None
    if alpha is not None:
        flat = RULES[cfg.aggregation](states, current, floats, alpha / alpha.sum(), cfg)
        for k in floats:
            ref = states[0][k]
            out[k] = flat[k].reshape(ref.shape).to(ref.dtype)
    return {k: out[k] for k in states[0]}


def rule_keys(state: StateDict) -> list[str]:
    """The keys of a client's vector: the floating-point shared arrays (integer counters are averaged apart)."""
    return [k for k, v in state.items() if v.is_floating_point()]


def check_clients(cfg: ServerConfig, n: int) -> None:
    """The client count a round's rule needs (`n` replies): Krum's n >= 2f + 3, an honest majority, m <= n."""
    rule, f = cfg.aggregation, cfg.byzantine
    if rule in ("krum", "multi_krum") and n < 2 * f + 3:
        raise ConfigError(f"server.aggregation {rule} needs n >= 2f + 3 clients per round, got n={n} with f={f} "
                          "(server.byzantine): sample more clients (server.fraction_fit, server.min_fit_clients) "
                          "or assume fewer attackers")
    require_majority(rule, f, n, "server.byzantine")
    if rule == "trimmed_mean" and int(cfg.trim * n) < max(f, 1):
        warn_weak_trim(cfg.trim, n, f)
    if rule == "multi_krum" and cfg.krum_select is not None and cfg.krum_select > n:
        raise ConfigError(f"server.krum_select (multi-Krum's m) is {cfg.krum_select}, more than the n={n} clients "
                          "of this round; lower it, or leave it null (n - f)")


@cache
def warn_weak_trim(trim: float, n: int, f: int) -> None:
    """Once per setting: a trimmed mean that cuts no value, or fewer than the f attackers assumed, from each end."""
    cut = int(trim * n)
    what = "the plain mean" if cut == 0 else f"unable to remove f={f} attackers"
    log.warning("server.trim=%s cuts int(%s * %d) = %d values from each end of a coordinate: the trimmed mean of "
                "these %d clients is %s; raise server.trim (below 0.5) or sample more clients", trim, trim, n, cut,
                n, what)


def require_majority(rule: str, attackers: int, n: int, source: str) -> None:
    """A rule that needs an honest majority refuses `attackers` of `n` clients when 2 * attackers >= n."""
    if rule in MAJORITY_RULES and 2 * attackers >= n:
        raise ConfigError(f"{source}: {attackers} attackers of n={n} clients per round is not a minority, and "
                          f"server.aggregation {rule} needs an honest majority (fewer than n/2 attackers); sample "
                          "more clients or assume fewer attackers")


def refuse_own_aggregation(method: str, rule: str, own: bool) -> None:
    """A method with its own aggregation (`own`) cannot take a robust `rule`: one clear error."""
    if own and rule in ROBUST_RULES:
        raise ConfigError(f"method '{method}' aggregates in its own way, not through the shared model average, so "
                          f"server.aggregation {rule} cannot apply to it; supported for {method}: "
                          f"{' or '.join(AVERAGING_RULES)}. The robust rules ({', '.join(ROBUST_RULES)}) apply to "
                          "methods that average their shared model (fedavg, fedprox, fedbn, ditto, fedrep, ...)")


# ---------------------------------------------------------------------------------------------- the rules
def rows_of(states: Sequence[StateDict], key: str, origin: StateDict | None = None) -> torch.Tensor:
    """The clients' values of `key` as the rows of an [n, numel] float64 matrix, minus `origin[key]` if given."""
    rows = torch.stack([s[key].detach().reshape(-1).to(torch.float64) for s in states])
    return rows if origin is None else rows - origin[key].detach().reshape(1, -1).to(torch.float64)


def coordinate_median(rows: torch.Tensor) -> torch.Tensor:
    """Per column, the middle value; the mean of the two middle ones when the row count is even (numpy's)."""
    ordered, n = rows.sort(dim=0).values, rows.shape[0]
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def trimmed_mean(rows: torch.Tensor, beta: float) -> torch.Tensor:
    """Per column, the mean after cutting int(beta * n) values from each end (scipy's / Flower's trim_mean)."""
    n = rows.shape[0]
    cut = int(beta * n)
    return rows.sort(dim=0).values[cut:n - cut].mean(dim=0)


def squared_distances(states: Sequence[StateDict], keys: list[str]) -> torch.Tensor:
    """[n, n] squared L2 distances between the clients' vectors over `keys` (equal to their updates')."""
    n = len(states)
    dist = torch.zeros(n, n, dtype=torch.float64)
    for key in keys:
        rows = rows_of(states, key)
        for i in range(n):
            dist[i] += (rows - rows[i]).pow(2).sum(dim=1).cpu()
    return dist


def krum_scores(dist: torch.Tensor, f: int) -> torch.Tensor:
    """Each client's Krum score: the sum of its n - f - 2 smallest squared distances to the others."""
    n = dist.shape[0]
    return dist.sort(dim=1).values[:, 1:n - f - 1].sum(dim=1)  # column 0: the client itself (distance 0)


def update_norms(states: Sequence[StateDict], current: StateDict, keys: list[str]) -> torch.Tensor:
    """[n] L2 norms of the clients' updates (state - current) over `keys`."""
    total = torch.zeros(len(states), dtype=torch.float64)
    for key in keys:
        total += rows_of(states, key, current).pow(2).sum(dim=1).cpu()
    return total.sqrt()


def _median(states: Sequence[StateDict], current: StateDict, keys: list[str], alpha: torch.Tensor,
            cfg: ServerConfig) -> Flat:
    return {k: coordinate_median(rows_of(states, k)) for k in keys}


def _trimmed(states: Sequence[StateDict], current: StateDict, keys: list[str], alpha: torch.Tensor,
             cfg: ServerConfig) -> Flat:
    return {k: trimmed_mean(rows_of(states, k), cfg.trim) for k in keys}


def _krum(states: Sequence[StateDict], current: StateDict, keys: list[str], alpha: torch.Tensor,
          cfg: ServerConfig) -> Flat:
    best = int(krum_scores(squared_distances(states, keys), cfg.byzantine).argmin())
    return {k: states[best][k].detach().reshape(-1).to(torch.float64) for k in keys}


def _multi_krum(states: Sequence[StateDict], current: StateDict, keys: list[str], alpha: torch.Tensor,
                cfg: ServerConfig) -> Flat:
    m = cfg.krum_select or len(states) - cfg.byzantine
    chosen = krum_scores(squared_distances(states, keys), cfg.byzantine).argsort()[:m].to(alpha.device)
    w = alpha[chosen] / alpha[chosen].sum()
    return {k: w @ rows_of(states, k)[chosen] for k in keys}


def _norm_bound(states: Sequence[StateDict], current: StateDict, keys: list[str], alpha: torch.Tensor,
                cfg: ServerConfig) -> Flat:
    bound = float(cfg.norm_bound or 0.0)  # validate() requires it for this rule
    scale = (bound / update_norms(states, current, keys).to(alpha.device)).clamp(max=1.0)  # a zero update: inf -> 1
    coeff = alpha * scale
    return {k: current[k].detach().reshape(-1).to(torch.float64) + coeff @ rows_of(states, k, current) for k in keys}


def _geometric_median(states: Sequence[StateDict], current: StateDict, keys: list[str], alpha: torch.Tensor,
                      cfg: ServerConfig) -> Flat:
    """RFA's smoothed Weiszfeld on the updates: v <- sum_i beta_i d_i / sum_i beta_i, beta_i = alpha_i /
    max(nu, ||v - d_i||), from the alpha-weighted mean, `rfa_iterations` times."""
    updates = {k: rows_of(states, k, current) for k in keys}  # once: every Weiszfeld step reads them twice
    v = {k: alpha @ updates[k] for k in keys}
    for _ in range(cfg.rfa_iterations):
        dist = torch.zeros_like(alpha)
        for key in keys:
            dist += (updates[key] - v[key]).pow(2).sum(dim=1)
        beta = alpha / dist.sqrt().clamp(min=cfg.rfa_nu)
        beta = beta / beta.sum()
        v = {k: beta @ updates[k] for k in keys}
    return {k: current[k].detach().reshape(-1).to(torch.float64) + v[k] for k in keys}


RULES: dict[str, Rule] = {"median": _median, "trimmed_mean": _trimmed, "krum": _krum, "multi_krum": _multi_krum,
                          "norm_bound": _norm_bound, "geometric_median": _geometric_median}

"""Training-time attacks as client behaviours (the `attack:` section; docs/robust.md "Attacks" says what each
kind does, and on which keys). The engine calls three hooks:
- `poison_of`: each mini-batch of an attacker's own training data (engine/local.py's `run_pass`); no random number
  is drawn, so every other draw of the run is the one of the run without the attack;
- `attack_uploads`: an attacker's reply before the server aggregates it (engine/rounds.py);
- `eval_split` / `attack_rows`: the backdoor's attack success rate on the honest clients' triggered test images,
  and the honest clients' mean and worst accuracy apart from the attackers' (metrics.jsonl's avg test row).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import Dataset

from fedhet.algorithms.base import own_aggregate
from fedhet.config import ServerConfig
from fedhet.config.attack import UPLOAD_KINDS, AttackConfig, TriggerConfig
from fedhet.config.sections import MAJORITY_RULES
from fedhet.core.contract import ServerState
from fedhet.core.dp import update_of
from fedhet.core.messages import Message, Reply
from fedhet.core.protocols import SampleSet
from fedhet.core.robust import rule_keys
from fedhet.core.seeding import numpy_rng
from fedhet.data import ClientData
from fedhet.data.show import split_labels
from fedhet.engine.experiment import Experiment
from fedhet.engine.rundir import last_avg_test_row, nan_mean
from fedhet.engine.sampling import sample_size
from fedhet.errors import ConfigError
from fedhet.yaml_input import JSONDict

TRIGGERED = "triggered"  # the evaluation split of the backdoor's honest clients (`eval_split`)
ASR = "attack_success_rate"
AVG_KEYS = ("honest_accuracy", "honest_worst_accuracy", "attacker_accuracy", ASR)  # on the avg test row
Poison = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Evaluate = Callable[[dict[int, Message], str], dict[str, dict[str, float]]]


@dataclass(frozen=True)
class Attack:
    """The run's attack: its config, the attacking clients (ids and names), the number of classes and the factor
    an attacker's upload multiplies its update by (None: the upload is left as it is)."""

    cfg: AttackConfig
    clients: tuple[int, ...]
    names: tuple[str, ...]
    num_classes: int
    upload_factor: float | None


def resolve_attack(exp: Experiment) -> Attack | None:
    """The run's attack (None without one), after the checks that need the federation: the attackers exist and
    train, the target and the permutation fit the classes, a backdoor has images, the method aggregates its shared
    model (for an upload attack), and the rule can outvote the attackers."""
    cfg, run = exp.config.attack, exp.config
    if not cfg.active:
        return None
    if exp.arrangement.pooled:
        raise ConfigError(f"attack.kind={cfg.kind}: method '{run.method}' trains one model on everyone's data, so no "
                          "client can attack; attack a federated method")
    train = exp.arrangement.train
    pool = exp.arrangement.pool(len(train))
    chosen = choose_attackers(cfg, run.seed, [c.name for c in train], pool)
    check_data(cfg, exp.data.modality, exp.data.num_classes, exp.data.input_shape)
    m = sample_size(len(pool), run.server.fraction_fit, run.server.min_fit_clients)
    factor = upload_factor(cfg, m / run.server.lr)
    if factor is not None and own_aggregate(exp.algorithm) and not exp.algorithm.shared_aggregation:
        raise ConfigError(f"attack.kind={cfg.kind} rewrites the shared model's upload, but method '{run.method}' "
                          "aggregates in its own way; attack it with label_flip or a backdoor with attack.boost=1")
    check_defense(run.server, min(len(chosen), m), m)
    return Attack(cfg, tuple(chosen), tuple(train[c].name for c in chosen), exp.data.num_classes, factor)


def choose_attackers(cfg: AttackConfig, seed: int, names: list[str], pool: list[int]) -> list[int]:
    """The attackers' client ids: `attack.clients` (ids or names) looked up, or round(fraction * N) of the N
    trainable clients drawn from the seed (at least one); at least one client stays honest."""
    if cfg.fraction is not None:
        count = max(1, round(cfg.fraction * len(pool)))
        chosen = sorted(int(c) for c in numpy_rng(seed, "attack").choice(pool, size=min(count, len(pool)),
                                                                         replace=False))
    else:
        chosen = sorted(lookup_client(c, names, pool) for c in cfg.clients)
    if len(chosen) >= len(pool):
        raise ConfigError(f"attack: all {len(pool)} training clients would attack, none is honest; name fewer "
                          "attack.clients or lower attack.fraction")
    return chosen


def lookup_client(client: int | str, names: list[str], pool: list[int]) -> int:
    """A client id of the federation from an id or a name; anything else is one ConfigError listing them."""
    cid = names.index(client) if isinstance(client, str) and client in names else client
    if not isinstance(cid, int) or cid not in pool:
        valid = ", ".join(f"{c} ({names[c]})" for c in pool)
        raise ConfigError(f"attack.clients: {client!r} is not a training client of this federation; its clients "
                          f"(id (name)): {valid}")
    return cid


def check_data(cfg: AttackConfig, modality: str, num_classes: int, input_shape: tuple[int, ...]) -> None:
    """The target class and the permutation fit the classes; a backdoor's trigger fits the images."""
    if cfg.permutation is not None and len(cfg.permutation) != num_classes:
        raise ConfigError(f"attack.permutation has {len(cfg.permutation)} entries; this dataset has {num_classes} "
                          "classes: give a permutation of 0..C-1")
    if cfg.kind != "backdoor":
        return
    if modality != "image":
        raise ConfigError(f"attack.kind=backdoor stamps a trigger patch on images, but this dataset's samples are "
                          f"{modality}; use an image dataset or attack with label_flip / sign_flip / scale")
    if not 0 <= cfg.target < num_classes:
        raise ConfigError(f"attack.target={cfg.target} is not a class of this dataset (0..{num_classes - 1})")
    if cfg.trigger.size > min(input_shape[-2:]):
        raise ConfigError(f"attack.trigger.size={cfg.trigger.size} is larger than the images "
                          f"({'x'.join(map(str, input_shape[-2:]))}); use a smaller patch")


def check_defense(server: ServerConfig, attackers: int, n: int) -> None:
    """The rule can outvote `attackers` of the `n` clients of a round (every attacker sampled: the worst round):
    the median and the geometric median need 2f < n, (multi-)Krum 2f + 2 < n, the trimmed mean f <= int(beta * n)."""
    rule = server.aggregation
    who = f"attack: {attackers} attackers among n={n} clients per round (every attacker sampled)"
    if rule in ("krum", "multi_krum") and not 2 * attackers + 2 < n:
        raise ConfigError(f"{who}, and server.aggregation {rule} needs 2f + 2 < n; sample more clients or name "
                          "fewer attackers")
    if rule == "trimmed_mean" and attackers > int(server.trim * n):
        raise ConfigError(f"{who}, more than the int(server.trim * n) = {int(server.trim * n)} values "
                          "server.aggregation trimmed_mean cuts from each end; raise server.trim (below 0.5) or name "
                          "fewer attackers")
    if rule in MAJORITY_RULES and not 2 * attackers < n:
        raise ConfigError(f"{who}: not a minority, and server.aggregation {rule} needs an honest majority (2f < n); "
                          "sample more clients or name fewer attackers (attack.clients, attack.fraction)")


def upload_factor(cfg: AttackConfig, replacement: float) -> float | None:
    """What an attacker's upload multiplies its update by: -k (sign_flip), k (scale), the boost (backdoor; null:
    `replacement`, n / eta); None when it uploads its update as it is."""
    if cfg.kind not in UPLOAD_KINDS:
        return None
    if cfg.kind == "backdoor":
        boost = replacement if cfg.boost is None else cfg.boost
        return None if boost == 1 else boost
    return -cfg.factor if cfg.kind == "sign_flip" else cfg.factor


# ---------------------------------------------------------------------------------------------- poisoned data
def flip_labels(y: torch.Tensor, num_classes: int, permutation: list[int] | None = None) -> torch.Tensor:
    """y -> C - 1 - y, or y -> permutation[y]."""
    if permutation is None:
        return num_classes - 1 - y
    return torch.tensor(permutation, dtype=y.dtype, device=y.device)[y]


def stamp(x: torch.Tensor, trigger: TriggerConfig) -> torch.Tensor:
    """A copy of images `x` (..., H, W) with the trigger's square patch of `trigger.value` in every channel."""
    out = x.clone()
    size = trigger.size
    rows = slice(-size, None) if trigger.position.startswith("bottom") else slice(0, size)
    cols = slice(-size, None) if trigger.position.endswith("right") else slice(0, size)
    out[..., rows, cols] = trigger.value
    return out


def backdoor_batch(x: torch.Tensor, y: torch.Tensor, cfg: AttackConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch with its first ceil(poison_fraction * B) images stamped and relabelled to the target (the batch is
    shuffled, so they are a random share of the attacker's images)."""
    k = math.ceil(cfg.poison_fraction * len(y))
    x, y = x.clone(), y.clone()
    x[:k] = stamp(x[:k], cfg.trigger)
    y[:k] = cfg.target
    return x, y


def poison_of(attack: Attack | None, cid: int) -> Poison | None:
    """What client `cid` does to each batch of its own training data (None: nothing, an honest client or an
    upload attack)."""
    if attack is None or cid not in attack.clients:
        return None
    cfg = attack.cfg
    if cfg.kind == "label_flip":
        return lambda x, y: (x, flip_labels(y, attack.num_classes, cfg.permutation))
    if cfg.kind == "backdoor":
        return lambda x, y: backdoor_batch(x, y, cfg)
    return None


# ---------------------------------------------------------------------------------------------- uploads
def attack_uploads(attack: Attack | None, server: ServerState, replies: list[Reply]) -> list[Reply]:
    """The replies as the server receives them: an attacker's shared floating-point arrays become
    global + factor * (its state - global)."""
    if attack is None or attack.upload_factor is None:
        return replies
    factor, current = attack.upload_factor, server.model
    keys = rule_keys(current)
    out = []
    for reply in replies:
        if reply.client_id in attack.clients:
            arrays = dict(reply.message.arrays)
            for k, update in update_of(arrays, current, keys).items():
                arrays[k] = (current[k].to(torch.float64) + factor * update).to(arrays[k].dtype)
            reply = replace(reply, message=replace(reply.message, arrays=arrays))
        out.append(reply)
    return out


# ---------------------------------------------------------------------------------------------- metrics
class Triggered(Dataset[Any]):  # Any: (image, label) samples as the base set's
    """A client's test images of another class than the target, stamped with the trigger and labelled the
    target: a model's accuracy on it is the attack success rate."""

    def __init__(self, base: SampleSet, cfg: AttackConfig) -> None:
        self.base, self.cfg = base, cfg
        self.keep = [i for i, y in enumerate(split_labels(base).tolist()) if y != cfg.target]

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, _ = self.base[self.keep[i]]
        return stamp(x, self.cfg.trigger), torch.tensor(self.cfg.target, dtype=torch.int64)


def eval_split(attack: Attack | None, client: ClientData, split: str) -> SampleSet | None:
    """A client's split to evaluate on: its own ('test', 'val'), or TRIGGERED, the backdoor's."""
    if split != TRIGGERED:
        return getattr(client, split)  # type: ignore[no-any-return]
    return Triggered(client.test, attack.cfg) if attack is not None and attack.cfg.kind == "backdoor" else None


def attack_rows(attack: Attack | None, rows: list[JSONDict], messages: dict[int, Message], evaluate: Evaluate
                ) -> list[JSONDict]:
    """A round's test rows with the attack's numbers: each honest client's attack success rate (backdoor) on its
    row; on the avg row the honest clients' mean and worst accuracy, the attackers' mean accuracy and the honest
    clients' mean attack success rate (a backdoor only)."""
    if attack is None:
        return rows
    honest = {cid: m for cid, m in messages.items() if cid not in attack.clients}
    success = evaluate(honest, TRIGGERED) if attack.cfg.kind == "backdoor" else {}
    out = [{**r, ASR: success[r["client"]]["accuracy"]} if r["client"] in success else r for r in rows]
    clients = [r for r in out if r["client"] != "avg" and not math.isnan(r["accuracy"])]
    good = [r["accuracy"] for r in clients if r["client"] not in attack.names]
    bad = [r["accuracy"] for r in clients if r["client"] in attack.names]
    values = {"honest_accuracy": nan_mean(good), "honest_worst_accuracy": min(good, default=math.nan),
              "attacker_accuracy": nan_mean(bad)}
    if success:
        values[ASR] = nan_mean([s["accuracy"] for s in success.values()])
    return [{**r, **values} if r["client"] == "avg" else r for r in out]


def attack_summary(attack: Attack, metrics: list[JSONDict]) -> JSONDict:
    """summary.json's `attack`: the kind, the attackers (drawn or named), and the last evaluated round's numbers."""
    last = last_avg_test_row(metrics) or {}
    return {"kind": attack.cfg.kind, "clients": list(attack.names), "client_ids": list(attack.clients),
            **{k: last[k] for k in AVG_KEYS if k in last}}

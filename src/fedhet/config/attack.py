"""The `attack` section: training-time attacks, some clients misbehaving while they train (docs/robust.md
"Attacks"); the behaviours are `fedhet.engine.attacks`.

The checks that need only the config are here; those that need the federation (a client id or name that is not
one of its clients, the target class out of range, a backdoor on data that are not images, attackers that are not
a minority under a rule that needs one) run when the run is built, before anything trains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhet.errors import ConfigError, nearest

ATTACK_KINDS = ("none", "label_flip", "sign_flip", "scale", "backdoor")
UPLOAD_KINDS = ("sign_flip", "scale", "backdoor")  # attacks that rewrite the upload (backdoor: its boost)
TRIGGER_POSITIONS = ("bottom_right", "bottom_left", "top_right", "top_left")


@dataclass
class TriggerConfig:
    """The backdoor's trigger: a square patch of one value stamped on the image."""

    size: int = 3  # side of the square patch in pixels
    value: float = 2.0  # the value written into every channel of the patch, in the model's input units (normalised)
    position: str = "bottom_right"  # bottom_right | bottom_left | top_right | top_left (a corner of the image)


@dataclass
class AttackConfig:
    """Attackers among the clients: they poison their training data (label_flip, backdoor) or rewrite the
    update they upload (sign_flip, scale, the backdoor's boost); personal parts are never touched."""

    kind: str = "none"  # none | label_flip | sign_flip | scale | backdoor
    clients: list[int | str] = field(default_factory=list)  # the attackers: client ids or names (or `fraction`)
    # or: this share of the clients are attackers, drawn from the run's seed (summary.json records which)
    fraction: float | None = None
    factor: float = 1.0  # k: sign_flip uploads global - k * update, scale uploads global + k * update
    permutation: list[int] | None = None  # label_flip: y -> permutation[y]; null: y -> C - 1 - y
    target: int = 0  # backdoor: the class a triggered image is relabelled to
    poison_fraction: float = 0.5  # backdoor: the share of each of the attacker's batches stamped and relabelled
    # backdoor: the model-replacement boost gamma, upload global + gamma * update (Bagdasaryan et al. 2020, Sec. 4);
    # 1: no boost; null: n / eta (n clients per round, eta = server.lr), which replaces the global model
    boost: float | None = 1.0
    trigger: TriggerConfig = field(default_factory=TriggerConfig)

    @property
    def active(self) -> bool:
        """Whether any client attacks."""
        return self.kind != "none"

    def validate(self, runtime: str = "inprocess") -> None:
        if self.kind not in ATTACK_KINDS:
            raise ConfigError(f"attack.kind must be one of {', '.join(ATTACK_KINDS)}, got {self.kind!r}"
                              f"{nearest(self.kind, ATTACK_KINDS)}")
        if not self.active:
            if self.clients or self.fraction is not None:
                raise ConfigError("attack.clients / attack.fraction are set but attack.kind is none: name the "
                                  f"attack ({', '.join(ATTACK_KINDS[1:])}) or drop them")
            return
        if runtime != "inprocess":
            raise ConfigError(f"attack.kind={self.kind} runs in process only (`fedhet run` with run.runtime=inprocess;"
                              f" the batched runtime trains clients together as lanes, Flower clients run their own "
                              f"code); got {runtime}: run it with run.runtime=inprocess")
        if bool(self.clients) == (self.fraction is not None):
            raise ConfigError("attack: give either attack.clients (ids or names) or attack.fraction (a share of the "
                              "clients drawn from the seed), not both and not neither")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise ConfigError(f"attack.fraction must be in (0, 1), got {self.fraction}")
        if len(set(map(str, self.clients))) != len(self.clients):
            raise ConfigError(f"attack.clients lists a client twice: {self.clients}")
        self._validate_kind()

    def _validate_kind(self) -> None:
        if not self.factor > 0:
            raise ConfigError(f"attack.factor (k) must be > 0, got {self.factor}")
        if self.kind == "scale" and self.factor == 1:
            raise ConfigError("attack.kind=scale with attack.factor=1 uploads the honest update; set attack.factor "
                              "(k != 1)")
        if self.permutation is not None and (self.kind != "label_flip" or
                                             sorted(self.permutation) != list(range(len(self.permutation)))):
            raise ConfigError(f"attack.permutation must be a permutation of 0..C-1 and is for attack.kind=label_flip "
                              f"only; got {self.permutation} with kind {self.kind}")
        if self.kind != "backdoor":
            return
        if not 0 < self.poison_fraction <= 1:
            raise ConfigError(f"attack.poison_fraction must be in (0, 1], got {self.poison_fraction}")
        if self.boost is not None and not self.boost > 0:
            raise ConfigError(f"attack.boost must be > 0 or null (n / eta), got {self.boost}")
        if self.target < 0:
            raise ConfigError(f"attack.target must be a class id >= 0, got {self.target}")
        if self.trigger.size < 1:
            raise ConfigError(f"attack.trigger.size must be >= 1 pixel, got {self.trigger.size}")
        if self.trigger.position not in TRIGGER_POSITIONS:
            raise ConfigError(f"attack.trigger.position must be one of {', '.join(TRIGGER_POSITIONS)}, got "
                              f"{self.trigger.position!r}")

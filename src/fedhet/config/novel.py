"""The `novel` section: clients held out of training, then adapted as newly joined sites (AdaptFED Sec. 4.2.6)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhet.errors import ConfigError

NOVEL_PARTS = ("auto", "embedding", "hypernetwork", "personal", "all")


@dataclass
class NovelConfig:
    """holdout: share of clients never sampled for training (seeded), or `clients` by name; after training each
    of them adapts `part` of the trained model on its own training split for `epochs` epochs (`fedhet adapt RUN`
    reruns this on a finished run). part: auto (the method's own: embedding for a hypernetwork, personal layers for
    a personalized method, else all) | embedding (AdaptFED / pFedHN: only z_new) | hypernetwork (phi and z_new) |
    personal (the parameters the method keeps local) | all. lr: None = train.lr. reach: epochs-to-reach counts the
    first epoch whose test accuracy is >= reach x the best of the adaptation."""

    holdout: float = 0.0  # share of the clients held out of training (chosen by seed); 0: none
    clients: list[str] = field(default_factory=list)  # or the held-out clients by name (not both)
    epochs: int = 10  # adaptation epochs of each held-out client after training
    part: str = "auto"  # what adapts: auto | embedding | hypernetwork | personal | all (see above)
    lr: float | None = None  # adaptation learning rate (null: train.lr)
    reach: float = 0.99  # epochs-to-reach: the first epoch with test accuracy >= reach x the adaptation's best

    @property
    def active(self) -> bool:
        """Whether any client is held out (otherwise the section changes nothing)."""
        return self.holdout > 0 or bool(self.clients)

    def validate(self) -> None:
        if not 0.0 <= self.holdout < 1.0:
            raise ConfigError(f"novel.holdout must be in [0, 1) (a share of the clients), got {self.holdout}")
        if self.holdout > 0 and self.clients:
            raise ConfigError("give novel.holdout (a share, chosen by seed) or novel.clients (names), not both")
        if self.epochs < 1:
            raise ConfigError(f"novel.epochs must be >= 1, got {self.epochs}")
        if self.part not in NOVEL_PARTS:
            raise ConfigError(f"novel.part must be one of {', '.join(NOVEL_PARTS)}, got {self.part!r}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"novel.lr must be > 0, got {self.lr}")
        if not 0.0 < self.reach <= 1.0:
            raise ConfigError(f"novel.reach must be in (0, 1], got {self.reach}")

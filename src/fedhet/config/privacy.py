"""The `privacy` section: client-level differential privacy (DP-FedAvg) of the shared model (docs/privacy.md).

Not to be confused with `fedhet privacy`, the membership-inference command: that attacks a finished run, this
section defends the run while it trains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhet.errors import ConfigError

DP_MODES = ("off", "server", "local")
ACCOUNTANTS = ("rdp", "pld")


@dataclass
class AdaptiveClipConfig:
    """Adaptive clipping (Andrew et al. 2021): the clip norm follows a quantile of the update norms."""

    enabled: bool = False  # true: privacy.dp.clip is the initial clip norm, moved each round towards the quantile
    target_quantile: float = 0.5  # gamma: the share of client updates meant to be left unclipped
    lr: float = 0.2  # eta: C <- C * exp(-eta * (b - gamma)), b the noised share of unclipped updates
    # sigma_b, the noise std of the unclipped-update count (null: m / 20, as Andrew et al. and Flower)
    count_noise_std: float | None = None


@dataclass
class DPConfig:
    """DP-FedAvg of the shared model: each sampled client's update clipped to L2 norm `clip`, averaged with equal
    weights, Gaussian noise of std noise_multiplier * clip / m on the average (server) or of std
    noise_multiplier * clip on each update before it is sent (local)."""

    mode: str = "off"  # off | server (noise on the aggregate) | local (each client noises its own update)
    clip: float = 1.0  # C: the L2 bound on each client's update of the shared keys (initial C when adaptive)
    noise_multiplier: float = 1.0  # sigma: the noise std in units of C
    delta: float = 1e-5  # the delta of the reported (epsilon, delta); must be < 1 / number of clients
    max_epsilon: float | None = None  # refuse (before it trains) the round that would spend more; null: no budget
    accountant: str = "rdp"  # rdp | pld (dp-accounting's; `pip install fedhet[privacy]`)
    adaptive: AdaptiveClipConfig = field(default_factory=AdaptiveClipConfig)

    @property
    def active(self) -> bool:
        """Whether the run is private at all."""
        return self.mode != "off"

    def validate(self) -> None:
        if self.mode not in DP_MODES:
            raise ConfigError(f"privacy.dp.mode must be one of {', '.join(DP_MODES)}, got {self.mode!r}")
        if not self.active:
            return
        if not self.clip > 0:
            raise ConfigError(f"privacy.dp.clip (the clip norm C) must be > 0, got {self.clip}")
        if not self.noise_multiplier > 0:
            raise ConfigError(f"privacy.dp.noise_multiplier (sigma) must be > 0, got {self.noise_multiplier}; "
                              "without noise there is no privacy: set privacy.dp.mode=off instead")
        if not 0 < self.delta < 1:
            raise ConfigError(f"privacy.dp.delta must be in (0, 1), got {self.delta}")
        if self.max_epsilon is not None and not self.max_epsilon > 0:
            raise ConfigError(f"privacy.dp.max_epsilon must be > 0 or null, got {self.max_epsilon}")
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"privacy.dp.accountant must be one of {', '.join(ACCOUNTANTS)}, got "
                              f"{self.accountant!r}")
        self._validate_adaptive()

    def _validate_adaptive(self) -> None:
        ada = self.adaptive
        if not 0 < ada.target_quantile < 1:
            raise ConfigError(f"privacy.dp.adaptive.target_quantile must be in (0, 1), got {ada.target_quantile}")
        if not ada.lr > 0:
            raise ConfigError(f"privacy.dp.adaptive.lr must be > 0, got {ada.lr}")
        if ada.count_noise_std is not None and not ada.count_noise_std > 0:
            raise ConfigError(f"privacy.dp.adaptive.count_noise_std must be > 0 or null, got {ada.count_noise_std}")
        if ada.enabled and self.mode == "local":
            raise ConfigError("privacy.dp.adaptive needs privacy.dp.mode=server (the clipped count is noised on the "
                              "server); with mode=local use a fixed privacy.dp.clip")

    def check_clients(self, num_clients: int) -> None:
        """delta < 1/N for N clients: a larger delta allows releasing one client's update outright."""
        if self.active and num_clients > 0 and self.delta >= 1 / num_clients:
            raise ConfigError(f"privacy.dp.delta={self.delta} is >= 1/N = 1/{num_clients} (N clients): such a "
                              f"delta permits leaking a whole client; set privacy.dp.delta below {1 / num_clients:g}")


@dataclass
class PrivacyConfig:
    """Defenses applied while training (docs/privacy.md "Differential privacy")."""

    dp: DPConfig = field(default_factory=DPConfig)

    def validate(self, aggregation: str = "weighted") -> None:
        """The section's values, and what of the run they need: the mean as the aggregation (a robust rule is not
        the clipped mean the accountant assumes). Every runtime applies it (in-process, batched, Flower: the
        server's step on fedhet's ServerApp, local noise on fedhet's ClientApp; docs/flower.md)."""
        self.dp.validate()
        if not self.dp.active:
            return
        if aggregation not in ("weighted", "uniform"):
            raise ConfigError(f"privacy.dp needs the mean of the clipped updates, but server.aggregation is "
                              f"{aggregation!r}; set server.aggregation=uniform (DP weights clients equally) or "
                              "privacy.dp.mode=off")

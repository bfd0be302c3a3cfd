"""FRAug's hyperparameters (`FRAug.Params`) and their checks; what each choice means: fedhet.algorithms.fraug."""

from __future__ import annotations

from dataclasses import dataclass

from fedhet.algorithms import fraug_losses as fl
from fedhet.errors import ConfigError

CHOICES = {"proto_mmd": ("prototype", "real"), "proto_init": ("first", "zeros"), "proto_absent": ("skip", "literal"),
           "class_reduction": ("mean", "sum"), "stage2_features": ("reuse", "recompute"),
           "proto_labels": fl.LABEL_DRAWS, "mmd_bandwidth": fl.BANDWIDTHS, "rt_input_c": fl.RT_INPUTS_C}

@dataclass
class FRAugParams:
    """Defaults: the appendix's Digits column (d_z 256, eta_g = eta_m = 0.005, alpha 1, beta 1.5, B_syn 64)."""

    z_dim: int = 256
    eta_g: float = 0.005
    eta_m: float = 0.005
    aux_momentum: float = 0.5
    alpha: float = 1.0
    beta: float = 1.5
    b_syn: int = 64
    b_syn_per_class: bool = False
    proto_labels: str = "rotate"
    lambda0: float = 0.3
    r0_frac: float = 0.05
    lambda_syn_rate: float = 0.01
    eps: float = 1e-6
    mmd_bandwidth: str = "pooled"
    mmd_sigma: float | None = None
    proto_mmd: str = "prototype"
    proto_init: str = "first"
    proto_absent: str = "skip"
    proto_persist: bool = True
    class_reduction: str = "mean"
    stage2_features: str = "reuse"
    rt_grad_to_generator: bool = False
    use_generator: bool = True
    use_rtnet: bool = True
    use_ema: bool = True
    rt_input_c: str = "batch"

    def validate(self) -> None:
        for key, choices in CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(f"fraug: {key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}")
        positive = {"z_dim": self.z_dim, "eta_g": self.eta_g, "eta_m": self.eta_m, "eps": self.eps}
        for key, value in positive.items():
            if not value > 0:
                raise ConfigError(f"fraug: {key} must be > 0, got {value}")
        if self.b_syn < 2:
            raise ConfigError(f"fraug: b_syn must be >= 2 (the generator has BatchNorm), got {self.b_syn}")
        if min(self.alpha, self.beta, self.lambda_syn_rate, self.r0_frac) < 0 or not 0 <= self.aux_momentum < 1:
            raise ConfigError("fraug: alpha, beta, lambda_syn_rate, r0_frac must be >= 0, aux_momentum in [0, 1)")
        if not 0 < self.lambda0 <= 1:
            raise ConfigError(f"fraug: lambda0 must be in (0, 1], got {self.lambda0}")
        self._validate_bandwidth()
        if not (self.use_generator or self.use_rtnet):
            raise ConfigError("fraug: use_generator and use_rtnet cannot both be false (no residuals; use fedbn)")

    def _validate_bandwidth(self) -> None:
        if self.mmd_bandwidth == "fixed" and (self.mmd_sigma is None or not self.mmd_sigma > 0):
            raise ConfigError(f"fraug: mmd_bandwidth fixed needs mmd_sigma > 0, got {self.mmd_sigma}")
        if self.mmd_bandwidth != "fixed" and self.mmd_sigma is not None:
            raise ConfigError(f"fraug: mmd_sigma is used only with mmd_bandwidth: fixed (got mmd_bandwidth "
                              f"{self.mmd_bandwidth!r}); set mmd_bandwidth=fixed or drop mmd_sigma")

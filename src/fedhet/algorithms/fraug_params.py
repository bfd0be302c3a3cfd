"""FRAug's hyperparameters (`FRAug.Params`), their presets and checks; what each choice means: fedhet.algorithms.fraug
and docs/fraug.md ("Paper vs official code vs fedhet").

Precedence: a key given in `method_args` > the `preset`'s value > the dataclass default. The defaults are the
official code's Digits setting (HaokunChen245/FRAug, main.py:75-99, the authors' numbers); `preset: paper` restores
fedhet's reading of the paper (the default before issue 37); `official-pacs` / `official-officehome` take main.py's
other columns. Where main.py grid-searches a value, the preset takes the grid value nearest the appendix's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fedhet.algorithms import fraug_losses as fl
from fedhet.errors import ConfigError

CHOICES = {"proto_mmd": ("prototype", "real"), "proto_init": ("first", "zeros"), "proto_absent": ("skip", "literal"),
           "class_reduction": ("mean", "sum"), "stage2_features": ("reuse", "recompute", "eval"),
           "proto_labels": fl.LABEL_DRAWS, "mmd_bandwidth": fl.BANDWIDTHS, "rt_input_c": fl.RT_INPUTS_C,
           "bn_share": ("affine", "none"), "aggregation": ("weighted", "uniform", "server"),
           "noise": ("uniform", "normal"), "gen_distance": fl.DISTANCES, "rt_distance": fl.DISTANCES,
           "gen_labels": ("balanced", "real"), "rt_scale": ("none", "lambda_syn"), "rt_form": ("batch", "per_class")}

# fedhet's reading of the paper + appendix Digits column (the default before issue 37)
PAPER: dict[str, Any] = {  # Any: field values of several types
    "eta_g": 0.005, "eta_m": 0.005, "alpha": 1.0, "beta": 1.5, "b_syn": 64, "lambda_syn_rate": 0.01,
    "r0_frac": 0.05, "proto_init": "first", "stage2_features": "reuse", "bn_share": "none", "aggregation": "server",
    "noise": "normal", "gen_distance": "mmd", "rt_distance": "mmd", "gen_labels": "real", "rt_label_input": False,
    "rt_scale": "lambda_syn", "rt_form": "per_class", "syn_mix_rate": None, "aux_eval": False}
PRESETS: dict[str, dict[str, Any]] = {  # Any: field values of several types
    "official": {},  # the defaults: main.py's Digits column
    "official-pacs": {"eta_g": 0.05, "eta_m": 0.05, "alpha": 10.0, "beta": 1.0, "lambda_syn_rate": 0.01,
                      "syn_mix_rate": 0.01, "gen_distance": "mmd_multi", "rt_distance": "l2"},
    "official-officehome": {"z_dim": 128, "eta_g": 0.05, "eta_m": 0.025, "alpha": 1.5, "beta": 1.25,
                            "lambda_syn_rate": 0.01, "syn_mix_rate": 0.01, "gen_distance": "mmd_multi",
                            "rt_distance": "mmd_multi"},
    "paper": PAPER,
}


@dataclass(init=False)
class FRAugParams:
    """Defaults = `preset: official`, the official code's Digits setting (HaokunChen245/FRAug main.py:75-99);
    presets `official-pacs`, `official-officehome`, `paper` (fedhet's reading of the paper, the default before
    issue 37). Keys given in method_args override the preset's values (docs/fraug.md)."""

    preset: str = "official"
    z_dim: int = 256
    eta_g: float = 0.025  # main.py:88 grid {0.05, 0.025}; appendix 0.005
    eta_m: float = 0.025  # main.py:89 grid {0.05, 0.025}; appendix 0.005
    aux_momentum: float = 0.5
    alpha: float = 1.0  # L_G_dist_lambda, main.py:90
    beta: float = 1.0  # L_FT_dist_lambda, main.py:91 grid {0.1, 1, 10}; appendix 1.5
    b_syn: int = 0  # 0: the real batch's size (official: batch_size fake samples, user_FRAug.py:155)
    b_syn_per_class: bool = False
    proto_labels: str = "rotate"
    lambda0: float = 0.3  # cls_mean_momentum, main.py:35
    r0_frac: float = 0.0  # official: constant EMA momentum (user_FRAug.py:103)
    lambda_syn_rate: float = 0.0  # feature interpolation rate; Digits: off (main.py:81), i.e. lam_syn = 1
    eps: float = 1e-6
    mmd_bandwidth: str = "pooled"
    mmd_sigma: float | None = None
    proto_mmd: str = "prototype"
    proto_init: str = "zeros"  # user_FRAug.py:61
    proto_absent: str = "skip"
    proto_persist: bool = True
    class_reduction: str = "mean"
    stage2_features: str = "eval"  # user_FRAug.py:197, 214-216, 256-257
    rt_grad_to_generator: bool = False
    use_generator: bool = True
    use_rtnet: bool = True
    use_ema: bool = True
    rt_input_c: str = "batch"
    bn_share: str = "affine"  # model_share no_bn_running_stats: main.py:77, server_base.py:78
    aggregation: str = "weighted"  # sample-size weights, server_base.py:53-66; "server": server.aggregation
    noise: str = "uniform"  # torch.rand, user_FRAug.py:157, 171, 206
    gen_distance: str = "l2"  # distance_metric_G, main.py:98
    rt_distance: str = "mmd_multi"  # distance_metric_FT, main.py:99
    gen_labels: str = "balanced"  # g trained on the rotated labels, user_FRAug.py:202-210
    rt_label_input: bool = True  # FTNet input [g(z, y), onehot(y)], networks.py:63-73
    rt_scale: str = "none"  # stage 2: u + m(.), unscaled (user_FRAug.py:244, 261)
    rt_form: str = "batch"  # L_FT on whole batches, halved over the two branches (user_FRAug.py:237-275)
    syn_mix_rate: float | None = 0.002  # stage 1 (1-w) CE_real + w CE_syn/2, w = min(0.5, exp(rate (r-R)))
    aux_eval: bool = True  # g and m in eval mode when not trained (user_FRAug.py:137-138, 231)

    def __init__(self, **kwargs: Any) -> None:  # Any: FRAugParams' fields
        """Keyword arguments only: given keys > the preset's values > the dataclass defaults."""
        names = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(f"FRAugParams got unknown keys {unknown}")
        preset = kwargs.get("preset", "official")
        if preset not in PRESETS:
            raise ConfigError(f"fraug: preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        values = {k: f.default for k, f in names.items()} | PRESETS[preset] | kwargs
        for key, value in values.items():
            setattr(self, key, value)

    def validate(self) -> None:
        """One ConfigError naming the first invalid key and its valid values."""
        for key, choices in CHOICES.items():
            if getattr(self, key) not in choices:
                raise ConfigError(f"fraug: {key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}")
        for key in ("z_dim", "eta_g", "eta_m", "eps"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"fraug: {key} must be > 0, got {getattr(self, key)}")
        if self.b_syn < 2 and self.b_syn != 0:
            raise ConfigError(f"fraug: b_syn must be >= 2 (the generator has BatchNorm) or 0 (the batch size), "
                              f"got {self.b_syn}")
        if min(self.alpha, self.beta, self.lambda_syn_rate, self.r0_frac) < 0 or not 0 <= self.aux_momentum < 1:
            raise ConfigError("fraug: alpha, beta, lambda_syn_rate, r0_frac must be >= 0, aux_momentum in [0, 1)")
        if self.syn_mix_rate is not None and self.syn_mix_rate < 0:
            raise ConfigError(f"fraug: syn_mix_rate must be >= 0 or null, got {self.syn_mix_rate}")
        if not 0 < self.lambda0 <= 1:
            raise ConfigError(f"fraug: lambda0 must be in (0, 1], got {self.lambda0}")
        if self.mmd_bandwidth == "fixed" and (self.mmd_sigma is None or not self.mmd_sigma > 0):
            raise ConfigError(f"fraug: mmd_bandwidth fixed needs mmd_sigma > 0, got {self.mmd_sigma}")
        if self.mmd_bandwidth != "fixed" and self.mmd_sigma is not None:
            raise ConfigError(f"fraug: mmd_sigma is used only with mmd_bandwidth: fixed (got mmd_bandwidth "
                              f"{self.mmd_bandwidth!r}); set mmd_bandwidth=fixed or drop mmd_sigma")
        if not (self.use_generator or self.use_rtnet):
            raise ConfigError("fraug: use_generator and use_rtnet cannot both be false (no residuals; use fedbn)")

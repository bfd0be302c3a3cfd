"""Bottleneck adapters (FedDAT Eq. 1) and the Dual-Adapter Teacher block (Eq. 4).

`BottleneckAdapter` is the residual-free branch phi(h W_down) W_up; `DualAdapter` holds up to three of them in
named slots and applies the chosen *path* with the residual:

- "shared":         h + A_s(h)                              (Eq. 1, the Adapter / FedAvg / deployed path)
- "dat":            h + w_s * Â_s(h) + w_c * A_c(h)         (Eq. 4, w_s = w_c = 1/2 by default)
- "client":         h + A_c(h)                              (Table 4: inference with A_c, teacher w/o Â_s)
- "frozen_shared":  h + Â_s(h)                              (Table 4: teacher w/o A_c)
- "none":           h                                       (the frozen backbone alone, clf / pretraining)

Â_s ("frozen_shared") is a copy of A_s whose parameters never require gradients.
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.errors import ConfigError

SHARED, FROZEN, CLIENT = "shared", "frozen_shared", "client"
SLOTS = (SHARED, FROZEN, CLIENT)
PATHS = ("shared", "dat", "client", "frozen_shared", "none")
INITS = ("bert", "near_identity", "torch")
_PATH_SLOTS = {"shared": (SHARED,), "dat": (FROZEN, CLIENT), "client": (CLIENT,), "frozen_shared": (FROZEN,),
               "none": ()}


def bottleneck_size(d: int, reduction: int) -> int:
    """r = d / reduction; a ConfigError unless `reduction` divides `d` (App. B.2: reduction factor 16)."""
    if isinstance(reduction, bool) or not isinstance(reduction, int) or reduction < 1:
        raise ConfigError(f"adapter reduction must be a positive integer, got {reduction!r}")
    if d % reduction:
        raise ConfigError(f"adapter reduction {reduction} does not divide the hidden size {d}")
    return d // reduction


def adapter_param_count(d: int, reduction: int = 16, bias: bool = True) -> int:
    """Parameters of one adapter: d*r + r*d (+ r + d biases); 12 x (d=768, r=48, biases) = 894,528."""
    r = bottleneck_size(d, reduction)
    return 2 * d * r + ((r + d) if bias else 0)


class BottleneckAdapter(nn.Module):
    """The branch phi(h W_down) W_up of Eq. 1 (phi = ReLU, App. B.2); the residual is added by `DualAdapter`.

    init: "bert" (default): weights N(0, 0.02), biases 0 -- the `adapters` library default the official code
    uses; "near_identity": like "bert" but W_up = 0, so the branch starts at 0 (Houlsby et al. 2019);
    "torch": PyTorch's default Linear init. The paper only says "randomly initialize".
    """

    def __init__(self, d: int, reduction: int = 16, bias: bool = True, init: str = "bert",
                 device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if init not in INITS:
            raise ConfigError(f"adapter init must be one of {', '.join(INITS)}, got {init!r}")
        r = bottleneck_size(d, reduction)
        self.down = nn.Linear(d, r, bias=bias, device=device, dtype=dtype)
        self.act = nn.ReLU()
        self.up = nn.Linear(r, d, bias=bias, device=device, dtype=dtype)
        self.reset_parameters(init)

    def reset_parameters(self, init: str = "bert") -> None:
        """Re-draw the weights with scheme `init` (see the class docstring); uses the global torch RNG."""
        if init == "torch":
            self.down.reset_parameters()
            self.up.reset_parameters()
            return
        for lin in (self.down, self.up):
            nn.init.normal_(lin.weight, std=0.02)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if init == "near_identity":
            nn.init.zeros_(self.up.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.up(self.act(self.down(h)))  # nn.Module calls are untyped in torch
        return out

    def forward_frozen(self, h: torch.Tensor) -> torch.Tensor:
        """The branch with detached weights: gradients reach h, never these parameters (Â_s)."""
        z = nn.functional.linear(h, self.down.weight.detach(), _detach(self.down.bias))
        return nn.functional.linear(self.act(z), self.up.weight.detach(), _detach(self.up.bias))


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


class DualAdapter(nn.Module):
    """Adapter slots after one FFN output with a path switch; dual=False holds A_s only (Adapter baselines).

    `dat_weights` = (w_s, w_c), the Eq. 4 mix of Â_s and A_c; the paper and the official code fix (1/2, 1/2).
    """

    def __init__(self, d: int, reduction: int = 16, *, dual: bool = True, bias: bool = True, init: str = "bert",
                 dat_weights: tuple[float, float] = (0.5, 0.5), device: torch.device | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.d = int(d)
        names = SLOTS if dual else (SHARED,)
        self.slots = nn.ModuleDict({n: BottleneckAdapter(d, reduction, bias, init, device, dtype) for n in names})
        if dual:
            self.slots[FROZEN].load_state_dict(self.slots[SHARED].state_dict())
            self.slots[FROZEN].requires_grad_(False)
        self.path = "shared"
        self.dat_weights = (float(dat_weights[0]), float(dat_weights[1]))

    @property
    def dual(self) -> bool:
        return CLIENT in self.slots

    def set_path(self, path: str) -> None:
        """Select the path (see the module docstring); a ConfigError for an unknown one or a missing slot."""
        if path not in PATHS:
            raise ConfigError(f"unknown adapter path {path!r}; valid: {', '.join(PATHS)}")
        missing = [s for s in _PATH_SLOTS[path] if s not in self.slots]
        if missing:
            raise ConfigError(f"adapter path {path!r} needs the dual adapters (insert_adapters(..., dual=True))")
        self.path = path

    def refresh_frozen(self) -> None:
        """Â_s <- A_s (Alg. 1, start of ClientUpdate); Â_s stays frozen."""
        if not self.dual:
            raise ConfigError("refresh_frozen_copy needs the dual adapters (insert_adapters(..., dual=True))")
        with torch.no_grad():
            for dst, src in zip(self.slots[FROZEN].parameters(), self.slots[SHARED].parameters(), strict=True):
                dst.copy_(src)
        self.slots[FROZEN].requires_grad_(False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.path == "shared":
            out: torch.Tensor = h + self.slots[SHARED](h)  # nn.Module calls are untyped in torch
            return out
        if self.path == "dat":
            w_s, w_c = self.dat_weights
            # nn.Module calls are untyped in torch
            mixed: torch.Tensor = h + w_s * self._frozen(h) + w_c * self.slots[CLIENT](h)
            return mixed
        if self.path == "frozen_shared":
            return h + self._frozen(h)
        if self.path == "client":
            own: torch.Tensor = h + self.slots[CLIENT](h)  # nn.Module calls are untyped in torch
            return own
        return h

    def _frozen(self, h: torch.Tensor) -> torch.Tensor:
        frozen: BottleneckAdapter = self.slots[FROZEN]  # type: ignore[assignment]
        return frozen.forward_frozen(h)

    def extra_repr(self) -> str:
        return f"path={self.path!r}, dat_weights={self.dat_weights}"

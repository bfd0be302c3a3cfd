"""Can Eq. (6)'s beta * MMD term hold back the RTNet's residual? A stage-2-only simulation per MMD bandwidth.

FRAug's RTNet ends in a BatchNorm without activation, so at initialisation its residual has norm ~ sqrt(d_u),
larger than the real embeddings u. This script trains only the RTNet (Eq. 6 without the prototype terms,
lambda_syn = 1) for as many steps as the paper's schedule gives it (R = 200 rounds x T = 10 steps = 2000), on
synthetic class-structured embeddings of about PACS's scale (|u| ~ 12, median pairwise distance ~ 15 at
d_u = 1280), a frozen generator at initialisation and a fixed linear head fitted on u, with the appendix's PACS
settings (eta_m = 0.05, momentum 0.5, beta = 1.25, B = 16, d_z = 256). It records the mean residual norm and
the MMD term every `--every` steps for each bandwidth: `real`, `pooled`, and fixed sigmas.

    python benchmarks/fraug_rtnet_scale.py --out docs/results/fraug/rtnet_scale.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedhet.algorithms import fraug_losses as fl
from fedhet.models.fraug_nets import Generator, RTNet

C, B, Z_DIM = 7, 16, 256


def simulate(dim: int, how: str, sigma: float | None, steps: int, every: int) -> list[dict[str, float]]:
    torch.manual_seed(0)
    means = 0.35 * torch.randn(C, dim)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(C, (B,))
        return (means[y] + 0.35 * torch.randn(B, dim)).relu(), y

    head = torch.nn.Linear(dim, C)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for _ in range(200):
        u, y = batch()
        opt.zero_grad()
        F.cross_entropy(head(u), y).backward()
        opt.step()
    head.requires_grad_(False)
    torch.manual_seed(1)
    gen, rt = Generator(Z_DIM, C, dim), RTNet(dim, Z_DIM)
    opt = torch.optim.SGD(rt.parameters(), lr=0.05, momentum=0.5)
    none = torch.zeros(0, dtype=torch.long)
    trace = []
    for step in range(steps + 1):
        u, y = batch()
        with torch.no_grad():
            v = gen(torch.randn(B, Z_DIM), y)
        res = rt(v)
        s = fl.mmd_bandwidth(u, how, sigma)
        loss = fl.rtnet_loss(head, u, y, u + res, u[:0], none, None, 1.25, s)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            with torch.no_grad():
                used = fl.median_heuristic_sigma(u + res, u) if s is None else s
                trace.append({"step": step, "res_norm": res.norm(dim=1).mean().item(),
                              "u_norm": u.norm(dim=1).mean().item(), "sigma": float(used),
                              "mmd": fl.gaussian_mmd(u + res, u, s).item()})
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--sigmas", default="10,80", help="fixed bandwidths to try, comma-separated")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    choices: list[tuple[str, float | None]] = [("real", None), ("pooled", None)]
    choices += [("fixed", float(s)) for s in args.sigmas.split(",") if s]
    runs: dict[str, Any] = {}
    for how, sigma in choices:
        runs[how if sigma is None else f"fixed {sigma:g}"] = simulate(args.dim, how, sigma, args.steps, args.every)
    Path(args.out).write_text(json.dumps({"dim": args.dim, "steps": args.steps, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()

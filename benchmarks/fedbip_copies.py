"""How different FedBiP's copies of one upload are (issue 37): for every generated set in a FedBiP cache folder,
the mean |pixel| difference (images in [0, 1]) between copy 0 and copy 1 of the same uploaded latent, against
the difference between two uploaded latents of the same class within copy 0. With `start_latent: upload` the
issue measured 0.004 against 0.22 (copies nearly identical); `fresh` should bring the first up to the second.

    python benchmarks/fedbip_copies.py runs/fedbip_cache
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def copy_images(folder: Path, copy: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(images float in [0, 1], labels) of one copy of a cached set, or None when a part is missing."""
    parts = sorted(folder.glob(f"copy{copy:03d}_part*.pt"))
    if not parts:
        return None
    saved = [torch.load(p, weights_only=True) for p in parts]
    return torch.cat([s["images"] for s in saved]).float() / 255, torch.cat([s["labels"] for s in saved])


def distances(folder: Path) -> tuple[float, float, int] | None:
    """(copies of one latent, two latents of a class, N) of a cached set with at least two copies."""
    first, second = copy_images(folder, 0), copy_images(folder, 1)
    if first is None or second is None or len(first[1]) != len(second[1]):
        return None
    (x0, y), (x1, _) = first, second
    copies = float((x0 - x1).abs().mean())
    pairs = []
    for c in y.unique().tolist():
        members = x0[y == c]
        if len(members) > 1:
            d = (members[:, None] - members[None]).abs().flatten(2).mean(-1)
            pairs.append(d[~torch.eye(len(members), dtype=torch.bool)])
    return copies, float(torch.cat(pairs).mean()) if pairs else float("nan"), len(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path)
    args = parser.parse_args()
    print("| set | N | copy 0 vs copy 1 (same latent) | two latents of a class |\n|---|---|---|---|")
    for folder in sorted(p for p in args.cache.iterdir() if p.is_dir() and p.name != "uploads"):
        found = distances(folder)
        if found is not None:
            print(f"| {folder.name} | {found[2]} | {found[0]:.3f} | {found[1]:.3f} |")


if __name__ == "__main__":
    main()

"""FedBiP's generation switches on the LDM pretrained here (docs/results/fedbip.md, "Injection mode and guidance"):
for every feature-shift client of configs/fedbip/common.yaml, one real image per class, then images generated
from the client's z(T) (seed 0) with S and V learned in `token` and `output` mode (Adam lr 0.1, 30 epochs, App. A),
each at guidance 7.5 (the official code's) and 1 (none), and the prompt with the words' vectors at guidance 7.5.
Prints the learned vectors' norms next to the words' ones and writes one PNG grid (rows in that order).

    FEDHET_DATA=../shared/data python benchmarks/fedbip_guidance.py --out docs/images/fedbip_guidance.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torchvision.utils import save_image

from fedhet.algorithms.fedbip import load_split
from fedhet.algorithms.fedbip_parts import ImageFormat
from fedhet.config import load_config
from fedhet.data import build_federated_data
from fedhet.models.ldm import FedBiPUpload, GenerationConfig, PromptEncoder, generate, instance_latents, load_components
from fedhet.models.ldm.concepts import ConceptConfig, init_concepts, learn_concepts


def client_rows(parts: object, images: torch.Tensor, labels: torch.Tensor, words: dict[str, str],
                name: str) -> list[torch.Tensor]:
    """The real row, then token / output mode at guidance 7.5 and 1, then the words at 7.5, for one client."""
    g = torch.Generator().manual_seed(0)
    z0, z_t = instance_latents(parts, images, labels, g)  # type: ignore[arg-type]
    idx = torch.stack([(labels == k).nonzero()[0, 0] for k in range(10)])
    rows = [images[idx]]
    for mode in ("token", "output"):
        enc = PromptEncoder(parts, n_domain=1, n_class=1, mode=mode)  # type: ignore[arg-type]
        learned, losses = learn_concepts(enc, init_concepts(enc, 10, g, "random"), z0, labels,
                                         ConceptConfig(epochs=30, lr=0.1), g)
        fixed = init_concepts(enc, 10, g, "words", words.get(name, name), [str(k) for k in range(10)])
        print(f"{name} {mode}: loss {sum(losses[:20]) / 20:.3f} -> {sum(losses[-20:]) / 20:.3f}; |S| learned "
              f"{learned.domain.norm():.1f} vs word {fixed.domain.norm():.1f}, mean |V_y| learned "
              f"{learned.classes.norm(dim=-1).mean():.1f} vs word {fixed.classes.norm(dim=-1).mean():.1f}")
        runs = [(learned, 7.5), (learned, 1.0)] + ([(fixed, 7.5)] if mode == "output" else [])
        for concepts, scale in runs:
            upload = FedBiPUpload(z_t[idx], labels[idx], concepts.domain, concepts.classes)
            config = GenerationConfig(steps=20, spacing="trailing", guidance_scale=scale)
            rows.append(generate(enc, upload, config, torch.Generator().manual_seed(0))[0])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ldm", default="runs/ldm32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config("configs/fedbip/common.yaml", [])
    words = dict(cfg.method_args.get("domain_words", {}))
    parts = load_components(args.ldm)
    rows = []
    for client in build_federated_data(cfg.data, cfg.seed).clients:
        x, y = load_split(client.train_eval)
        rows += client_rows(parts, ImageFormat.of("imagenet").to_ldm(x, 32), y, words, client.domain)
    save_image(torch.cat(rows), args.out, nrow=10, padding=1)
    print(f"grid: {args.out} (per client: real, token 7.5, token 1, output 7.5, output 1, words 7.5)")


if __name__ == "__main__":
    main()

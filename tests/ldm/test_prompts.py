"""Prompt templates, slot positions from the tokenizer, and the two concept-injection modes."""

from __future__ import annotations

import pytest
import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm import LDMComponents, PromptEncoder, build_layout, init_concepts
from fedhet.models.ldm.prompts import template_segments


@pytest.mark.parametrize(("template", "message"), [
    ("a photo of a {class}", "no {domain}"),
    ("a {domain} style", "no {class}"),
    ("a photo", "no {domain}"),
    ("a {domain} {domain} of a {class}", "2 {domain}"),
    ("a {style} of a {class} in {domain}", "unknown placeholder"),
    ("a {} of {class} {domain}", "unknown placeholder"),
    ("a {domain of {class}", "malformed"),
])
def test_templates_without_both_placeholders_are_rejected(template: str, message: str) -> None:
    with pytest.raises(FedhetError, match=message.replace("{", r"\{").replace("}", r"\}")):
        template_segments(template)


def test_positions_come_from_the_tokenizer(clip_parts: LDMComponents) -> None:
    tok = clip_parts.tokenizer
    lay = build_layout("a quickdraw {domain} style of a {class}, drawn", tok, 2, 3, max_length=77)
    tokens = tok.convert_ids_to_tokens(lay.input_ids.tolist())
    assert tokens == ["[CLS]", "a", "quick", "##dra", "##w", "x", "x", "style", "of", "a", "x", "x", "x", ",",
                      "drawn", "[SEP]"]
    assert lay.domain_positions.tolist() == [5, 6] and lay.class_positions.tolist() == [10, 11, 12]
    assert lay.attention_mask.tolist() == [1] * 16
    first = build_layout("the {class} in {domain} style", tok, 1, 2, max_length=77)  # class before domain
    assert first.class_positions.tolist() == [2, 3] and first.domain_positions.tolist() == [5]


def test_padding_and_length_limits(clip_parts: LDMComponents) -> None:
    tok = clip_parts.tokenizer
    lay = build_layout("a {domain} style of a {class}", tok, 1, 1, max_length=77, pad_to=12)
    assert lay.length == 12 and lay.attention_mask.tolist() == [1] * 8 + [0] * 4
    assert lay.input_ids[8:].tolist() == [tok.pad_token_id] * 4
    with pytest.raises(FedhetError, match="at most 6"):
        build_layout("a {domain} style of a {class}", tok, 1, 1, max_length=6)
    with pytest.raises(FedhetError, match="separate words"):
        build_layout("a {domain}s style of a {class}", tok, 1, 1, max_length=77)
    with pytest.raises(FedhetError, match="one token"):
        build_layout("a {domain} style of a {class}", tok, 1, 1, max_length=77, filler="quickdraw")
    with pytest.raises(FedhetError, match=">= 1"):
        build_layout("a {domain} style of a {class}", tok, 0, 1, max_length=77)


def _concepts(enc: PromptEncoder, b: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n_s, n_v = len(enc.layout.domain_positions), len(enc.layout.class_positions)
    return torch.randn(b, n_s, enc.vector_dim, generator=g), torch.randn(b, n_v, enc.vector_dim, generator=g)


def test_token_mode_replaces_input_embeddings_at_the_slots(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts, "a quickdraw {domain} style of a {class}", n_domain=2, n_class=1, mode="token")
    domain, classes = _concepts(enc, 2)
    seen: list[torch.Tensor] = []
    embeddings = clip_parts.text_encoder.embeddings  # CLIPTextEmbeddings: token + position
    handle = embeddings.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    try:
        enc.encode(domain, classes)
    finally:
        handle.remove()
    lay, table = enc.layout, clip_parts.text_encoder.get_input_embeddings().weight
    pos = embeddings.position_embedding.weight[: lay.length]
    expected = (table[lay.input_ids] + pos).expand(2, -1, -1).clone()
    expected[:, lay.domain_positions] = domain + pos[lay.domain_positions]
    expected[:, lay.class_positions] = classes + pos[lay.class_positions]
    assert torch.allclose(seen[0], expected, atol=1e-6)


def test_token_mode_is_identity_for_the_fillers_own_embedding(parts: LDMComponents) -> None:
    enc = PromptEncoder(parts, "a {domain} style of a {class}, drawn", n_domain=2, n_class=2, mode="token")
    filler = parts.text_encoder.get_input_embeddings().weight[enc.layout.input_ids[enc.layout.domain_positions[0]]]
    same = enc.encode(filler.expand(1, 2, -1), filler.expand(1, 2, -1))
    plain = enc.run(enc.layout.input_ids[None], enc.layout.attention_mask[None])
    assert torch.allclose(same, plain, atol=1e-5)


def test_causal_encoder_changes_only_from_the_first_slot_on(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts, "a quickdraw {domain} style of a {class}", mode="token")
    plain = enc.run(enc.layout.input_ids[None], enc.layout.attention_mask[None])[0]
    out = enc.encode(*_concepts(enc, 1))[0]
    first = int(enc.layout.domain_positions[0])
    assert torch.allclose(out[:first], plain[:first], atol=1e-6)
    assert ((out[first:] - plain[first:]).abs().amax(dim=1) > 1e-4).all()


def test_output_mode_overwrites_exactly_the_slot_states(parts: LDMComponents) -> None:
    enc = PromptEncoder(parts, "a {domain} style of a {class}, drawn", n_domain=1, n_class=2, mode="output")
    domain, classes = _concepts(enc, 3)
    out = enc.encode(domain, classes)
    lay = enc.layout
    plain = enc.run(lay.input_ids[None], lay.attention_mask[None])[0]
    assert torch.equal(out[:, lay.domain_positions], domain) and torch.equal(out[:, lay.class_positions], classes)
    others = [i for i in range(lay.length) if i not in lay.domain_positions.tolist() + lay.class_positions.tolist()]
    assert torch.allclose(out[:, others], plain[others].expand(3, -1, -1), atol=1e-6)


def test_encode_labels_gathers_each_samples_class(parts: LDMComponents) -> None:
    enc = PromptEncoder(parts, mode="token")
    g = torch.Generator().manual_seed(0)
    domain, classes = torch.randn(1, parts.token_dim, generator=g), torch.randn(4, 1, parts.token_dim, generator=g)
    labels = torch.tensor([3, 0, 3, 2])
    out = enc.encode_labels(domain, classes, labels)
    direct = enc.encode(domain.expand(4, -1, -1), classes[labels])
    assert torch.allclose(out, direct, atol=1e-6)
    assert not torch.allclose(out[0], out[1], atol=1e-4)


@pytest.mark.parametrize("mode", ["token", "output"])
def test_gradients_reach_the_concepts_and_not_the_encoder(parts: LDMComponents, mode: str) -> None:
    enc = PromptEncoder(parts, mode=mode)
    domain, classes = (t.requires_grad_(True) for t in _concepts(enc, 2))
    enc.encode(domain, classes).square().sum().backward()
    assert domain.grad is not None and domain.grad.abs().sum() > 0
    assert classes.grad is not None and classes.grad.abs().sum() > 0
    assert all(p.grad is None for p in parts.text_encoder.parameters())


def test_wrong_concept_shapes_are_rejected(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts, n_domain=2)
    with pytest.raises(FedhetError, match=r"S \(B, 2, 32\)"):
        enc.encode(torch.zeros(1, 1, 32), torch.zeros(1, 1, 32))
    with pytest.raises(FedhetError, match="injection mode"):
        PromptEncoder(clip_parts, mode="input")


def test_words_init_starts_from_the_real_names(clip_parts: LDMComponents) -> None:
    tok, g = clip_parts.tokenizer, torch.Generator().manual_seed(0)
    token = PromptEncoder(clip_parts, n_domain=2, n_class=3, mode="token")
    start = init_concepts(token, 2, g, "words", "quickdraw", ["dog", "basketball"])
    table = clip_parts.text_encoder.get_input_embeddings().weight
    quick, dra = tok.convert_tokens_to_ids(["quick", "##dra"])
    assert torch.equal(start.domain, table[[quick, dra]])  # first n_s of quick ##dra ##w
    assert torch.equal(start.classes[0], table[[tok.convert_tokens_to_ids("dog")] * 3])  # one token, repeated
    output = PromptEncoder(clip_parts, n_domain=1, n_class=1, mode="output")
    start = init_concepts(output, 2, g, "words", "sketch", ["dog", "basketball"])
    real = output.run(tok("a sketch style of a basketball", return_tensors="pt")["input_ids"],
                      torch.ones(1, 8, dtype=torch.long))[0]
    assert torch.allclose(start.domain[0], real[2], atol=1e-6) and torch.allclose(start.classes[1, 0], real[6])
    with pytest.raises(FedhetError, match="class_names"):
        init_concepts(output, 3, g, "words", "sketch", ["dog"])


def test_random_init_has_the_slots_scale(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts, mode="token")
    start = init_concepts(enc, 50, torch.Generator().manual_seed(0), "random")
    target = clip_parts.text_encoder.get_input_embeddings().weight.std().item()
    assert start.classes.shape == (50, 1, 32) and abs(start.classes.std().item() / target - 1) < 0.1

"""FedBiP's prompt τ_θ(S, V_y): a template whose placeholders carry learned concept vectors (spec §2.2 (b), §2.4).

A template names `{domain}` and `{class}` once each, e.g. "a {domain} style of a {class}" (Alg. 1, §4.2.2 and the
official code) or "a {domain} of {class}." (Table 5); a template without both, with a placeholder twice or with
another `{field}` is a FedhetError. The domain concept S ∈ ℝ^{n_s×d} fills the `{domain}` slot, the class concept
V_y ∈ ℝ^{n_v×d} the `{class}` slot.

Positions come from the tokenizer, not from string offsets: the token ids are built piece by piece,
[specials] tok(text before) slot tok(text between) slot tok(text after) [specials], where each slot is n tokens of
a one-token filler word ("x", as the official code's "a X style of a X"), and the result must equal the tokenizer's
own encoding of the filled-in prompt (else a FedhetError: a placeholder glued to other characters, e.g.
"{domain}s", would tokenize differently). So a template word of several word pieces (e.g. "quickdraw" -> quick
##dra ##w) shifts the positions correctly, and a slot always has exactly n_s / n_v positions. `layout_of` builds
the same layout around real words (each slot = that word's tokens): the "words" initialisation uses it.

Two injection modes (`mode`), both frozen-encoder, gradients only into S and V:
- "token" (the paper, §4.2.2: S and V are "token embeddings" of dimension d_w substituted into the prompt):
  the vectors replace the *input token embeddings* at the slot positions (a forward hook on the encoder's input
  embedding layer), then positions, attention and every layer of τ_θ run on them (textual-inversion style).
- "output" (the official code): τ_θ encodes the filler prompt, then its *output hidden states* at the slot
  positions are overwritten by S and V (d = the encoder's hidden size); the other states stay as encoded.
Prompts are not padded by default (the official code pads to the longest prompt, all of equal length); `pad_to`
pads to a fixed length (Stable Diffusion's pipeline pads to 77). The unconditional prompt of classifier-free
guidance is "" padded to the same length (as diffusers' pipeline does with given prompt embeddings).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.components import LDMComponents

PLACEHOLDERS = ("domain", "class")
MODES = ("token", "output")
PAPER_TEMPLATE = "a {domain} style of a {class}"
TABLE5_TEMPLATE = "a {domain} of {class}."


def template_segments(template: str) -> list[tuple[str, str | None]]:
    """[(literal text, placeholder or None)] of a template; a FedhetError unless it names {domain} and {class}
    exactly once each and nothing else."""
    try:
        parsed = [(lit, field) for lit, field, _, _ in string.Formatter().parse(template)]
    except ValueError as e:
        raise FedhetError(f"prompt template '{template}' is malformed ({e}); write e.g. '{PAPER_TEMPLATE}'") from e
    fields = [f for _, f in parsed if f is not None]
    unknown = sorted({f for f in fields if f not in PLACEHOLDERS})
    if unknown:
        raise FedhetError(f"prompt template '{template}' has unknown placeholder(s) {unknown}; only {{domain}} and "
                          f"{{class}} are filled (write a literal brace as '{{{{')")
    for name in PLACEHOLDERS:
        if fields.count(name) != 1:
            what = "no" if name not in fields else f"{fields.count(name)}"
            raise FedhetError(f"prompt template '{template}' has {what} {{{name}}} placeholder(s): a FedBiP template "
                              f"names {{domain}} and {{class}} once each, e.g. '{PAPER_TEMPLATE}'")
    return [(lit, f or None) for lit, f in parsed]


@dataclass(frozen=True)
class PromptLayout:
    """Token ids (L,), attention mask (L,) and the slot positions of S (n_s,) and V_y (n_v,)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    domain_positions: torch.Tensor
    class_positions: torch.Tensor

    @property
    def length(self) -> int:
        """L, the prompt length in tokens (with specials and padding)."""
        return int(self.input_ids.shape[0])


def _pieces(tokenizer: Any, text: str) -> list[int]:  # Any: untyped tokenizer
    """Token ids of `text` without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _special_frame(tokenizer: Any) -> tuple[list[int], list[int]]:  # Any: untyped tokenizer
    """(head, tail): the special tokens the tokenizer puts before and after a text ([CLS]/[SEP], BOS/EOS)."""
    full, bare = list(tokenizer("x")["input_ids"]), _pieces(tokenizer, "x")
    for k in range(len(full) - len(bare) + 1):
        if full[k:k + len(bare)] == bare:
            return full[:k], full[k + len(bare):]
    raise FedhetError("the tokenizer's special-token frame could not be found (it rewrites plain words)")


def layout_of(template: str, tokenizer: Any, domain_text: str,  # Any: untyped tokenizer
              class_text: str, max_length: int, pad_to: int | None = None) -> PromptLayout:
    """The layout of `template` filled with `domain_text` / `class_text`, slot positions = those words' tokens."""
    segments, (head, tail) = template_segments(template), _special_frame(tokenizer)
    ids, spans = list(head), {}
    for literal, field in segments:
        ids += _pieces(tokenizer, literal)
        if field is not None:
            words = _pieces(tokenizer, domain_text if field == "domain" else class_text)
            spans[field] = list(range(len(ids), len(ids) + len(words)))
            ids += words
    ids += tail
    filled = template.format(**{"domain": domain_text, "class": class_text})
    if ids != list(tokenizer(filled)["input_ids"]):
        raise FedhetError(f"prompt template '{template}': the placeholders must stand as separate words (the "
                          f"tokenizer encodes '{filled}' differently from its pieces); put spaces around them")
    if len(ids) > max_length:
        raise FedhetError(f"the prompt '{filled}' has {len(ids)} tokens; the text encoder takes at most {max_length}")
    mask = [1] * len(ids)
    if pad_to is not None:
        if pad_to < len(ids) or pad_to > max_length or tokenizer.pad_token_id is None:
            raise FedhetError(f"cannot pad the {len(ids)}-token prompt to {pad_to} (limit {max_length}, pad token "
                              f"{tokenizer.pad_token_id})")
        mask += [0] * (pad_to - len(ids))
        ids += [int(tokenizer.pad_token_id)] * (pad_to - len(ids))
    return PromptLayout(torch.tensor(ids), torch.tensor(mask), torch.tensor(spans["domain"], dtype=torch.long),
                        torch.tensor(spans["class"], dtype=torch.long))


def build_layout(template: str, tokenizer: Any, n_domain: int, n_class: int, max_length: int,  # Any: untyped tokenizer
                 pad_to: int | None = None, filler: str = "x") -> PromptLayout:
    """The training/generation layout: n_domain and n_class one-token `filler` slots (n_s, n_v of Table 5)."""
    if n_domain < 1 or n_class < 1:
        raise FedhetError(f"n_domain and n_class (n_s, n_v) must be >= 1, got {n_domain} and {n_class}")
    if len(_pieces(tokenizer, filler)) != 1:
        raise FedhetError(f"the filler word '{filler}' must be one token for this tokenizer, got "
                          f"{len(_pieces(tokenizer, filler))}")
    return layout_of(template, tokenizer, " ".join([filler] * n_domain), " ".join([filler] * n_class),
                     max_length, pad_to)


def inject(states: torch.Tensor, layout: PromptLayout, domain: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """A copy of `states` (B, L, d) with S (B, n_s, d) at the domain slot and V_y (B, n_v, d) at the class slot."""
    out = states.clone()
    out[:, layout.domain_positions.to(out.device)] = domain.to(out.device, out.dtype)
    out[:, layout.class_positions.to(out.device)] = classes.to(out.device, out.dtype)
    return out


class PromptEncoder:
    """τ_θ(S, V_y) for one template and injection `mode` ("token" | "output"), on frozen LDMComponents."""

    def __init__(self, parts: LDMComponents, template: str = PAPER_TEMPLATE, n_domain: int = 1, n_class: int = 1,
                 mode: str = "token", pad_to: int | None = None, filler: str = "x") -> None:
        if mode not in MODES:
            raise FedhetError(f"unknown injection mode '{mode}'; valid: {', '.join(MODES)} (token: the paper's "
                              "input token embeddings; output: the official code's output states)")
        self.parts, self.template, self.mode, self.pad_to = parts, template, mode, pad_to
        self.layout = build_layout(template, parts.tokenizer, n_domain, n_class, parts.max_length, pad_to, filler)

    @property
    def vector_dim(self) -> int:
        """d of S and V: d_w (input embeddings) for "token", the hidden size for "output"."""
        return self.parts.token_dim if self.mode == "token" else self.parts.text_dim

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """τ_θ's last hidden states (B, L, D) of token ids (B, L), with no injection."""
        parts = self.parts
        mask = attention_mask.to(parts.device) if parts.text_uses_mask else None
        return parts.text_encoder(input_ids=input_ids.to(parts.device), attention_mask=mask)[0]  # type: ignore[no-any-return]

    def encode(self, domain: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """τ_θ(S, V_y) (B, L, D) for per-sample S (B, n_s, d) and V_y (B, n_v, d); differentiable in both."""
        self._check(domain, classes)
        b, lay = domain.shape[0], self.layout
        ids, mask = lay.input_ids.expand(b, -1), lay.attention_mask.expand(b, -1)
        if self.mode == "output":
            with torch.no_grad():
                base = self.run(ids[:1], mask[:1])
            return inject(base.expand(b, -1, -1), lay, domain, classes)
        embeddings = self.parts.text_encoder.get_input_embeddings()
        handle = embeddings.register_forward_hook(lambda _m, _a, out: inject(out, lay, domain, classes))
        try:
            return self.run(ids, mask)
        finally:
            handle.remove()

    def encode_labels(self, domain: torch.Tensor, classes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """τ_θ(S, V_{y_b}) (B, L, D) for one S (n_s, d), all V (C, n_v, d) and labels (B,): one encoder pass per
        distinct class in the batch."""
        present, inverse = labels.to(classes.device).unique(return_inverse=True)
        states = self.encode(domain.unsqueeze(0).expand(len(present), -1, -1), classes[present])
        return states[inverse.to(states.device)]

    @torch.no_grad()
    def unconditional(self, batch: int) -> torch.Tensor:
        """τ_θ("") padded to L, (batch, L, D): the negative prompt of classifier-free guidance."""
        tok = self.parts.tokenizer("", padding="max_length", max_length=self.layout.length, truncation=True,
                                   return_tensors="pt")
        return self.run(tok["input_ids"], tok["attention_mask"]).expand(batch, -1, -1)

    def _check(self, domain: torch.Tensor, classes: torch.Tensor) -> None:
        """A FedhetError when S / V_y do not have this encoder's slot sizes and vector dim."""
        n_s, n_v, d = len(self.layout.domain_positions), len(self.layout.class_positions), self.vector_dim
        if domain.dim() != 3 or classes.dim() != 3 or tuple(domain.shape[1:]) != (n_s, d) \
                or tuple(classes.shape[1:]) != (n_v, d) or domain.shape[0] != classes.shape[0]:
            raise FedhetError(f"concept vectors must be S (B, {n_s}, {d}) and V_y (B, {n_v}, {d}) for mode "
                              f"'{self.mode}', got {tuple(domain.shape)} and {tuple(classes.shape)}")

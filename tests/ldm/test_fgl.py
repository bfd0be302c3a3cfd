"""FGL (fedhet.algorithms.fgl) on the tiny LDM: the upload is the captions only (labels and the template's word
vectors; no latent), and the server's synthetic set is FedBiP's prompt-only set without perturbation, from fresh
noise. Broken variants checked: the client still sends its latents; the server perturbs S or starts from them."""

from __future__ import annotations

import pytest
import torch
from fedbip_testing import experiment, fit

from fedhet.algorithms.fedbip_parts import TimedGeneration
from fedhet.core.messages import Reply
from fedhet.errors import ConfigError


def test_the_upload_is_the_captions_and_the_server_generates_from_them_alone() -> None:
    fgl_exp = experiment("method=fgl", "method_args.multiplier=2")
    alg, _, _, reply, _ = fit(fgl_exp)
    words_exp = experiment("method_args.personalize=[]", "method_args.domain_noise=0", "method_args.multiplier=2")
    ref_alg, _, _, ref, _ = fit(words_exp)
    assert set(reply.arrays) == {"labels", "domain", "classes"} and reply.scalars["steps"] == 0
    for key in ("labels", "domain", "classes"):  # the words' vectors: nothing learned
        assert torch.equal(reply.arrays[key], ref.arrays[key])
    images, labels, _, _ = alg.synthetic_set(Reply(0, reply, 1), 0, TimedGeneration(alg.encoder()))
    expected, ref_labels, _, _ = ref_alg.synthetic_set(Reply(0, ref, 1), 0, TimedGeneration(ref_alg.encoder()))
    assert torch.equal(labels, ref_labels) and len(labels) == 2 * len(reply.arrays["labels"])
    assert torch.equal(images, expected)  # fresh N(0, I) starts, the words' prompt, σ = 0


def test_fgl_refuses_personalization() -> None:
    with pytest.raises(ConfigError, match="fgl method_args.personalize"):
        experiment("method=fgl", "method_args.personalize=[zT]")

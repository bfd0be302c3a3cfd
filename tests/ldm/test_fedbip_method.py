"""The `fedbip` method on the engine (fedhet.algorithms.fedbip): one upload and nothing else, a frozen LDM, the
concept pass, the synthetic-set sizes, resumable generation, the Table 3 switches, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from fedbip_testing import BASE, experiment, fit

from fedhet.algorithms.fedbip import FedBiP
from fedhet.algorithms.fedbip_parts import ImageFormat, SynthesisPlan, synthesize, upload_key
from fedhet.config import load_config
from fedhet.core.messages import Reply
from fedhet.engine.experiment import build_experiment
from fedhet.errors import ConfigError
from fedhet.models.ldm import FedBiPUpload, GenerationConfig


def ldm_state(alg: FedBiP) -> dict[str, torch.Tensor]:
    parts = alg.encoder().parts
    return {f"{name}.{k}": v.clone() for name, net in (("vae", parts.vae), ("unet", parts.unet),
                                                         ("text", parts.text_encoder))
            for k, v in net.state_dict().items()}


def test_one_upload_with_exactly_the_four_arrays_and_a_frozen_ldm() -> None:
    exp = experiment("method_args.concept_epochs=2")
    alg = exp.algorithm
    before = ldm_state(alg)
    _, msg, state, reply, new_state = fit(exp)
    assert set(reply.arrays) == {"latents", "labels", "domain", "classes"}
    assert set(reply.scalars) == {"steps", "seconds", "channels", "height", "width"}  # metadata only
    assert msg.arrays == {}  # the server sends no model
    n = exp.data.clients[0].num_train
    assert reply.arrays["latents"].shape[0] == n and torch.equal(reply.arrays["labels"].sort().values,
                                                                 torch.tensor(sorted(int(y) for _, y in
                                                                                     exp.data.clients[0].train)))
    assert new_state.local == state.local == {}  # the client keeps nothing
    after = ldm_state(alg)
    assert all(torch.equal(before[k], after[k]) for k in before)  # θ frozen
    from fedhet.runtimes.flower.validation import check_arrays, expected_reply_spec
    check_arrays(reply.arrays, expected_reply_spec(alg, msg))


def test_the_concept_pass_learns_only_what_is_personalized() -> None:
    full = fit(experiment())[3]
    words = fit(experiment("method_args.personalize=[zT]"))[3]
    only_v = fit(experiment("method_args.personalize=[zT, V]"))[3]
    assert words.scalars["steps"] == 0  # nothing to learn: no pass
    assert full.scalars["steps"] > 0 and only_v.scalars["steps"] > 0
    assert torch.equal(only_v.arrays["domain"], words.arrays["domain"])  # S stays the domain word's vector
    assert not torch.equal(only_v.arrays["classes"], words.arrays["classes"])
    assert not torch.equal(full.arrays["domain"], words.arrays["domain"])
    # the latents do not depend on the concept switches
    assert torch.equal(full.arrays["latents"], words.arrays["latents"])


def test_synthetic_set_sizes_and_the_classifier_trains_on_it_only() -> None:
    exp = experiment("method_args.size=M")
    alg, _, _, reply, _ = fit(exp)
    server = alg.init_server()
    new = alg.aggregate(server, [Reply(0, reply, 1)], exp.round_info(1))
    assert new.synthetic == 5 * reply.arrays["labels"].numel()
    assert any(not torch.equal(new.model[k], server.model[k]) for k in server.model)
    # every client deploys the trained classifier (what evaluation and `fedhet privacy` attack)
    deployed = alg.deploy(alg.broadcast(new, exp.round_info(1), 1), alg.init_client(1), exp.context(1, 1)).model
    assert all(torch.equal(v, new.model[k]) for k, v in deployed.state_dict().items())


def test_rounds_must_be_one_and_bad_method_args_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one-shot.*rounds=1"):
        experiment("rounds=3")
    with pytest.raises(ConfigError, match="method_args.ldm"):
        build_experiment(load_config(None, [*BASE, "rounds=1"]))
    cases = [("method_args.template=a photo of a {class}", "template"),
             ("method_args.personalize=[zT, W]", "personalize"), ("method_args.size=XL", "size"),
             ("method_args.normalize=fixed", "normalize")]
    for override, what in cases:
        with pytest.raises(ConfigError, match=what):
            experiment(override)
    (tmp_path / "unet").mkdir()
    with pytest.raises(ConfigError, match="method_args.ldm"):
        fit(experiment(f"method_args.ldm={tmp_path}"))


def upload(n: int = 6) -> FedBiPUpload:
    g = torch.Generator().manual_seed(0)
    return FedBiPUpload(torch.randn(n, 4, 8, 8, generator=g), torch.arange(n) % 3, torch.randn(1, 5, generator=g),
                        torch.randn(3, 1, 5, generator=g))


def fake_generator(calls: list[int]):
    """Stands in for the LDM: an image per latent from its own values and one draw of the chunk's generator."""
    def run(up: FedBiPUpload, cfg: GenerationConfig, g: torch.Generator):
        calls.append(len(up.labels))
        eta = torch.rand(len(up.labels), 1, 1, 1, generator=g)
        return (up.latents[:, :3].sigmoid() * eta).expand(-1, 3, 8, 8), up.labels.clone()
    return run


def test_generation_resumes_from_its_cache_and_regenerates_only_missing_chunks(tmp_path: Path) -> None:
    up, gen, calls = upload(), GenerationConfig(), []
    plan = SynthesisPlan(multiplier=3, chunk=4, use_latents=True, seed=1, client=0)
    key = upload_key(up, "ldm", gen, plan.key_fields())
    x1, y1 = synthesize(up, plan, gen, fake_generator(calls), tmp_path, key)
    assert len(y1) == 18 and calls == [4, 2, 4, 2, 4, 2]  # 3 copies of 6 latents, parts of at most 4
    assert torch.equal(y1, (torch.arange(18) % 6) % 3)  # image j from latent j mod N
    assert not torch.equal(x1[:6], x1[6:12])  # each copy its own η
    parts = sorted((tmp_path / key).iterdir())
    parts[2].unlink()
    calls.clear()
    x2, y2 = synthesize(up, plan, gen, fake_generator(calls), tmp_path, key)
    assert calls == [4] and torch.equal(x1, x2) and torch.equal(y1, y2)
    # a smaller set is the first copies of a larger one, generated once
    calls.clear()
    small = synthesize(up, SynthesisPlan(2, 4, True, 1, 0), gen, fake_generator(calls), tmp_path, key)
    assert calls == [] and torch.equal(small[0], x1[:12])
    # another setting is another key: nothing is reused across settings
    assert upload_key(up, "ldm", GenerationConfig(steps=10), plan.key_fields()) != key


def test_without_z_t_generation_starts_from_fresh_noise() -> None:
    up, seen = upload(), []

    def run(part: FedBiPUpload, cfg: GenerationConfig, g: torch.Generator):
        seen.append(part.latents)
        return torch.zeros(len(part.labels), 3, 8, 8), part.labels
    synthesize(up, SynthesisPlan(1, 6, True, 0, 0), GenerationConfig(), run, None, "k")
    synthesize(up, SynthesisPlan(1, 6, False, 0, 0), GenerationConfig(), run, None, "k")
    assert torch.equal(seen[0], up.latents) and not torch.allclose(seen[1], up.latents)
    assert abs(float(seen[1].std()) - 1) < 0.2


def test_image_format_maps_inputs_to_the_ldm_and_back() -> None:
    fmt = ImageFormat.of("imagenet")
    unit = torch.rand(2, 3, 16, 16)
    mean, std = torch.tensor(fmt.mean).view(1, 3, 1, 1), torch.tensor(fmt.std).view(1, 3, 1, 1)
    x = (unit - mean) / std
    assert torch.allclose(fmt.to_ldm(x, 16), unit, atol=1e-6)
    assert torch.allclose(fmt.to_classifier(fmt.to_ldm(x, 16), 3, 16, 16), x, atol=1e-5)
    grey = ImageFormat.of("none")
    g1 = torch.rand(2, 1, 8, 8)
    assert fmt.to_ldm(x, 32).shape == (2, 3, 32, 32)
    assert torch.allclose(grey.to_classifier(grey.to_ldm(g1, 8), 1, 8, 8), g1, atol=1e-6)
    over = torch.stack([torch.full((3, 4, 4), v) for v in (-0.5, 1.7)])  # a sampler overshooting [0, 1]
    assert torch.equal(fmt.to_classifier(over, 3, 4, 4), fmt.to_classifier(over.clamp(0, 1), 3, 4, 4))
    assert math.isclose(float(ImageFormat.of("fixed", [0.5], [0.5]).to_ldm(torch.zeros(1, 1, 4, 4), 4)[0, 0, 0, 0]),
                        0.5)


def test_a_repeated_client_computation_reads_its_cached_upload(tmp_path: Path) -> None:
    first = fit(experiment("method_args.cache=true", f"method_args.cache_dir={tmp_path}"))[3]
    assert len(list((tmp_path / "uploads").iterdir())) == 1
    again = fit(experiment("method_args.cache=true", f"method_args.cache_dir={tmp_path}",
                           "method_args.size=S", "method_args.steps=3"))[3]  # server-side settings only
    assert torch.equal(first.arrays["domain"], again.arrays["domain"]) and again.scalars == first.scalars
    other = fit(experiment("method_args.cache=true", f"method_args.cache_dir={tmp_path}",
                           "method_args.concept_lr=0.05"))[3]  # a client-side setting: computed afresh
    assert not torch.equal(first.arrays["domain"], other.arrays["domain"])
    assert len(list((tmp_path / "uploads").iterdir())) == 2

"""What the `fedbip` method computes, pinned so that a plausible broken variant fails: the upload is z(T) (not
z(0)), the concept pass learns Eq. 4 on the real latents (not the noised ones, not uphill), the server generates
each upload with its own V_y and S, trains the classifier on exactly D_syn, the S / M / L counts, and a whole
run resumes its generation from the cache and can be attacked by `fedhet privacy`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fedbip_testing import BASE, experiment, fit
from fedhet_testing import tiny_ldm, tiny_ldm_dir

import fedhet.algorithms.fedbip as fedbip_module
from fedhet.algorithms.fedbip_params import FedBiPParams
from fedhet.config import load_config
from fedhet.core.messages import Reply
from fedhet.launch.run import run_experiment
from fedhet.models.ldm import FedBiPUpload, GenerationConfig, concept_loss, encode_images
from fedhet.models.ldm.concepts import Concepts
from fedhet.models.ldm.generate import generate
from fedhet.privacy.rundir import evaluate_run


def test_the_upload_is_z_t_and_the_concepts_learn_on_z_0(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: list[torch.Tensor] = []
    real_latents, real_loss = fedbip_module.instance_latents, fedbip_module.concept_loss

    def recording_latents(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        made.append(real_latents(*args, **kwargs))
        return made[-1]

    def recording_loss(enc: Any, concepts: Any, z0: torch.Tensor, *rest: Any) -> torch.Tensor:
        seen.append(z0.clone())
        return real_loss(enc, concepts, z0, *rest)

    monkeypatch.setattr(fedbip_module, "instance_latents", recording_latents)
    monkeypatch.setattr(fedbip_module, "concept_loss", recording_loss)
    reply = fit(experiment("method_args.concept_epochs=2", "method_args.start_latent=upload"))[3]
    (z0, z_t), = made
    assert torch.equal(reply.arrays["latents"], z_t.cpu()) and not torch.allclose(z_t, z0)
    # ᾱ_T of SD's schedule is 0.0047: z(T) is almost pure N(0, I) noise, z(0) is not
    assert abs(float(z_t.std()) - 1) < 0.15 and abs(float(z_t.mean())) < 0.15
    rows = {tuple(r.flatten().tolist()) for r in z0.cpu()}
    assert seen and all(tuple(r.flatten().tolist()) in rows for batch in seen for r in batch.cpu())


def test_the_concept_pass_descends_eq_4() -> None:
    learned_exp = experiment("method_args.concept_epochs=6")
    alg, _, _, learned, _ = fit(learned_exp)
    start = fit(experiment("method_args.concept_epochs=0"))[3]  # the same seed: the same initial S and V
    enc = alg.encoder()
    g = torch.Generator().manual_seed(7)
    x = torch.stack([x for x, _ in learned_exp.data.clients[0].train])
    y = torch.tensor([int(y) for _, y in learned_exp.data.clients[0].train])
    z0 = encode_images(enc.parts, alg.params.image_format().to_ldm(x, alg.image_side()), g)
    z0, y = z0.repeat(4, 1, 1, 1), y.repeat(4)  # 4 held-out (t, ϵ) draws per image, the same for both
    t = torch.randint(0, enc.parts.num_train_timesteps, (len(y),), generator=g)
    eps = torch.randn(z0.shape, generator=g)

    def loss(reply: Any) -> float:
        with torch.no_grad():
            return float(concept_loss(enc, Concepts(reply.arrays["domain"], reply.arrays["classes"]), z0, y, t, eps))

    assert loss(learned) < loss(start) - 1e-3


def test_the_server_generates_each_upload_with_its_own_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = experiment("method_args.size=S")
    alg, _, _, reply, _ = fit(exp)
    parts: list[FedBiPUpload] = []

    def recording(up: FedBiPUpload, cfg: GenerationConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        parts.append(up)
        return torch.rand(len(up.labels), 3, 16, 16, generator=g), up.labels.clone()

    images, labels, _, _ = alg.synthetic_set(Reply(0, reply, 1), 0, recording)  # type: ignore[arg-type]
    n = len(reply.arrays["labels"])
    assert len(labels) == 2 * n and torch.equal(labels, reply.arrays["labels"].repeat(2))
    for part in parts:
        assert torch.equal(part.classes, reply.arrays["classes"]) and torch.equal(part.domain, reply.arrays["domain"])
    # inside generation, image i is prompted with V of its own label
    enc, used = alg.encoder(), []
    real_encode = enc.encode

    def recording_encode(domain: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        used.append(classes)
        return real_encode(domain, classes)

    monkeypatch.setattr(enc, "encode", recording_encode)
    up = FedBiPUpload(reply.arrays["latents"][:5], reply.arrays["labels"][:5], reply.arrays["domain"],
                      reply.arrays["classes"])
    generate(enc, up, GenerationConfig(steps=1, guidance_scale=1, batch_size=5), torch.Generator().manual_seed(0))
    assert torch.equal(used[0], up.classes[up.labels])


def test_the_classifier_trains_on_exactly_d_syn(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = experiment("method_args.size=S")
    alg, _, _, reply, _ = fit(exp)
    trained: list[tuple[torch.Tensor, torch.Tensor]] = []
    real_train = fedbip_module.train_on_tensors

    def recording(model: Any, x: torch.Tensor, y: torch.Tensor, *rest: Any, **kw: Any) -> float:
        trained.append((x, y))
        return real_train(model, x, y, *rest, **kw)

    monkeypatch.setattr(fedbip_module, "train_on_tensors", recording)
    server = alg.aggregate(alg.init_server(), [Reply(0, reply, 1)], exp.round_info(1))
    (x, y), = trained
    assert server.synthetic == len(y) == 2 * len(reply.arrays["labels"])
    assert torch.equal(y, reply.arrays["labels"].repeat(2))
    assert x.shape[1:] == exp.data.clients[0].train[0][0].shape


@pytest.mark.parametrize(("args", "copies"), [({"size": "S"}, 2), ({"size": "M"}, 5), ({"size": "L"}, 10),
                                              ({"multiplier": 3}, 3), ({}, 10), ({"size": "S", "multiplier": 10}, 2)])
def test_sizes_s_m_l_and_the_multiplier(args: dict[str, Any], copies: int) -> None:
    """S / M / L = 2x / 5x / 10x (§5.1); a size replaces the multiplier (a variant's size over a base config's)."""
    params = FedBiPParams(ldm=str(tiny_ldm_dir()), **args)
    params.validate()
    assert params.multiplier == copies


@pytest.fixture(scope="module")
def cached_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The same tiny FedBiP run twice on one generation cache, one generated part deleted in between."""
    root = tmp_path_factory.mktemp("fedbip_runs")
    cfg = load_config(None, [*BASE, *tiny_ldm(), "method_args.cache=true", f"method_args.cache_dir={root / 'cache'}",
                             "method_args.multiplier=2", "method_args.chunk=8"])
    run_experiment(cfg, root / "first", progress=False)
    parts = sorted((root / "cache").glob("*/copy*_part*.pt"))
    parts[1].unlink()
    run_experiment(cfg, root / "second", progress=False)
    return root / "first", root / "second", root / "cache"


def test_a_second_run_regenerates_only_the_missing_part(cached_runs: tuple[Path, Path, Path]) -> None:
    first, second, _ = cached_runs
    model = [torch.load(r / "checkpoints" / "latest.pt", weights_only=False)["server"].model for r in (first, second)]
    assert all(torch.equal(model[0][k], model[1][k]) for k in model[0])
    cost = [torch.load(r / "checkpoints" / "latest.pt", weights_only=False)["server"].cost for r in (first, second)]
    assert cost[0]["generated_images"] == 2 * 24 * 2 and cost[1]["generated_images"] == 8  # one part of 8 images
    s = [json.loads((r / "summary.json").read_text()) for r in (first, second)]
    assert s[0]["final"]["avg"] == s[1]["final"]["avg"]
    assert [x["fedbip"]["cost"] for x in s] == cost and s[0]["fedbip"]["synthetic"] == 2 * 2 * 24  # kept in summary


def test_privacy_attacks_a_fedbip_run(cached_runs: tuple[Path, Path, Path]) -> None:
    result = evaluate_run(cached_runs[0], progress=False)
    assert result["method"] == "fedbip" and set(result["clients"]) == {"clean", "inverted"}
    for report in result["clients"].values():
        assert report["num_members"] == 24 and report["num_nonmembers"] == 20
        assert 0.5 <= report["loss"]["attack_accuracy"] <= 1 and 0 <= report["entropy"]["auc"] <= 1

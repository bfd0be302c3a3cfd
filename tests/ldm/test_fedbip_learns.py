"""FedBiP learns (slow: a small LDM is pretrained first, about 4 minutes on one core).

The LDM is pretrained on the clean style of the built-in digits only; the clients hold the inverted and the
colored styles, which it never saw. FedBiP's classifier, trained on its synthetic images only, must beat the
same pipeline without personalization (prompt only: fresh noise, the words' vectors) on the clients' real test
images, and a broken upload (each latent labelled as the next class, so z(T) of one class is generated and
labelled as another) must not beat it.

This is issue 19's learning test. Its only complete run (2026-11-24) came before a fix to FedBiP's deployment:
it scored the untrained model, so it showed nothing. It has not been run again since. It is marked xfail on the
reproduction's evidence: with the 80-minute LDM, FedBiP is no better than the prompt alone on the styles the LDM
never saw (MNIST-M, SynthDigits; docs/results/fedbip.md). It is not removed: with a generator that covers the
clients' styles it should pass, and it reports XPASS when it does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.config import load_config
from fedhet.core.messages import Reply
from fedhet.core.seeding import seeded
from fedhet.engine.evaluation import evaluate
from fedhet.engine.experiment import build_experiment
from fedhet.engine.local import fit_client

pytestmark = pytest.mark.slow

PRETRAIN = ["image_size=16", "vae.blocks=[16,32]", "vae.norm_groups=8", "vae.batch_size=64", "vae.steps=600",
            "unet.blocks=[32,64]", "unet.norm_groups=8", "unet.heads=2", "unet.batch_size=64", "unet.steps=1500",
            "unet.warmup=50", "pool=[{dataset: offline_digits, domain: clean, word: clean}]", "num_threads=1",
            "samples.per_prompt=1", "samples.steps=2"]
RUN = ["data.dataset=offline_digits", "data.domains=[inverted, colored]", "data.max_train_per_client=100",
       "data.max_test_per_client=200", "data.val_fraction=0.0", "data.augment=false", "data.image_size=16",
       "model.name=small_cnn", "model.args={width: 16}", "train.lr=0.01", "train.momentum=0.9",
       "train.batch_size=32", "run.device=cpu", "run.num_threads=1", "run.quiet=true", "method=fedbip", "rounds=1",
       "method_args.multiplier=5", "method_args.steps=10", "method_args.spacing=trailing",
       "method_args.mode=output", "method_args.guidance_scale=1.0",  # as the reproduction (docs/results/fedbip.md)
       "method_args.classifier_epochs=30",
       "method_args.concept_epochs=10", "method_args.cache=false",
       "method_args.domain_words={inverted: inverted, colored: colored}"]


@pytest.fixture(scope="module")
def ldm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedhet.launch.ldm_pretrain import pretrain_ldm
    from fedhet.models.ldm.pretrain_config import load_pretrain_config

    out = tmp_path_factory.mktemp("ldm") / "clean16"
    pretrain_ldm(load_pretrain_config(None, PRETRAIN), out, progress=False)
    return out


def accuracy(ldm: Path, *overrides: str, shift_labels: bool = False) -> float:
    """Mean test accuracy over the clients of the classifier trained on the synthetic set."""
    exp = build_experiment(load_config(None, [*RUN, f"method_args.ldm={ldm}", *overrides]))
    alg = exp.algorithm
    server = alg.init_server()
    replies = []
    for cid in range(len(exp.data.clients)):
        msg = alg.broadcast(server, exp.round_info(1), cid)
        with seeded(exp.config.seed, "fit", cid):
            reply, _ = fit_client(alg, msg, alg.init_client(cid), exp.context(cid, 1))
        if shift_labels:
            reply.arrays["labels"] = (reply.arrays["labels"] + 1) % exp.data.num_classes
        replies.append(Reply(cid, reply, exp.data.clients[cid].num_train))
    with seeded(exp.config.seed, "aggregate"):
        server = alg.aggregate(server, replies, exp.round_info(1))
    model = alg.server_model(server)
    return sum(evaluate(model, c.test, exp.device)["accuracy"] for c in exp.data.clients) / len(exp.data.clients)


@pytest.mark.xfail(reason="not met with the small LDMs trainable here: they have no mode for a style they never saw, "
                          "and FedBiP's images of it are no better than the prompt's (docs/results/fedbip.md)",
                   strict=False)
def test_fedbip_beats_the_unpersonalized_ldm_and_a_broken_upload_does_not(ldm: Path) -> None:
    torch.manual_seed(0)
    full = accuracy(ldm)
    prompt_only = accuracy(ldm, "method_args.personalize=[]")
    broken = accuracy(ldm, shift_labels=True)
    assert full > prompt_only + 0.1, (full, prompt_only)
    assert broken < full - 0.2, (full, broken)

"""FedDEO (fedhet.algorithms.feddeo) on the tiny LDM: each client learns one description per local category (the
class slot's vectors, from the class words, by SGD on the LDM's denoising loss, one image at a time) and uploads
only the labels and descriptions; the server generates from fresh noise under exactly those descriptions (FGL's
server). Broken variants checked (each made once, each failed here): descriptions not optimized (no pass), the
server ignoring the uploaded descriptions (the class words instead), the optimizer left at FedBiP's Adam."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fedbip_testing import experiment, fit

from fedhet.algorithms.fedbip_parts import TimedGeneration
from fedhet.algorithms.fgl import FGL
from fedhet.core.messages import Message, Reply
from fedhet.core.seeding import seeded
from fedhet.errors import ConfigError
from fedhet.models.ldm.concepts import Concepts, concept_loss


@pytest.fixture(scope="module")
def fitted() -> tuple[Any, Any, Any]:
    """(the experiment, client 0's FedDEO upload, the word vectors its S and V start from: `init: words`)."""
    exp = experiment("method=feddeo", "method_args.multiplier=2")
    alg, _, _, reply, _ = fit(exp)
    words = alg.initial_concepts(alg.encoder(), exp.context(0, 1), torch.Generator().manual_seed(0))
    return exp, reply, Message(arrays={k: v.detach() for k, v in words.items()})


def test_descriptions_are_learned_per_local_class_and_lower_the_denoising_loss(fitted: tuple[Any, Any, Any]
                                                                               ) -> None:
    exp, reply, words = fitted
    alg = exp.algorithm
    assert set(reply.arrays) == {"labels", "domain", "classes"}
    assert torch.equal(reply.arrays["domain"], words.arrays["domain"])  # the domain slot is not learned
    assert reply.scalars["steps"] == len(reply.arrays["labels"])  # one image per SGD step, one pass
    local = set(reply.arrays["labels"].tolist())
    for c in range(alg.num_classes):  # a class the client does not hold keeps its words (plain SGD, no momentum)
        same = torch.equal(reply.arrays["classes"][c], words.arrays["classes"][c])
        assert same == (c not in local), c
    enc = alg.encoder()
    with seeded(0, "probe"):
        work = exp.algorithm.start(Message(), exp.algorithm.init_client(0), exp.context(0, 1))
        t = torch.randint(0, enc.parts.num_train_timesteps, (len(work.labels),))
        eps = torch.randn(work.real.shape)

    def loss(r: Any) -> float:
        concepts = Concepts(r.arrays["domain"], r.arrays["classes"])
        return float(concept_loss(enc, concepts, work.real, work.labels, t, eps))

    assert loss(reply) < loss(words)


def test_the_description_pass_is_sgd_at_the_official_rate(fitted: tuple[Any, Any, Any]) -> None:
    exp = fitted[0]
    alg = exp.algorithm
    work = alg.start(Message(), alg.init_client(0), exp.context(0, 1))
    (lp,) = alg.passes(work)
    (optim,) = lp.optimizers.values()
    assert (optim.kind, optim.lr, lp.train.batch_size, lp.train.local_epochs) == ("sgd", 10.0, 1, 1)
    assert [p.shape for p in optim.params] == [work.concepts["classes"].shape]


def test_the_server_generates_from_the_uploaded_descriptions(fitted: tuple[Any, Any, Any]) -> None:
    exp, reply, words = fitted
    alg = exp.algorithm
    images, labels, _, _ = alg.synthetic_set(Reply(0, reply, 1), 0, TimedGeneration(alg.encoder()))
    assert torch.equal(labels, reply.arrays["labels"].repeat(2))
    swapped = Message(arrays=dict(reply.arrays, classes=words.arrays["classes"]), scalars=reply.scalars)
    plain, _, _, _ = alg.synthetic_set(Reply(0, swapped, 1), 0, TimedGeneration(alg.encoder()))
    assert not torch.equal(images, plain)  # the descriptions change what is generated
    fgl = FGL.__new__(FGL)
    fgl.__dict__.update(alg.__dict__)
    same, _, _, _ = FGL.synthetic_set(fgl, Reply(0, reply, 1), 0, TimedGeneration(alg.encoder()))
    assert torch.equal(images, same)  # fresh N(0, I) starts, no perturbation: FGL's server on the descriptions


def test_feddeo_refuses_other_personalization() -> None:
    with pytest.raises(ConfigError, match="feddeo method_args.personalize"):
        experiment("method=feddeo", "method_args.personalize=[zT, V]")

"""AdaptFED's factor-only variant (`method_args.lora_rank`, ours): P_i is the LoRA factors on the personalized
layers, whose own weights stay frozen at their initial values on every client and never enter a message; the
hypernetwork emits the factors and steps on their deltas."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("timm")
pytest.importorskip("peft")

from fedhet.config import load_config  # noqa: E402
from fedhet.core.messages import Message, Reply  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.local import deployed_model, fit_client  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402

BASE = ["data.dataset=offline_digits", "model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}",
        "train.local_steps=3", "train.batch_size=16", "train.lr=0.1", "run.num_threads=1", "run.quiet=true",
        "method=adaptfed", "method_args.lora_rank=2"]


def setup(*extra: str):
    exp = build_experiment(load_config(None, [*BASE, *extra]))
    return exp, exp.algorithm, exp.algorithm.init_server()


def test_only_xi_and_the_factors_travel() -> None:
    exp, alg, server = setup()
    frozen, factors = set(alg.lora.frozen), set(alg.lora.factors)
    assert frozen and all(".modulation.f.base_layer." in n or ".modulation.h.base_layer." in n for n in frozen)
    assert set(alg.partition.p) == factors and all("lora_" in n for n in factors)
    info = exp.round_info(1)
    msg = alg.broadcast(server, info, 0)
    assert not frozen & set(msg.arrays) and factors <= set(msg.arrays)
    reply, state = fit_client(alg, msg, alg.init_client(0), exp.context(0, 1))
    assert set(reply.arrays) == set(msg.arrays)  # up: xi and the factors, no frozen weight
    assert not frozen & set(state.local)  # and no client keeps a copy of them
    factor_numel = sum(alg.parts.init_state[n].numel() for n in factors)
    assert factor_numel < sum(alg.parts.init_state[n].numel() for n in frozen)  # rank 2 < the layers it adapts


def test_frozen_weights_stay_at_their_initial_values_and_the_factors_train() -> None:
    exp, alg, server = setup()
    info = exp.round_info(1)
    msg = alg.broadcast(server, info, 0)
    reply, state = fit_client(alg, msg, alg.init_client(0), exp.context(0, 1))
    trained = dict(alg.parts.spare("workspace").state_dict())  # the model the client just trained
    assert all(torch.equal(trained[n], alg.parts.init_state[n]) for n in alg.lora.frozen)
    model, _ = deployed_model(alg, msg, state, exp.context(0, 1))
    deployed = dict(model.state_dict())
    assert all(torch.equal(deployed[n], alg.parts.init_state[n]) for n in alg.lora.frozen)
    assert any(not torch.equal(reply.arrays[n], msg.arrays[n]) for n in alg.lora.factors)
    xi = [n for n in alg.partition.xi if n not in set(alg.lora.frozen)]
    assert any(not torch.equal(reply.arrays[n], msg.arrays[n]) for n in xi)  # xi trains too


def test_the_hypernetwork_emits_the_factors_and_steps_on_their_delta() -> None:
    exp, alg, server = setup("method_args.update.momentum=0", "method_args.update.weight_decay=0")
    hnet = alg.hypernet(server)
    assert dict(hnet.shapes) == {n: tuple(s) for n, s in alg.partition.shapes().items()}
    info, factors = exp.round_info(1), alg.lora.factors
    sent = alg.broadcast(server, info, 0)
    returned = {k: v + 1.0 if k in factors else v for k, v in sent.arrays.items()}  # "trained" factors
    new = alg.aggregate(server, [Reply(0, Message(arrays=returned), 10)], info)
    after = alg.broadcast(new, info, 0).arrays
    gap = sum(float((returned[k] - sent.arrays[k]).norm()) for k in factors)
    assert sum(float((returned[k] - after[k]).norm()) for k in factors) < gap  # toward what client 0 returned
    assert all(torch.equal(new.model[k], server.model[k]) for k in server.model)  # xi unchanged: it returned xi-bar


def test_choosing_both_low_rank_variants_or_an_unsupported_layer_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="choose one low-rank variant"):
        setup("method_args.rank=2")
    with pytest.raises(ConfigError, match="LoRA wraps Linear"):
        setup("method_args.personalize=[norm]")
    with pytest.raises(ConfigError, match="lora_rank must be an integer"):
        setup("method_args.lora_rank=0")

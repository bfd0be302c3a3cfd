"""FedDAT's contract by hand (Alg. 1): only A_s leaves a client, A_c stays and trains, Â_s is the received A_s
and gets no gradient, the ramp-up starts at exp(-5); the PEFT baselines send exactly what they should."""

from __future__ import annotations

import math

import pytest
import torch
from fedhet_testing import TINY_VL

pytest.importorskip("easy_vqa")

from fedhet.config import load_config  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.local import fit_client  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402
from fedhet.models.peft.counting import param_group  # noqa: E402
from fedhet.models.peft.insertion import adapter_named_parameters  # noqa: E402

BASE = [*TINY_VL, "train.local_steps=3", "train.batch_size=16", "run.num_threads=1", "run.quiet=true"]


def fit(*extra: str):
    exp = build_experiment(load_config(None, [*BASE, *extra]))
    alg = exp.algorithm
    msg = alg.broadcast(exp.init_server(), exp.round_info(1), 0)
    state = alg.init_client(0)
    out, new = fit_client(alg, msg, state, exp.context(0, 1, exp.data.clients[0]))
    return exp, msg, state, out, new


def test_only_the_shared_adapter_leaves_the_client_and_A_c_trains_and_stays() -> None:
    exp, msg, state, out, new = fit("method=feddat")
    model = exp.algorithm.parts.template
    shared = dict(adapter_named_parameters(model, "shared"))
    assert set(msg.arrays) == set(out.arrays) == set(shared)  # A_s in both directions, nothing else
    assert sum(v.numel() for v in out.arrays.values()) == exp.algorithm.peft.communicated_count
    client_keys = {n for n, _ in adapter_named_parameters(model, "client")}
    assert client_keys and client_keys <= set(new.local) and not client_keys & set(out.arrays)
    assert not any(".slots.frozen_shared." in k for k in (*out.arrays, *new.local))  # Â_s is never kept or sent
    assert any(not torch.equal(new.local[k], state.local[k]) for k in client_keys)  # A_c trained
    assert any(not torch.equal(out.arrays[k], msg.arrays[k]) for k in shared)  # A_s trained
    assert {k for k in new.local if k.startswith("head.")}  # the client's own head stays with it


def test_frozen_copy_is_the_received_A_s_and_gets_no_gradient() -> None:
    exp = build_experiment(load_config(None, [*BASE, "method=feddat"]))
    alg = exp.algorithm
    msg = alg.broadcast(exp.init_server(), exp.round_info(1), 0)
    work = alg.start(msg, alg.init_client(0), exp.context(0, 1, exp.data.clients[0]))
    frozen = dict(adapter_named_parameters(work.model, "frozen_shared"))
    received = {k.replace(".slots.shared.", ".slots.frozen_shared."): v for k, v in msg.arrays.items()}
    assert set(frozen) == set(received) and all(torch.equal(frozen[k], received[k]) for k in frozen)
    assert not any(p.requires_grad for p in frozen.values())
    from fedhet.engine.local import run_pass

    before = {k: p.detach().clone() for k, p in frozen.items()}
    for local_pass in alg.passes(work):
        run_pass(local_pass, {}, "test", work.ctx.data.train, torch.device("cpu"))
    assert all(torch.equal(frozen[k], before[k]) and frozen[k].grad is None for k in frozen)


def test_ramp_up_starts_at_exp_minus_five_and_reaches_one() -> None:
    exp = build_experiment(load_config(None, [*BASE, "method=feddat", "method_args.ramp=exp"]))
    alg = exp.algorithm
    work = alg.start(alg.broadcast(exp.init_server(), exp.round_info(1), 0), alg.init_client(0),
                     exp.context(0, 1, exp.data.clients[0]))
    assert math.isclose(alg.weight(work), math.exp(-5)) and work.steps == 3
    work.step = 3
    assert alg.weight(work) == 1.0


@pytest.mark.parametrize("kind,local_only", [("adapter", False), ("lora", False), ("prompt", False),
                                             ("bias", False), ("clf", False), ("full", True)])
def test_peft_baselines_send_what_they_train_and_nothing_else(kind, local_only) -> None:
    exp, msg, _, out, new = fit("method=peft", f"method_args.kind={kind}", f"method_args.local_only={local_only}")
    sel = exp.algorithm.peft
    sent = 0 if local_only else sel.communicated_count
    assert sum(v.numel() for v in out.arrays.values()) == sent and set(out.arrays) == set(msg.arrays)
    assert set(new.local) == set(sel.trainable) - set(out.arrays)  # kept: trained and not sent (head, ...)
    groups = {param_group(k) for k in (*out.arrays, *new.local)}
    expected = {"adapter": {"adapter:shared", "head"}, "lora": {"lora", "head"}, "prompt": {"prompt", "head"},
                "bias": {"bias", "head"}, "clf": {"head"}, "full": {"backbone", "bias", "head"}}[kind]
    assert groups == expected  # e.g. no frozen backbone weight is sent or kept by adapter / LoRA / prompt / clf


def test_also_train_parts_are_trained_and_kept_never_sent() -> None:
    exp, msg, state, out, new = fit("method=feddat", "method_args.also_train=[patch_embeddings.*, image_position]")
    extra = {"features.embeddings.patch_embeddings.weight", "features.embeddings.patch_embeddings.bias",
             "features.embeddings.image_position"}
    assert extra <= set(new.local) and not extra & set(out.arrays)
    template = exp.algorithm.parts.template.state_dict()
    assert all(not torch.equal(new.local[k], template[k]) for k in extra)  # trained
    with pytest.raises(ConfigError, match="also_train pattern 'patch_embed' matches no parameter"):
        build_experiment(load_config(None, [*BASE, "method=peft", "method_args.also_train=[patch_embed]"]))

"""AdaptFED's Algorithm 1 by hand: each client receives its own generated P_i and the shared xi-bar; the server
averages xi only (P is never averaged) and moves h(phi; z_i) toward the P_i the client returned (pFedHN's sign);
Vanilla-T keeps P on the client and out of every message."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("timm")

from fedhet.config import load_config  # noqa: E402
from fedhet.core.messages import Message, Reply  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402

BASE = ["data.dataset=offline_digits", "model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}",
        "train.local_steps=2", "train.batch_size=16", "run.num_threads=1", "run.quiet=true", "method=adaptfed"]


def setup(*extra: str):
    exp = build_experiment(load_config(None, [*BASE, *extra]))
    alg = exp.algorithm
    return exp, alg, alg.init_server()


def test_shared_keys_has_no_side_effects() -> None:
    """The partition into P and xi is made once, when the method is built; asking for the shared keys of another
    model (with local_head, a different P) changes nothing on the method."""
    exp, alg, _ = setup("method_args.local_head=true")
    before = {k: id(v) for k, v in vars(alg).items()}
    other = alg.parts.new()
    assert alg.shared_keys(other) == alg.parts.shared
    assert {k: id(v) for k, v in vars(alg).items()} == before


def test_each_client_gets_its_own_P_and_the_same_xi() -> None:
    exp, alg, server = setup()
    p = alg.partition.p
    assert p and all(".modulation.f." in n or ".modulation.h." in n for n in p)
    a, b = (alg.broadcast(server, exp.round_info(1), cid) for cid in (0, 1))
    assert set(a.arrays) == set(b.arrays) == set(server.model) | set(p) and not set(p) & set(server.model)
    assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in server.model)
    assert any(not torch.equal(a.arrays[k], b.arrays[k]) for k in p)  # z_0 != z_1


def fake_reply(msg: Message, cid: int, n: int, shift: float, p: tuple[str, ...]) -> Reply:
    arrays = {k: v + shift if k in p or v.is_floating_point() else v for k, v in msg.arrays.items()}
    return Reply(cid, Message(arrays=arrays), n)


def test_server_averages_xi_only_and_moves_the_generator_toward_the_returned_P() -> None:
    exp, alg, server = setup("method_args.update.momentum=0", "method_args.update.weight_decay=0",
                              "method_args.update.lr=0.01")
    p, info = alg.partition.p, exp.round_info(1)
    sent = {cid: alg.broadcast(server, info, cid) for cid in (0, 1)}
    replies = [fake_reply(sent[0], 0, 30, 1.0, p), fake_reply(sent[1], 1, 10, -1.0, p)]
    new = alg.aggregate(server, replies, info)
    xi = next(k for k in server.model if server.model[k].is_floating_point())
    assert torch.allclose(new.model[xi], server.model[xi] + 0.75 * 1.0 + 0.25 * -1.0)  # sample-weighted FedAvg
    assert set(new.model) == set(server.model)  # no P in the server's model: P is never averaged
    before, after = sent[0].arrays, alg.broadcast(new, info, 0).arrays  # client 0 weighs 3/4 of the step
    start = sum(float(torch.ones_like(before[k]).norm()) for k in p)  # |P_returned - P_sent|
    assert sum(float((before[k] + 1.0 - after[k]).norm()) for k in p) < start


def test_a_later_round_leaves_the_earlier_server_state_untouched() -> None:
    """States are never mutated (rollback and checkpoints keep them): the hypernetwork optimizer's momentum that
    round 2 loads and steps is a copy of round 1's, not its tensors."""
    exp, alg, server = setup()
    p, info = alg.partition.p, exp.round_info(1)
    one = alg.aggregate(server, [fake_reply(alg.broadcast(server, info, 0), 0, 10, 1.0, p)], info)
    kept = copy.deepcopy(one.hopt)
    alg.aggregate(one, [fake_reply(alg.broadcast(one, info, 0), 0, 10, 1.0, p)], exp.round_info(2))
    momentum = [k for k, v in kept["optimizer"]["state"].items() if "momentum_buffer" in v]
    assert momentum and all(torch.equal(one.hopt["optimizer"]["state"][k]["momentum_buffer"],
                                        kept["optimizer"]["state"][k]["momentum_buffer"]) for k in momentum)


def test_the_paper_sign_moves_away() -> None:
    exp, alg, server = setup("method_args.update.sign=paper", "method_args.update.momentum=0",
                              "method_args.update.lr=0.01")
    p, info = alg.partition.p, exp.round_info(1)
    msg = alg.broadcast(server, info, 0)
    new = alg.aggregate(server, [fake_reply(msg, 0, 10, 1.0, p)], info)
    after = alg.broadcast(new, info, 0).arrays
    start = sum(float(torch.ones_like(msg.arrays[k]).norm()) for k in p)
    assert sum(float((msg.arrays[k] + 1.0 - after[k]).norm()) for k in p) > start


def test_vanilla_t_keeps_P_local() -> None:
    exp, alg, server = setup("method_args.generator=local")
    msg = alg.broadcast(server, exp.round_info(1), 0)
    assert not set(alg.partition.p) & set(msg.arrays) and set(alg.partition.p) <= alg.parts.local_keys()


def test_plus_fedper_keeps_the_head_on_the_client() -> None:
    from fedhet.engine.local import fit_client
    from fedhet.errors import ConfigError

    exp, alg, server = setup("method_args.local_head=true")
    head = {k for k in alg.parts.init_state if k.startswith("head.")}
    info = exp.round_info(1)
    msg = alg.broadcast(server, info, 0)
    assert head and not head & set(msg.arrays) and set(alg.partition.p) <= set(msg.arrays)
    reply, state = fit_client(alg, msg, alg.init_client(0), exp.context(0, 1))
    assert not head & set(reply.arrays) and head <= set(state.local)
    assert any(not torch.equal(state.local[k], alg.parts.init_state[k]) for k in head)  # it trained locally
    with pytest.raises(ConfigError, match="local_head keeps the classification head"):
        setup("method_args.local_head=true", "method_args.personalize=[all]")


def test_task_aware_descriptor_is_sent_and_conditions_the_generator() -> None:
    import numpy as np

    from fedhet.algorithms.adaptfed import TaskDescriptor
    from fedhet.algorithms.base import spec_of
    from fedhet.data.show import split_labels
    from fedhet.engine.local import fit_client

    exp, alg, server = setup("method_args.descriptor=label_histogram", "data.partition=pathological",
                             "data.num_clients=4", "data.classes_per_client=2")
    info = exp.round_info(1)
    before = alg.broadcast(server, info, 1).arrays
    reply, _ = fit_client(alg, alg.broadcast(server, info, 0), alg.init_client(0), exp.context(0, 1))
    counts = np.bincount(split_labels(exp.data.clients[0].train), minlength=exp.data.num_classes)
    sent = TaskDescriptor.of(reply).frequencies
    assert torch.allclose(sent, torch.tensor(counts / counts.sum(), dtype=torch.float32))
    assert spec_of(reply.arrays) == alg.reply_layout(alg.broadcast(server, info, 0))  # declared: Flower checks it
    new = alg.aggregate(server, [Reply(0, reply, 10)], info)
    table = alg.hypernet(new).get_buffer("descriptors")
    assert torch.equal(table[0], sent) and not table[1].any()  # only the sender's row
    hnet = alg.hypernet(new)  # client 1's P changes when only its descriptor does (z_1 and phi fixed)
    table[1] = sent
    hnet.set_descriptors(table)
    assert any(not torch.equal(hnet(1)[k], alg.hypernet(new)(1)[k]) for k in alg.partition.p)
    assert set(before) == set(alg.broadcast(new, info, 1).arrays)  # the descriptor never goes down

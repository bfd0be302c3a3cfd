"""PartialFed: the Fix initialization rule, the Adaptive probability update, communication and client state."""

from __future__ import annotations

import copy

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms.partialfed import PartialFed, PartialFedState, layers_of, matching_layers
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, FitStats, RoundInfo
from fedhet.core.messages import Message, Reply
from fedhet.core.params import StateDict, state_of
from fedhet.engine.local import deployed_model, fit_client
from fedhet.errors import ConfigError

CPU = torch.device("cpu")
BN = {"features.1.weight", "features.1.bias", "features.1.running_mean", "features.1.running_var",
      "features.1.num_batches_tracked"}
HEAD = {"head.weight", "head.bias"}
LIN = {"features.0.weight", "features.0.bias"}


def make(bn: bool = True, **params: object) -> PartialFed:
    torch.manual_seed(0)
    template = tiny_model(in_dim=2, feat_dim=2, num_classes=2, bn=bn)
    train = TrainConfig(lr=0.1, momentum=0.0, batch_size=4, local_steps=1)
    return PartialFed(PartialFed.Params(**params), lambda: template, train, ServerConfig(), 2, CPU)


def info(rnd: int = 1) -> RoundInfo:
    return RoundInfo(round=rnd, rounds=2, num_clients=1, seed=0)


def ctx(rnd: int = 1) -> ClientContext:
    return ClientContext(client_id=0, info=info(rnd), data=tiny_client(n=4, in_dim=2), device=CPU, num_classes=2)


def round_start(alg: PartialFed, glob: StateDict, state: PartialFedState) -> tuple[StateDict, Message]:
    """The model a fit starts training from (the work `start` builds) and the reply `finish` gives for it."""
    work = alg.start(Message(arrays=glob), state, ctx())
    seen = state_of(work.model)
    reply, _ = alg.finish(work, state, FitStats())
    return seen, reply


def distinct_states(alg: PartialFed) -> tuple[StateDict, StateDict]:
    glob = {k: (v + 1.0 if v.is_floating_point() else v + 7) for k, v in alg.parts.init_state.items()}
    local = {k: (v - 2.0 if v.is_floating_point() else v + 3) for k, v in alg.parts.init_state.items()}
    return glob, local


def test_layers_and_rules() -> None:
    model = tiny_model(in_dim=2, feat_dim=2, bn=True)
    assert layers_of(model) == {"features.0": sorted(LIN), "features.1": sorted(BN), "head": sorted(HEAD)}
    assert matching_layers(model, ["bn", "head"]) == {"features.1", "head"}
    assert matching_layers(model, ["linear"]) == {"features.0", "head"}
    assert matching_layers(model, ["features"]) == {"features.0", "features.1"}
    with pytest.raises(ConfigError):
        matching_layers(model, ["classifier"])


def test_fix_initialization_takes_bn_and_head_local_the_rest_global() -> None:
    alg = make(variant="fix")
    glob, local = distinct_states(alg)
    seen, out = round_start(alg, glob, PartialFedState(personal=local))
    for k in alg.parts.init_state:
        want = local[k] if k in BN | HEAD else glob[k]
        assert torch.equal(seen[k], want), k
    assert out.scalars["local_layers"] == 2
    # first round (no local model yet): everything from the global model
    seen, out = round_start(alg, glob, PartialFedState())
    assert all(torch.equal(seen[k], glob[k]) for k in glob) and out.scalars["local_layers"] == 0


def test_fix_with_module_path_rule() -> None:
    alg = make(variant="fix", local_layers=["features.0"])
    glob, local = distinct_states(alg)
    seen, _ = round_start(alg, glob, PartialFedState(personal=local))
    assert all(torch.equal(seen[k], local[k] if k in LIN else glob[k]) for k in glob)


def test_adaptive_samples_the_strategy_and_moves_p_by_the_loss_difference() -> None:
    alg = make(bn=False, variant="adaptive", adaptive_lr=0.5, p_min=0.0)
    glob, local = distinct_states(alg)
    p = torch.tensor([0.3, 0.6])  # layers: features.0, head
    torch.manual_seed(5)
    work = alg.start(Message(arrays=glob), PartialFedState(personal=local, p=p), ctx())
    seen = state_of(work.model)
    torch.manual_seed(5)
    a = torch.bernoulli(p).bool().tolist()  # the same first draw from the global RNG
    pick = {"features.0": a[0], "head": a[1]}

    def loss(src: dict[str, StateDict]) -> float:  # full-batch CE of the model mixed layer by layer, by hand
        x, y = ctx().data.train.tensors
        u = x @ src["features.0"]["features.0.weight"].T + src["features.0"]["features.0.bias"]
        logits = u @ src["head"]["head.weight"].T + src["head"]["head.bias"]
        return -(logits - logits.logsumexp(1, keepdim=True))[torch.arange(4), y].mean().item()

    sampled = {n: local if pick[n] else glob for n in pick}
    assert all(torch.equal(seen[k], sampled["head" if k.startswith("head") else "features.0"][k]) for k in glob)
    want = []
    for i, name in enumerate(["features.0", "head"]):
        l_local, l_glob = loss({**sampled, name: local}), loss({**sampled, name: glob})
        want.append(min(max(p[i].item() - 0.5 * (l_local - l_glob), 0.0), 1.0))
    assert work.p is not None and torch.allclose(work.p, torch.tensor(want), atol=1e-5)
    assert torch.equal(p, torch.tensor([0.3, 0.6]))  # the stored p is not updated in place
    _, state = alg.finish(work, PartialFedState(personal=local, p=p), FitStats())
    assert state.p is work.p  # the updated p is what the client keeps


def test_communicates_everything_and_deploys_the_trained_local_model() -> None:
    alg = make(variant="adaptive")
    server = alg.init_server()
    out, state = fit_client(alg, alg.broadcast(server, info(), 0), alg.init_client(0), ctx())
    assert set(out.arrays) == set(alg.parts.init_state)  # all layers are sent and averaged
    assert isinstance(state, PartialFedState) and state.personal is not None
    assert state.p is None and state.local == {}  # no strategy before a local model exists; no local-only keys
    assert all(torch.equal(state.personal[k], out.arrays[k]) for k in out.arrays)
    server = alg.aggregate(server, [Reply(0, out, 4)], info())
    before = copy.deepcopy(state)
    out2, state2 = fit_client(alg, alg.broadcast(server, info(2), 0), state, ctx(2))
    assert all(torch.equal(state.personal[k], before.personal[k]) for k in before.personal)  # input untouched
    assert state2.p is not None and state2.p.shape == (3,)
    assert ((state2.p >= 0.05) & (state2.p <= 0.95)).all()
    assert state2.personal is not None
    deployed = deployed_model(alg, alg.broadcast(server, info(2), 0), state2, ctx(2))[0].state_dict()
    assert all(torch.equal(deployed[k], state2.personal[k]) for k in deployed)
    fresh = deployed_model(alg, alg.broadcast(server, info(2), 0), alg.init_client(0), ctx(2))[0].state_dict()
    assert all(torch.equal(fresh[k], server.model[k]) for k in fresh)


def test_params_are_validated() -> None:
    for bad in ({"variant": "mixed"}, {"p_min": 0.5}, {"p_init": 0.01}, {"adaptive_lr": -1.0}):
        with pytest.raises(ConfigError):
            PartialFed.Params(**bad).validate()

"""PartialFed: the Fix initialization rule, the Adaptive probability update, communication and client state."""

from __future__ import annotations

import pytest
import torch
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import ClientContext
from fedhet.algorithms.partialfed import PartialFed, layers_of, matching_layers
from fedhet.config import ServerConfig, TrainConfig
from fedhet.engine.local import TrainStats
from fedhet.engine.messages import Message, Reply
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


def ctx() -> ClientContext:
    return ClientContext(0, 1, tiny_client(n=4, in_dim=2), CPU, 2, {"rounds": 2})


def capture_start(alg: PartialFed) -> dict:
    """Replace local training by a recorder of the round-start model (so the initialization is visible)."""
    seen: dict = {}

    def record(model, msg, state, ctx, dataset=None) -> TrainStats:  # noqa: ANN001
        seen.update({k: v.clone() for k, v in model.state_dict().items()})
        return TrainStats(0.0, 0, 0)

    alg.local_train = record  # type: ignore[method-assign]
    return seen


def distinct_states(alg: PartialFed) -> tuple[dict, dict]:
    glob = {k: (v + 1.0 if v.is_floating_point() else v + 7) for k, v in alg._init_state.items()}
    local = {k: (v - 2.0 if v.is_floating_point() else v + 3) for k, v in alg._init_state.items()}
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
    seen = capture_start(alg)
    out, state = alg.fit(Message(arrays=glob), {"local": local}, ctx())
    for k in alg._init_state:
        want = local[k] if k in BN | HEAD else glob[k]
        assert torch.equal(seen[k], want), k
    assert out.scalars["local_layers"] == 2
    # first round (no local model yet): everything from the global model
    seen.clear()
    alg.fit(Message(arrays=glob), {}, ctx())
    assert all(torch.equal(seen[k], glob[k]) for k in glob)


def test_fix_with_module_path_rule() -> None:
    alg = make(variant="fix", local_layers=["features.0"])
    glob, local = distinct_states(alg)
    seen = capture_start(alg)
    alg.fit(Message(arrays=glob), {"local": local}, ctx())
    assert all(torch.equal(seen[k], local[k] if k in LIN else glob[k]) for k in glob)


def test_adaptive_samples_the_strategy_and_moves_p_by_the_loss_difference() -> None:
    alg = make(bn=False, variant="adaptive", adaptive_lr=0.5, p_min=0.0)
    glob, local = distinct_states(alg)
    p = torch.tensor([0.3, 0.6])  # layers: features.0, head
    seen = capture_start(alg)
    torch.manual_seed(5)
    _, state = alg.fit(Message(arrays=glob), {"local": local, "p": p}, ctx())
    torch.manual_seed(5)
    a = torch.bernoulli(p).bool().tolist()  # the same first draw from the global RNG
    pick = {"features.0": a[0], "head": a[1]}

    def loss(src: dict[str, dict]) -> float:  # full-batch CE of the model mixed layer by layer, by hand
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
    assert torch.allclose(state["p"], torch.tensor(want), atol=1e-5)


def test_communicates_everything_and_deploys_the_trained_local_model() -> None:
    alg = make(variant="adaptive")
    server = alg.init_server()
    out, state = alg.fit(alg.broadcast(server, 1, 0), {}, ctx())
    assert set(out.arrays) == set(alg._init_state)  # all layers are sent and averaged
    assert set(state) == {"local"}  # no strategy before a local model exists
    assert all(torch.equal(state["local"][k], out.arrays[k]) for k in out.arrays)
    server = alg.aggregate(server, [Reply(0, out, 4)])
    out2, state2 = alg.fit(alg.broadcast(server, 2, 0), state, ctx())
    assert state2["p"].shape == (3,) and ((state2["p"] >= 0.05) & (state2["p"] <= 0.95)).all()
    deployed = alg.deploy_model(alg.broadcast(server, 2, 0), state2, ctx()).state_dict()
    assert all(torch.equal(deployed[k], state2["local"][k]) for k in deployed)
    fresh = alg.deploy_model(alg.broadcast(server, 2, 0), {}, ctx()).state_dict()
    assert all(torch.equal(fresh[k], server["global"][k]) for k in fresh)


def test_params_are_validated() -> None:
    for bad in ({"variant": "mixed"}, {"p_min": 0.5}, {"p_init": 0.01}, {"adaptive_lr": -1.0}):
        with pytest.raises(ConfigError):
            PartialFed.Params(**bad).validate()

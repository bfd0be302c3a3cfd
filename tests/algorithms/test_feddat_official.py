"""FedDAT's losses and update against hand computations, with the official code's defaults and the paper's
switches (HaokunChen245/FedDAT task_trainer.py 280-330, 506-516): L^s = CE + KL(p_DAT || p_s), L^DAT = CE +
KL(p_s || p_DAT) with the pre-step z_s, the head stepping on both, Â_s the received A_s; the official LR schedule,
prompt and LoRA baselines. Each test fails on a broken variant (docs/feddat.md, "Tests")."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from fedhet_testing import TINY_VL

pytest.importorskip("easy_vqa")

from fedhet.config import load_config  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.losses.distillation import exp_rampup  # noqa: E402
from fedhet.models.peft.insertion import adapter_named_parameters, adapter_path  # noqa: E402
from fedhet.models.peft.prompt import ReparamPrompts  # noqa: E402

BASE = [*TINY_VL, "train.local_steps=3", "train.batch_size=16", "run.num_threads=1", "run.quiet=true"]
T = 3.0


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(softmax(p / T) || softmax(q / T)) * T^2, batch mean, written out over the client's pool."""
    pool = torch.isfinite(p_logits[0])
    p, q = torch.softmax(p_logits[:, pool] / T, -1), torch.softmax(q_logits[:, pool] / T, -1)
    return float((p * (p.log() - q.log())).sum(-1).mean()) * T * T


class Recorder:
    """Optimizers that record (name, loss, parameters with a gradient, the logits (z_s, z_DAT) before the step),
    then move each parameter with a gradient by one plain SGD step of `lr`."""

    def __init__(self, alg: Any, work: Any, x: Any, lr: float = 0.0) -> None:
        self.alg, self.work, self.x, self.lr, self.calls = alg, work, x, lr, []  # type: ignore[var-annotated]

    def step(self, loss: torch.Tensor, name: str = "model") -> None:
        model = self.work.model
        before = (logits(self.alg, self.work, self.x, "shared"), logits(self.alg, self.work, self.x, "dat"))
        model.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)
        grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        self.calls.append((name, float(loss), grads, before))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in grads and self.lr:
                    p -= self.lr * p.grad

    def step_each(self, losses: dict[str, torch.Tensor]) -> None:
        for name, loss in losses.items():
            self.step(loss, name)


def started(*extra: str) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """A FedDAT fit started from a message whose A_s is not the initial one, A_c and the head far from zero."""
    exp = build_experiment(load_config(None, [*BASE, "method=feddat", *extra]))
    alg = exp.algorithm
    gen = torch.Generator().manual_seed(0)
    msg = alg.broadcast(exp.init_server(), exp.round_info(1), 0)
    msg.arrays = {k: v + 2.0 * torch.randn(v.shape, generator=gen) for k, v in msg.arrays.items()}
    state = alg.init_client(0)
    head = {k: v for k, v in alg.parts.template.state_dict().items() if k.startswith("head.")}
    state.local = {k: v + (2.0 if ".slots.client." in k else 1.0) * torch.randn(v.shape, generator=gen)
                   for k, v in {**state.local, **head}.items()}  # A_c and the head far from their small inits
    work = alg.start(msg, state, exp.context(0, 1, exp.data.clients[0]))
    return alg, work, msg.arrays


def logits(alg: Any, work: Any, x: Any, path: str) -> torch.Tensor:
    with torch.no_grad(), adapter_path(work.model, path):
        return alg.logits(work.model, x, work.ctx)


def groups(names: set[str]) -> set[str]:
    return {"head" if n.startswith("head.") else n.split(".slots.")[1].split(".")[0] for n in names}


def test_the_official_step_by_hand() -> None:
    """Official defaults: L^s = CE(z_s) + T^2 KL(p_DAT || p_s) moves A_s and the head; L^DAT = CE(z_DAT) +
    T^2 KL(p_s || p_DAT) moves A_c and the head; one optimizer ("model") steps twice."""
    alg, work, _ = started()
    x, y = next(iter(torch.utils.data.DataLoader(work.ctx.data.train, batch_size=16)))
    opt = Recorder(alg, work, x, lr=1.0)
    alg.dat_step(work, x, y, opt)
    (name_s, loss_s, grads_s, (z_s, z_dat)), (name_dat, loss_dat, grads_dat, (z_s_after, z_dat_after)) = opt.calls
    ce = torch.nn.functional.cross_entropy  # A_c's target: z_s before A_s stepped; its logits: after
    want_s, want_dat = float(ce(z_s, y)) + kl(z_dat, z_s), float(ce(z_dat_after, y)) + kl(z_s, z_dat_after)
    assert kl(z_dat, z_s) > 1e-3 and abs(kl(z_dat, z_s) - kl(z_s, z_dat)) > 1e-4  # the direction is visible
    assert abs(kl(z_s, z_dat_after) - kl(z_s_after, z_dat_after)) > 1e-4  # the pre-step target is visible
    assert name_s == name_dat == "model"
    assert math.isclose(loss_s, want_s, rel_tol=1e-5) and math.isclose(loss_dat, want_dat, rel_tol=1e-5)
    assert groups(grads_s) == {"shared", "head"} and groups(grads_dat) == {"client", "head"}


def test_the_paper_step_by_hand() -> None:
    """update=simultaneous kl_direction=printed head_losses=shared: KL(p_s || p_DAT) for A_s, the reverse for
    A_c, the head on L^s only."""
    alg, work, _ = started("method_args.update=simultaneous", "method_args.kl_direction=printed",
                           "method_args.head_losses=shared")
    x, y = next(iter(torch.utils.data.DataLoader(work.ctx.data.train, batch_size=16)))
    z_s, z_dat = logits(alg, work, x, "shared"), logits(alg, work, x, "dat")
    ce = torch.nn.functional.cross_entropy
    opt = Recorder(alg, work, x)
    alg.dat_step(work, x, y, opt)
    (name_s, loss_s, grads_s, _), (name_dat, loss_dat, grads_dat, _) = opt.calls
    assert (name_s, name_dat) == ("shared", "client")
    assert math.isclose(loss_s, float(ce(z_s, y)) + kl(z_s, z_dat), rel_tol=1e-5)
    assert math.isclose(loss_dat, float(ce(z_dat, y)) + kl(z_dat, z_s), rel_tol=1e-5)
    assert groups(grads_s) == {"shared", "head"} and "client" in groups(grads_dat)
    specs = alg.passes(work)[0].optimizers
    owned = {name: {id(p) for p in spec.params} for name, spec in specs.items()}
    head = {id(p) for p in work.model.head.parameters()}
    assert set(specs) == {"shared", "client"} and head <= owned["shared"] and not head & owned["client"]


def test_the_ramp_advances_once_a_batch_and_head_losses_shared_keeps_the_head_out_of_L_DAT() -> None:
    """Sequential update, ramp=exp, head_losses=shared: batch k weighs the KL terms by exp_rampup(k, steps), and
    L^DAT (through the head with its weights detached) moves A_c only."""
    alg, work, _ = started("method_args.ramp=exp", "method_args.head_losses=shared")
    x, y = next(iter(torch.utils.data.DataLoader(work.ctx.data.train, batch_size=16)))
    ce = torch.nn.functional.cross_entropy
    for k in range(3):
        opt = Recorder(alg, work, x)
        alg.dat_step(work, x, y, opt)
        (_, loss_s, grads_s, (z_s, z_dat)), (_, loss_dat, grads_dat, (_, z_dat_after)) = opt.calls
        w = exp_rampup(k, work.steps)
        assert math.isclose(loss_s, float(ce(z_s, y)) + w * kl(z_dat, z_s), rel_tol=1e-5)
        assert math.isclose(loss_dat, float(ce(z_dat_after, y)) + w * kl(z_s, z_dat_after), rel_tol=1e-5)
        assert groups(grads_s) == {"shared", "head"} and groups(grads_dat) == {"client"}
    assert work.step == 3 and work.steps == 3


def test_frozen_copy_is_refreshed_from_the_received_A_s_at_fit_and_deployment() -> None:
    alg, work, received = started("method_args.inference=dat")

    def is_received(model: torch.nn.Module) -> bool:
        frozen = dict(adapter_named_parameters(model, "frozen_shared"))
        return bool(frozen) and all(torch.equal(p, received[k.replace(".frozen_shared.", ".shared.")])
                                    for k, p in frozen.items())

    assert is_received(work.model)  # before deploy, which reuses the same workspace model
    work.model.apply(lambda m: [p.data.zero_() for p in m.parameters(recurse=False)])
    assert is_received(alg.deploy(work.msg, alg.init_client(0), work.ctx).model)


def test_official_schedule_climbs_twice_as_fast_for_feddat() -> None:
    """A fresh warm-up sized for 15 epochs each round, advanced at every optimizer step (FedDAT: two a batch);
    official_per_batch advances once a batch."""
    alg, work, _ = started()
    n = work.ctx.data.num_train
    batches = math.ceil(n / 16) if n % 16 != 1 else n // 16
    total, warm = 15 * batches, int(0.1 * 15 * batches)
    factor = alg.lr_factor(work.ctx)
    assert [factor(t) for t in range(4)] == [t / warm for t in range(4)]
    assert math.isclose(factor(total - 1), 1 / (total - warm))
    per_batch, _, _ = started("method_args.lr_schedule=official_per_batch")
    assert [per_batch.lr_factor(work.ctx)(t) for t in range(4)] == [0.0, 0.0, 1 / warm, 1 / warm]


def test_official_prompts_are_reparameterised_and_counted() -> None:
    assert sum(p.numel() for p in ReparamPrompts(768, 5, 5).parameters()) == 599_424  # "0.60M" at d = 768
    exp = build_experiment(load_config(None, [*BASE, "method=peft", "method_args.kind=prompt"]))
    d = 16
    assert exp.algorithm.peft.communicated_count == 2 * (5 * d + d * (d // 4) + d // 4 + (d // 4) * d + d)


def test_official_lora_replaces_the_pretrained_projections() -> None:
    """lora_form=official: the q / v base weights are fresh draws (frozen, the same in every copy), not the
    backbone's; lora_form=peft keeps them."""
    def base(form: str) -> dict[str, torch.Tensor]:
        exp = build_experiment(load_config(None, [*BASE, "method=peft", "method_args.kind=lora",
                                                  f"method_args.lora_form={form}"]))
        alg = exp.algorithm
        assert not set(alg.peft.communicated) & {k for k in alg.parts.template.state_dict() if "base_layer" in k}
        assert torch.equal(alg.parts.new().state_dict()[KEY], alg.parts.template.state_dict()[KEY])
        return alg.parts.template.state_dict()

    raw = build_experiment(load_config(None, [*BASE, "method=peft", "method_args.kind=clf"])).algorithm
    original = raw.parts.template.state_dict()[KEY.replace(".base_layer", "")]
    assert torch.equal(base("peft")[KEY], original) and not torch.equal(base("official")[KEY], original)


KEY = "features.encoder.layer.0.attention.attention.query.base_layer.weight"

"""FRAug's cost: Table 4 (parameters / MACs of classifier, generator, RTNet) and FRAug vs FedBN per local step.

Three measurements, all computed from the models and the algorithm code, nothing typed in:
1. Table 4: parameters and forward MACs (one example) of the classifier (feature extractor + head), the shared
   generator g and the local RTNet m, for the paper's settings (Digits CNN at 32 px; ResNet-18 at 224 px with
   the 512-d features of the PACS/OfficeHome setting) and for the CPU settings used here (Digits CNN at 28 px,
   EfficientNet-Lite0 at 128 px).
2. Operations per local step: one client's `fit` of one round with `local_steps` steps is run under
   `torch.utils.flop_counter.FlopCounterMode`, which counts every matmul / convolution FLOP of the forward AND
   backward passes, for FRAug and for FedBN on the same data; the ratio is FRAug's extra work.
3. Wall time per round: `rounds` full rounds (all clients, no evaluation) of FRAug and FedBN, alternated so
   that machine noise hits both alike; the median over rounds after the first is reported.

    FEDHET_DATA=/path/to/shared/data python benchmarks/fraug_cost.py --config configs/cpu/digits.yaml \
        --out docs/results/fraug_cost_digits.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from fedhet.atomic import atomic_write_text
from fedhet.config import ExperimentConfig, load_config
from fedhet.core.seeding import seeded
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import fit_client
from fedhet.launch.sweep import plan_sweep
from fedhet.models import build_model, count_params_and_macs
from fedhet.models.fraug_nets import Generator, RTNet
from fedhet.runtimes.inprocess import InProcessClients

Z_DIM = 256  # FRAug appendix: d_z = 256 for every dataset


def table4(settings: list[tuple[str, str, int, int]]) -> list[dict[str, Any]]:
    """Params (M) and forward MACs (G, one example) of classifier, generator and RTNet per (name, model, px, C)."""
    rows = []
    for label, model_name, px, num_classes in settings:
        model = build_model(model_name, num_classes, (3, px, px), pretrained=False)
        cls_params, cls_macs = count_params_and_macs(model, (3, px, px))
        feat_params, feat_macs = count_params_and_macs(model.features, (3, px, px))
        d_u = model.feature_dim
        g_params, g_macs = count_params_and_macs(_GenOnZ(Generator(Z_DIM, num_classes, d_u)), (Z_DIM,))
        rt_params, rt_macs = count_params_and_macs(RTNet(d_u, Z_DIM), (d_u,))
        rows.append({"setting": label, "model": model_name, "image_px": px, "classes": num_classes,
                     "feature_dim": d_u, "classifier_params": cls_params, "classifier_macs": cls_macs,
                     "feature_extractor_params": feat_params, "feature_extractor_macs": feat_macs,
                     "generator_params": g_params, "generator_macs": g_macs,
                     "rtnet_params": rt_params, "rtnet_macs": rt_macs})
    return rows


class _GenOnZ(torch.nn.Module):
    """The generator called with label 0 so that the MAC counter can feed it one input tensor."""

    def __init__(self, gen: Generator) -> None:
        super().__init__()
        self.gen = gen

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.gen(z, torch.zeros(len(z), dtype=torch.long, device=z.device))


def _experiment(cfg: ExperimentConfig, method: str) -> Experiment:
    """The experiment of `method` as the config's sweep would run it (with its per-method overrides)."""
    return build_experiment(plan_sweep(cfg, methods=[method], seeds=[cfg.seed]).configs[0])


def _train_round(exp: Experiment, clients: InProcessClients, server: Any, rnd: int) -> Any:
    """One round of local training of every client and the aggregation, as the in-process runtime runs it."""
    alg = exp.algorithm
    info = exp.round_info(rnd)
    replies = clients.fit(rnd, {cid: alg.broadcast(server, info, cid) for cid in range(clients.num_train_clients)})
    return alg.aggregate(server, replies, info)


def flops_per_step(exp: Experiment, steps: int) -> float:
    """Forward + backward FLOPs of one local step of client 0 in round 1 (FlopCounterMode)."""
    alg = exp.algorithm
    server, state = alg.init_server(), alg.init_client(0)
    ctx = exp.context(0, 1)
    counter = FlopCounterMode(display=False)
    with seeded(exp.config.seed, 1, 0, "fit"), counter:
        fit_client(alg, alg.broadcast(server, ctx.info, 0), state, ctx)
    return counter.get_total_flops() / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per method (the first is warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [f"run.num_threads={args.threads}"])
    steps = int(cfg.train.local_steps or 0)
    if not steps:
        raise SystemExit("fraug_cost.py needs a config with train.local_steps")
    exps = {m: _experiment(cfg, m) for m in ("fedbn", "fraug")}
    flops = {m: flops_per_step(e, steps) for m, e in exps.items()}
    result: dict[str, Any] = {
        "config": args.config, "fraug_args": exps["fraug"].config.method_args, "local_steps": steps,
        "batch_size": cfg.train.batch_size,
        "flops_per_local_step": flops, "fraug_extra_flops_percent": 100 * (flops["fraug"] / flops["fedbn"] - 1),
        "table4": table4([("Digits (paper: 32 px)", "digits_cnn", 32, 10),
                          ("Digits (CPU runs: 28 px)", "digits_cnn", 28, 10),
                          ("PACS/OfficeHome (paper: ResNet-18, 224 px)", "resnet18", 224, 7),
                          ("PACS (CPU runs: EfficientNet-Lite0, 128 px)", "efficientnet_lite0", 128, 7)]),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "threads": args.threads,
        "torch": torch.__version__, "device": "cpu",
    }
    if not args.skip_timing:
        times: dict[str, list[float]] = {m: [] for m in exps}
        clients = {m: InProcessClients(e) for m, e in exps.items()}
        servers = {m: e.algorithm.init_server() for m, e in exps.items()}
        for rnd in range(1, args.rounds + 1):
            for m, e in exps.items():
                t0 = time.perf_counter()
                servers[m] = _train_round(e, clients[m], servers[m], rnd)
                times[m].append(time.perf_counter() - t0)
        med = {m: statistics.median(t[1:]) for m, t in times.items()}
        result.update(round_times_s=times, median_round_time_s=med,
                      fraug_extra_time_percent=100 * (med["fraug"] / med["fedbn"] - 1))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()

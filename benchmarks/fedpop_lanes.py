"""Lanes vs one after another (issue 18's speed goals; docs/results/runtimes.md "Lanes").

`micro`: 64 clients, `--steps` SGD steps of batch 32 each, for MLPs of several sizes (in-hidden-10, ReLU), on
Synthetic-style 8-client data of that input size cycled to 64 clients (pre-made tensors: data loading as the
runtimes do it, no image transforms). Four timings of the same work, median of `--repeats` after a warm-up:
  * `bare_seq`   a plain loop: per client a model, torch.optim.SGD, forward / backward / step;
  * `inprocess`  fedhet's in-process runtime (`InProcessClients.fit`), what a run costs one client at a time;
  * `bare_vmap`  plain `vmap(grad(...))` over stacked parameters and a hand SGD update, batches pre-stacked;
  * `batched`    fedhet's batched runtime as users run it (`BatchedClients.fit`: per-client batch streams,
                 stacking, the functional optimizer, copying back; where its calibration measures lanes slower
                 on this machine it trains the clients one after another, in-process code: policy.py);
  * `lanes`      the same with lanes forced (`run.batched_min_lanes=1`): what the lanes cost where they do not pay;
  * `batched_steps`  its vectorized steps alone (`PassRunner.run` on batches drawn beforehand): what it adds to
                 bare vmap by stacking, masking and its optimizer, without the per-client data loading.
Goals: batched_steps / bare_vmap <= 1.2 (a; batched / bare_vmap beside it); inprocess / batched >= 4 for the
60-20-10 MLP (b); batched never slower than inprocess by more than 10% (c).

`compiled`: the plain vmap step of `micro` eager and under `torch.compile` (inductor; needs a C++ compiler on a CPU),
with the time to compile (the first call, a cold or warm inductor cache as it comes): what a compiled vectorized step
could give the batched runtime, which does not compile its steps (docs/results/runtimes.md "Lanes").
`compiled_shapes`: that compiled step (`dynamic=True`) called with the (lanes, batch) shapes of a FedPop job's steps:
what each new shape costs (Dynamo compiles the vmapped step once per shape).

`tune`: one FedPop job (RS + FedPop, 5 configurations) on Synthetic(0.5, 0.5) with the 60-20-10 MLP, timed end
to end with `run.runtime=inprocess` and `run.runtime=batched` (goal d: >= 3x), with the paper's client space and
with the batch size fixed (the space then has no value that splits lanes into groups); the paper's space also with
`run.batched_accumulate` (lanes of every batch size in one group, their batches split into micro-batches of 8).

    python benchmarks/fedpop_lanes.py micro --out docs/results/fedpop_lanes_micro.json
    python benchmarks/fedpop_lanes.py tune --rounds 10 --out docs/results/fedpop_lanes_tune.json
    python benchmarks/fedpop_lanes.py compiled --out docs/results/fedpop_lanes_compiled.json
    python benchmarks/fedpop_lanes.py compiled_shapes --out docs/results/fedpop_lanes_compiled_shapes_xeon.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.core.seeding import FIT, client_stream
from fedhet.data.synthetic import register_synthetic
from fedhet.engine.experiment import Experiment, arrange, build_experiment
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.batched.data import BatchStream, ClientRng
from fedhet.runtimes.batched.runtime import FitJob
from fedhet.runtimes.inprocess import InProcessClients
from fedhet.tune.run import run_tuning

SIZES = [(13, 32), (60, 20), (60, 32), (784, 64), (2352, 32), (784, 200)]
CLIENTS, BATCH, LR = 64, 32, 0.05


def experiment(d_in: int, hidden: int, steps: int, device: str = "cpu") -> Experiment:
    """64 clients of Synthetic-style data with `d_in` features, an MLP d_in-hidden-10, FedAvg, plain SGD."""
    name = f"bench_synthetic_{d_in}_{hidden}"
    register_synthetic(name, 0.5, 0.5, input_dim=d_in, samples_per_client=3 * BATCH * steps)
    cfg = load_config(None, [f"data.dataset={name}", "model.name=mlp", f"model.args={{hidden: [{hidden}]}}",
                             f"train.local_steps={steps}", f"train.batch_size={BATCH}", f"train.lr={LR}",
                             "train.momentum=0", "run.quiet=true", "run.runtime=batched", f"run.device={device}"])
    exp = build_experiment(cfg)
    clients = [dataclasses.replace(exp.data.clients[k % len(exp.data.clients)], name=f"client{k}")
               for k in range(CLIENTS)]  # the clients' own datasets, as a run holds them
    data = dataclasses.replace(exp.data, clients=clients)
    return dataclasses.replace(exp, data=data, arrangement=arrange(exp.algorithm, data))


def timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bare(exp: Experiment, steps: int, compiled: bool = False) -> tuple[Callable[[], None], Callable[[], None]]:
    """The plain sequential loop and the plain vmap loop over the same pre-drawn batches (`compiled`: the vmap
    loop's step under `torch.compile`)."""
    dev = exp.device
    model = exp.algorithm.parts.new().to(dev)
    gen = torch.Generator().manual_seed(0)
    batches = []
    for client in exp.data.clients:
        x, y = client.train.batch(list(range(len(client.train))))  # type: ignore[attr-defined,arg-type]
        idx = torch.randperm(len(y), generator=gen)[: steps * BATCH].view(steps, BATCH)
        batches.append((x[idx].to(dev), y[idx].to(dev)))
    xs, ys = torch.stack([b[0] for b in batches], 1), torch.stack([b[1] for b in batches], 1)  # steps, clients, ...
    loss = nn.CrossEntropyLoss()

    def sequential() -> None:
        for x, y in batches:
            net = exp.algorithm.parts.new().to(dev)
            opt = torch.optim.SGD(net.parameters(), lr=LR)
            for t in range(steps):
                opt.zero_grad()
                loss(net(x[t]), y[t]).backward()
                opt.step()

    params = {k: v.detach() for k, v in model.named_parameters()}

    def lane_loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss(functional_call(model, p, (x,)), y)

    grads = vmap(grad(lane_loss))

    def sgd(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        g = grads(p, x, y)
        return {k: v - LR * g[k] for k, v in p.items()}

    step = torch.compile(sgd) if compiled else sgd

    def vectorized() -> None:
        p = {k: v.unsqueeze(0).expand(CLIENTS, *v.shape).clone() for k, v in params.items()}
        for t in range(steps):
            p = step(p, xs[t], ys[t])

    return sequential, vectorized


class PreDrawn:
    """A client's batches of one pass, drawn beforehand (the interface of `BatchStream`)."""

    def __init__(self, stream: BatchStream) -> None:
        self.steps = stream.steps
        self.batches = [stream.next() for _ in range(stream.steps)]
        self.drawn = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.drawn += 1
        return self.batches[self.drawn - 1]


def steps_only(runner: BatchedClients, messages: dict[int, Any]) -> Callable[[], None]:
    """The vectorized steps of one round of `runner`'s clients, on batches drawn beforehand."""
    jobs = [FitJob(runner.alg, cid, msg, runner.states[cid]) for cid, msg in messages.items()]
    rngs = [ClientRng(*client_stream(0, 1, job.cid, FIT)) for job in jobs]
    lanes = [runner._lane(job, 1, rng) for job, rng in zip(jobs, rngs, strict=True)]
    layout = runner._check(lanes)
    streams = [PreDrawn(BatchStream(rng, runner.train_data[job.cid].train, lane.passes[0].train))
               for job, rng, lane in zip(jobs, rngs, lanes, strict=True)]

    def run() -> None:
        state = {k: torch.stack([lane.states[k] for lane in lanes]).to(runner.exp.device) for k in lanes[0].states}
        for stream in streams:
            stream.drawn = 0
        runner._runner(lanes, 0, layout, [{} for _ in jobs], state).run(streams, {})  # type: ignore[arg-type]

    return run


def micro(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for d_in, hidden in SIZES:
        exp = experiment(d_in, hidden, args.steps, args.device)
        alg = exp.algorithm
        msg = alg.broadcast(alg.init_server(), exp.round_info(1), 0)
        messages = {cid: msg for cid in range(CLIENTS)}
        seq, vec = bare(exp, args.steps)
        inproc, batched = InProcessClients(exp), BatchedClients(exp)
        lanes_cfg = dataclasses.replace(exp.config, run=dataclasses.replace(exp.config.run, batched_min_lanes=1))
        forced = BatchedClients(dataclasses.replace(exp, config=lanes_cfg))
        row: dict[str, Any] = {"mlp": f"{d_in}-{hidden}-10", "params": sum(p.numel() for p in alg.parts.new()
                                                                          .parameters())}
        row["bare_seq_s"] = timed(seq, args.repeats)
        row["inprocess_s"] = timed(lambda: inproc.fit(1, messages), args.repeats)  # noqa: B023 (called at once)
        row["bare_vmap_s"] = timed(vec, args.repeats)
        row["batched_s"] = timed(lambda: batched.fit(1, messages), args.repeats)  # noqa: B023
        row["lanes_s"] = timed(lambda: forced.fit(1, messages), args.repeats)  # noqa: B023
        row["batched_steps_s"] = timed(steps_only(forced, messages), args.repeats)
        row["a_steps_over_vmap"] = row["batched_steps_s"] / row["bare_vmap_s"]
        row["batched_over_vmap"] = row["batched_s"] / row["bare_vmap_s"]
        row["b_inprocess_over_batched"] = row["inprocess_s"] / row["batched_s"]
        row["inprocess_over_lanes"] = row["inprocess_s"] / row["lanes_s"]
        row["bare_seq_over_bare_vmap"] = row["bare_seq_s"] / row["bare_vmap_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def compiled(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for d_in, hidden in SIZES:
        exp = experiment(d_in, hidden, args.steps, args.device)
        _, eager = bare(exp, args.steps)
        _, fast = bare(exp, args.steps, compiled=True)
        start = time.perf_counter()
        fast()  # the first call compiles
        row: dict[str, Any] = {"mlp": f"{d_in}-{hidden}-10", "compile_s": time.perf_counter() - start,
                               "bare_vmap_s": timed(eager, args.repeats), "compiled_vmap_s": timed(fast, args.repeats)}
        row["eager_over_compiled"] = row["bare_vmap_s"] / row["compiled_vmap_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def compiled_shapes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The compiled plain vmap SGD step of the 60-20-10 MLP (`torch.compile(dynamic=True)`) called with the
    (lanes, batch) shapes a FedPop job gives its steps: the first call of each shape, and Dynamo's graph count."""
    from torch._dynamo.utils import counters

    model = experiment(60, 20, args.steps, args.device).algorithm.parts.new()
    loss = nn.CrossEntropyLoss()
    grads = vmap(grad(lambda p, x, y: loss(functional_call(model, p, (x,)), y)))
    step = torch.compile(lambda p, x, y: {k: v - LR * g for (k, v), g in zip(p.items(), grads(p, x, y).values(),
                                                                              strict=True)}, dynamic=True)
    rows = []
    for lanes, batch in [(64, 32), (32, 32), (16, 32), (16, 8), (16, 7), (13, 32), (64, 32)]:
        p = {k: v.detach().unsqueeze(0).repeat(lanes, *[1] * v.dim()) for k, v in model.named_parameters()}
        x, y = torch.randn(lanes, batch, 60), torch.randint(0, 10, (lanes, batch))
        start = time.perf_counter()
        step(p, x, y)
        row = {"lanes": lanes, "batch": batch, "first_call_s": time.perf_counter() - start,
               "graphs": counters["stats"]["unique_graphs"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def tune(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    base = ["data.dataset=synthetic_a05_b05", "model.name=mlp", "model.args={hidden: [20]}", "data.val_fraction=0.2",
            "data.test_fraction=0.2", f"rounds={args.rounds}", "run.quiet=true", "tune.configs=5",
            "train.local_steps=null", "eval.every=1000"]
    spaces = {"paper": "tune.space=fedavg",
              "fixed_batch": "tune.space={client: {train.lr: {type: log_uniform, low: -4, high: 0}, train.momentum: "
                             "{type: uniform, low: 0, high: 0.99}, train.weight_decay: {type: log_uniform, low: -5, "
                             "high: -1}, train.local_epochs: {type: int, low: 1, high: 5}}, server: {server.lr: "
                             "{type: log_uniform, low: -1, high: 1}}}"}
    runtimes = {"inprocess": ["run.runtime=inprocess"], "batched": ["run.runtime=batched"],
                "accumulate": ["run.runtime=batched", "run.batched_accumulate=true"]}
    for space, override in spaces.items():
        row: dict[str, Any] = {"space": space, "rounds": args.rounds}
        for runtime, settings in runtimes.items():
            if runtime == "accumulate" and space == "fixed_batch":
                continue  # one batch size: nothing to split
            cfg = load_config(None, [*base, override, *settings])
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                result = run_tuning(cfg, tmp, progress=False)
                row[f"{runtime}_s"] = time.perf_counter() - start
                row[f"{runtime}_selected"] = result.summary["tune"].get("values")
        row["d_inprocess_over_batched"] = row["inprocess_s"] / row["batched_s"]
        if "accumulate_s" in row:
            row["d_inprocess_over_accumulate"] = row["inprocess_s"] / row["accumulate_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["micro", "compiled", "compiled_shapes", "tune"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="micro: cpu or cuda (the GPU goal)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = {"micro": micro, "compiled": compiled, "compiled_shapes": compiled_shapes, "tune": tune}[args.part](args)
    payload = {"benchmark": f"fedpop_lanes_{args.part}", "torch": torch.__version__,
               "python": platform.python_version(), "machine": platform.machine(), "threads": args.threads,
               "args": vars(args), "results": rows}
    if args.out:
        atomic_write_text(args.out, json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Flower overhead: per-round wall time of one workload in-process, on Flower's simulation engine, on a Flower
deployment (SuperLink + one SuperNode per client on 127.0.0.1, `flwr run`), and Flower's own floor: the same
deployment running a no-op ServerApp / ClientApp pair that sends the same waves (train to every client each
round, evaluate to every client in the rounds the workload evaluates: every `eval.every` rounds and the last)
with a payload of the same size, and does nothing with it.

Workload: configs/quickstart.yaml (offline_digits, 4 clients, one domain each) with FedBN, CPU, one torch
thread. Per-round times are the loop's own (after start-up: Ray / processes / node mapping excluded; the
whole wall time is reported beside them). The floor's no-op ClientApp imports only Flower and numpy; with
`--floor-imports torch,fedhet` it also imports what fedhet's ClientApp imports, which separates Flower's
per-message cost from the cost of importing torch in every ClientApp process.

    python benchmarks/flower_overhead.py --rounds 5 --out docs/results/flower_overhead.json
    python benchmarks/flower_overhead.py --rounds 1 --modes inprocess,floor --out /tmp/smoke.json   # smoke

`goal_ratio` = deployment per-round / (floor per-round + in-process per-round); the issue's goal is <= 1.10.
Flower's files go to a temporary FLWR_HOME per deployment (never ~/.flwr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import torch  # noqa: E402

from fedhet.atomic import atomic_write_text  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.runtimes.flower.federation import TASK_POLL_INTERVAL  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("inprocess", "simulation", "deployment", "deployment-no-workers", "floor")

NOOP_APP = '''"""No-op Flower apps: Flower's own per-round floor for `rounds` waves of train + evaluate messages."""
import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

{imports}
server_app = ServerApp()
client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    print(f"[noop] handler {{time.time():.3f}}", flush=True)  # read by benchmarks/flower_breakdown.py
    return Message(RecordDict({{"arrays": msg.content.array_records["arrays"]}}), reply_to=msg)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    print(f"[noop] handler {{time.time():.3f}}", flush=True)
    return Message(RecordDict({{"metrics": MetricRecord({{"accuracy": 0.0, "loss": 0.0}})}}), reply_to=msg)


def send(grid: Grid, messages: list, poll: float, wave: dict) -> list:
    wave["push"] = time.time()  # wall clock: compared with Flower's log timestamps
    if poll <= 0:  # Flower's own send_and_receive (polls every 3 s)
        replies = list(grid.send_and_receive(messages, timeout=600))
        wave["replies"] = {{str(r.metadata.src_node_id): time.time() for r in replies}}
        return replies
    pending, replies, deadline = set(grid.push_messages(messages)), [], time.monotonic() + 600
    wave["replies"] = {{}}
    while pending and time.monotonic() < deadline:
        got = list(grid.pull_messages(list(pending)))
        replies += got
        wave["replies"].update({{str(m.metadata.src_node_id): time.time() for m in got}})
        pending -= {{m.metadata.reply_to_message_id for m in got}}
        if pending:
            time.sleep(poll)
    return replies


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes, rounds, poll = int(cfg["nodes"]), int(cfg["rounds"]), float(cfg["poll-interval"])
    every = int(cfg["eval-every"])
    while len(ids := list(grid.get_node_ids())) < nodes:
        time.sleep(0.5)
    arrays = ArrayRecord({{"w": Array(np.zeros(int(cfg["payload-floats"]), np.float32))}})
    times, waves = [], []
    for rnd in range(1, rounds + 1):
        start = time.perf_counter()
        for kind in ("train", "evaluate") if rnd % every == 0 or rnd == rounds else ("train",):
            msgs = [Message(RecordDict({{"arrays": arrays}}), dst_node_id=n, message_type=kind, group_id=str(rnd))
                    for n in ids]
            waves.append({{"round": rnd, "kind": kind}})
            replies = send(grid, msgs, poll, waves[-1])
            assert len(replies) == nodes and not any(r.has_error() for r in replies), replies
        times.append(time.perf_counter() - start)
    Path(str(cfg["out"])).write_text(json.dumps({{"round_s": times, "waves": waves}}))
'''


def workload(rounds: int, overrides: list[str]):
    return load_config(ROOT / "configs" / "quickstart.yaml",
                       ["method=fedbn", f"rounds={rounds}", "run.device=cpu", "run.num_threads=1", "run.quiet=true",
                        "run.checkpoint_every=1000", *overrides])


def _summary(run_dir: Path, wall: float) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"round_s": summary["round_time_s"], "total_s": wall}


def run_inprocess(cfg, work: Path) -> dict[str, Any]:
    from fedhet.launch.run import run_experiment

    start = time.perf_counter()
    run_experiment(cfg, work / "inprocess", progress=False)
    return _summary(work / "inprocess", time.perf_counter() - start)


def run_simulation(cfg, work: Path, num_cpus: int) -> dict[str, Any]:
    from fedhet.runtimes.flower.simulation import run_flower_simulation

    start = time.perf_counter()
    run_flower_simulation(cfg, work / "simulation", num_cpus=num_cpus)
    return _summary(work / "simulation", time.perf_counter() - start)


def run_deployment(cfg, work: Path, poll: float, task_poll: float | None, workers: bool = True,
                   isolation: str = "subprocess") -> dict[str, Any]:
    from fedhet.runtimes.flower.deploy import deploy_experiment

    name = "deployment" if workers else "deployment-no-workers"
    start = time.perf_counter()
    deploy_experiment(cfg, work / name, workdir=work / f"{name}-flower", timeout=3600,
                      poll_interval=poll, task_poll_interval=task_poll, workers=workers, isolation=isolation)
    return _summary(work / name, time.perf_counter() - start)


def payload_floats(cfg) -> int:
    """Elements of what FedBN broadcasts (the shared, non-BN part of the model)."""
    from fedhet.engine.experiment import build_experiment

    alg = build_experiment(cfg).algorithm
    return sum(v.numel() for v in alg.init_server().model.values())


def run_floor(cfg, work: Path, poll: float, task_poll: float | None, imports: list[str],
              isolation: str = "subprocess") -> dict[str, Any]:
    """The no-op app on a fresh SuperLink + one SuperNode per client, as the deployment uses."""
    from fedhet.data import build_federated_data
    from fedhet.runtimes.flower.deploy import LocalFederation, flower_app_pyproject, flwr_run

    nodes = len(build_federated_data(cfg.data, cfg.seed).clients)
    app = work / "floor-app"
    app.mkdir(parents=True, exist_ok=True)
    (app / "noop_app.py").write_text(NOOP_APP.format(imports="".join(f"import {m}  # noqa: F401\n" for m in imports)))
    out = work / "floor.json"
    app_config = (f"nodes = {nodes}\nrounds = {cfg.rounds}\npoll-interval = {float(poll)}\n"
                  f"eval-every = {cfg.eval.every}\npayload-floats = {payload_floats(cfg)}\n"
                  f"out = {json.dumps(str(out))}")
    (app / "pyproject.toml").write_text(flower_app_pyproject(
        "fedhet-flower-floor", "no-op Flower app (benchmarks/flower_overhead.py)", "noop_app", app_config))
    start = time.perf_counter()
    with LocalFederation(nodes, work / "floor-flower", task_poll_interval=task_poll,
                         isolation=isolation) as federation:
        flwr_run(app, federation, timeout=3600)
    wall = time.perf_counter() - start
    times = json.loads(out.read_text())["round_s"]
    return {"round_s": statistics.mean(times), "round_s_all": times, "total_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    parser.add_argument("--num-cpus", type=int, default=2, help="simulation: CPUs given to Ray")
    parser.add_argument("--poll-interval", type=float, default=0.2,
                        help="ServerApp reply polling, fedhet and floor (0: the floor uses Flower's send_and_receive)")
    parser.add_argument("--task-poll-interval", type=float, default=TASK_POLL_INTERVAL,
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the deployments (default: fedhet's, "
                             f"{TASK_POLL_INTERVAL} s; Flower's own default is 1 s)")
    parser.add_argument("--isolation", default="subprocess", choices=("subprocess", "process"),
                        help="Flower's isolation mode for the deployments (process: fedhet starts the SuperExecs)")
    parser.add_argument("--floor-imports", default="", help="modules the no-op ClientApp imports, e.g. torch,fedhet")
    parser.add_argument("--workdir", default=None, help="where runs and Flower logs go (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("overrides", nargs="*", help="config overrides for the workload")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = workload(args.rounds, args.overrides)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fedhet-flower-overhead-"))
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s) {sorted(unknown)}")
    os.environ["FLWR_HOME"] = str(work / "flwr-home")  # the simulation must not touch ~/.flwr either
    results: dict[str, Any] = {}
    for mode in modes:
        print(f"{mode} ...", file=sys.stderr, flush=True)
        if mode == "inprocess":
            results[mode] = run_inprocess(cfg, work)
        elif mode == "simulation":
            results[mode] = run_simulation(cfg, work, args.num_cpus)
        elif mode in ("deployment", "deployment-no-workers"):
            results[mode] = run_deployment(cfg, work, args.poll_interval, args.task_poll_interval,
                                           workers=mode == "deployment", isolation=args.isolation)
        else:
            imports = [m for m in args.floor_imports.split(",") if m]
            results[mode] = run_floor(cfg, work, args.poll_interval, args.task_poll_interval, imports,
                                      isolation=args.isolation)
        print(f"{mode}: {results[mode]['round_s']:.3f} s/round, {results[mode]['total_s']:.1f} s in all",
              file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "workload": "configs/quickstart.yaml method=fedbn (offline_digits, 4 clients), CPU, 1 torch thread",
        "rounds": args.rounds, "overrides": args.overrides, "poll_interval": args.poll_interval,
        "task_poll_interval": args.task_poll_interval, "isolation": args.isolation,
        "floor_imports": args.floor_imports,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "load_avg": os.getloadavg()},
        "results": results,
    }
    try:
        import flwr

        report["machine"]["flwr"] = flwr.__version__
    except ImportError:
        pass
    if {"deployment", "floor", "inprocess"} <= set(results):
        floor, inproc = results["floor"]["round_s"], results["inprocess"]["round_s"]
        report["goal_ratio"] = results["deployment"]["round_s"] / (floor + inproc)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()

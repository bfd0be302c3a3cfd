"""Lanes near vmap (issue 42 item 2): the micro workload of fedpop_lanes.py, before and after, side by side.

`rows`: for each MLP of fedpop_lanes.SIZES (64 clients x `--steps` SGD steps of batch 32), the median of `--repeats`
timings of: `bare_vmap` (plain vmap(grad) over pre-stacked batches), `steps` (the batched runtime's vectorized
steps alone on batches drawn beforehand), `lanes` (BatchedClients.fit with lanes forced), `batched` (the runtime's
own choice: the measured decision after issue 42, the 64k-parameter rule before) and `inprocess`.
`compare BEFORE_SRC`: runs `rows` alternately with the `src` folder of an older checkout (e.g. `git archive HEAD~3
src | tar -x -C /tmp/before`) and with this one, `--runs` times each, and writes the median of each timing:

    python benchmarks/lanes_near_vmap.py compare /tmp/before/src --runs 3 --out docs/results/lanes_near_vmap.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
TIMINGS = ("bare_vmap_s", "steps_s", "lanes_s", "batched_s", "inprocess_s")


def rows(steps: int, repeats: int) -> list[dict[str, Any]]:
    """One row per MLP size (module docstring), with whatever `fedhet` this interpreter imports."""
    sys.path.insert(0, str(HERE))
    import fedpop_lanes as fl  # noqa: PLC0415 - a sibling script, importable only once HERE is on the path

    from fedhet.runtimes.batched import BatchedClients  # noqa: PLC0415
    from fedhet.runtimes.inprocess import InProcessClients  # noqa: PLC0415

    out = []
    for d_in, hidden in fl.SIZES:
        exp = fl.experiment(d_in, hidden, steps)
        alg = exp.algorithm
        msg = alg.broadcast(alg.init_server(), exp.round_info(1), 0)
        messages = {cid: msg for cid in range(fl.CLIENTS)}
        forced_cfg = dataclasses.replace(exp.config, run=dataclasses.replace(exp.config.run, batched_min_lanes=1))
        forced, auto = BatchedClients(dataclasses.replace(exp, config=forced_cfg)), BatchedClients(exp)
        inproc = InProcessClients(exp)
        _, vec = fl.bare(exp, steps)
        row: dict[str, Any] = {"mlp": f"{d_in}-{hidden}-10", "params": sum(p.numel() for p in alg.parts.new()
                                                                          .parameters())}
        row["bare_vmap_s"] = fl.timed(vec, repeats)
        row["steps_s"] = fl.timed(fl.steps_only(forced, messages), repeats)
        row["lanes_s"] = fl.timed(lambda: forced.fit(1, messages), repeats)  # noqa: B023 (called at once)
        row["batched_s"] = fl.timed(lambda: auto.fit(1, messages), repeats)  # noqa: B023
        row["inprocess_s"] = fl.timed(lambda: inproc.fit(1, messages), repeats)  # noqa: B023
        print(json.dumps(row), file=sys.stderr, flush=True)
        out.append(row)
    return out


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """`rows` alternately before / after, `args.runs` times each; medians and the ratios of interest."""
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    src = {"before": str(Path(args.before).resolve()), "after": str(HERE.parent / "src")}
    with tempfile.TemporaryDirectory() as cache:  # a fresh calibration cache: the first run measures
        for _ in range(args.runs):
            for side in ("before", "after"):
                env = {**os.environ, "PYTHONPATH": src[side], "FEDHET_CACHE": cache}
                cmd = [sys.executable, __file__, "rows", "--steps", str(args.steps), "--repeats", str(args.repeats)]
                done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                runs[side].append(json.loads(done.stdout))
    table = []
    for k, first in enumerate(runs["after"][0]):
        row: dict[str, Any] = {"mlp": first["mlp"], "params": first["params"]}
        for side, results in runs.items():
            med = {t: statistics.median(r[k][t] for r in results) for t in TIMINGS}
            row[side] = med
            row[f"{side}_lanes_over_vmap"] = med["lanes_s"] / med["bare_vmap_s"]
            row[f"{side}_steps_over_vmap"] = med["steps_s"] / med["bare_vmap_s"]
            row[f"{side}_chosen_over_best"] = med["batched_s"] / min(med["lanes_s"], med["inprocess_s"])
        table.append(row)
    return {"benchmark": "lanes_near_vmap", "torch": torch.__version__, "runs": args.runs, "repeats": args.repeats,
            "steps": args.steps, "load_before": os.getloadavg(), "results": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["rows", "compare"])
    parser.add_argument("before", nargs="?", help="compare: the src folder of the older checkout")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part == "rows":
        print(json.dumps(rows(args.steps, args.repeats)))
        return
    payload = compare(args)
    text = json.dumps(payload, indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

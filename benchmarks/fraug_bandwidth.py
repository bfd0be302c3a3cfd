"""FRAug's MMD bandwidth: which choice holds the RTNet's residual back (docs/fraug.md, "MMD bandwidth").

Runs the runs of a sweep config (e.g. configs/cpu/pacs_fraug_bandwidth.yaml: one FRAug variant per bandwidth)
like `fedhet sweep` does (finished runs are skipped, interrupted ones resumed) and records, per round and
client, the stage-2 diagnostics of FRAug's fit reply in `<run dir>/fraug_diagnostics.jsonl`:
  mmd_rt    MMD^2(u_hat, u) of Eq. (6) with the run's bandwidth, unweighted (beta times it is the loss term)
  res_norm  mean |lam_syn m(.)| over the batch (the residual added to u);  u_norm  mean |u|
  sigma     the Gaussian-kernel bandwidth of the step (pooled: the median heuristic of MMD(u_hat, u))
  gen_loss, rt_loss  L_gen (Eq. 5) and L_rt (Eq. 6)
each averaged over the client's local steps. The JSON written to --out has, per run, these averaged over the
clients for every round, and the final average test accuracy.

    FEDHET_DATA=/path/to/shared/data python benchmarks/fraug_bandwidth.py configs/cpu/pacs_fraug_bandwidth.yaml \
        run.num_threads=1 --out docs/results/fraug/bandwidth_pacs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedhet.algorithms.fraug import DIAGNOSTICS, FRAug
from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.engine.loop import run_dir_for
from fedhet.launch.run import run_experiment
from fedhet.launch.sweep import plan_sweep, run_status

_sink: dict[str, Path] = {}


def _recording_finish(original: Any) -> Any:
    def finish(self: FRAug, work: Any, state: Any, stats: Any) -> Any:
        out, new_state = original(self, work, state, stats)
        ctx = work.ctx
        row = {"round": ctx.round, "client": ctx.client_id, **{k: out.scalars[k] for k in DIAGNOSTICS}}
        with _sink["path"].open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        return out, new_state
    return finish


def summarise(run_dir: Path) -> dict[str, Any]:
    """Per round: the diagnostics averaged over clients (the last record of a round wins after a resume)."""
    last: dict[tuple[int, int], dict[str, float]] = {}
    diagnostics = run_dir / "fraug_diagnostics.jsonl"  # absent for a run finished outside this script
    for line in (diagnostics.read_text().splitlines() if diagnostics.is_file() else []):
        row = json.loads(line)
        last[(row["round"], row["client"])] = row
    by_round: dict[int, list[dict[str, float]]] = defaultdict(list)
    for (rnd, _), row in sorted(last.items()):
        by_round[rnd].append(row)
    rounds = {rnd: {k: statistics.mean(r[k] for r in rows) for k in DIAGNOSTICS} for rnd, rows in by_round.items()}
    final = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    avg = [r for r in final if r.get("client") == "avg" and r.get("split", "test") == "test"]
    return {"rounds": rounds, "final_round": avg[-1]["round"], "final_avg_accuracy": avg[-1]["accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", required=True)
    parser.add_argument("--methods", help="comma-separated methods / variants of the sweep (default: all)")
    args = parser.parse_args()
    FRAug.finish = _recording_finish(FRAug.finish)  # type: ignore[method-assign]
    methods = args.methods.split(",") if args.methods else None
    plan = plan_sweep(load_config(args.config, args.overrides), methods=methods)
    results = {}
    for cfg in plan.configs:
        run_dir = run_dir_for(cfg)
        status = run_status(run_dir)
        if status != "finished":
            run_dir.mkdir(parents=True, exist_ok=True)
            _sink["path"] = run_dir / "fraug_diagnostics.jsonl"
            run_experiment(cfg, run_dir, resume=status == "resume", progress=False)
        results[f"{cfg.variant}/seed{cfg.seed}"] = {"method_args": dict(cfg.method_args), **summarise(run_dir)}
    atomic_write_text(Path(args.out), json.dumps({"config": args.config, "overrides": args.overrides,
                                                  "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

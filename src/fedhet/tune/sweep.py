"""Tuned sweeps: `fedhet sweep CONFIG --tune BUDGET`, or a `sweep.tune:` block (docs/tune.md, "Tuned sweeps").

For each (dataset, label) of the sweep and each tuner: one `fedhet tune` job on the clients' validation splits,
with the same budget in client-rounds (live members x active clients, summed over the rounds) and the same
tuning seed for every label and tuner; then the chosen configuration re-run on the fresh seeds, beside the
default configuration on the same seeds:

    runs/<name>/<dataset>/<label>/seed<s>/                  the default configuration (a plain sweep's rows)
    runs/<name>/<dataset>/<label>+tuned-<tuner>/tuning/     the tuning job's run directory
    runs/<name>/<dataset>/<label>+tuned-<tuner>/seed<s>/    the chosen configuration on fresh seed s
    runs/<name>/<dataset>/<label>+tuned-<tuner>/tuned.json  budget, spend, chosen values, validation score

Resumable: finished tuning jobs and runs are skipped, an interrupted tuning job continues from its checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedhet.atomic import atomic_write_text
from fedhet.config import ExperimentConfig, from_dict
from fedhet.engine.loop import run_dir_for
from fedhet.engine.rundir import RunDirectory
from fedhet.errors import ConfigError, LanesRefused
from fedhet.launch.sweep import SweepPlan, check_plan, check_same_config, plan_sweep, run_status, run_sweep
from fedhet.report.tuned import TUNED_FILE, TUNED_MARK, TUNING_DIR
from fedhet.tune.apply import check_space
from fedhet.tune.budget import TuneBlock, client_rounds, clients_per_round, train_clients, tune_block, tuner_size
from fedhet.tune.checkpoint import FILENAME
from fedhet.tune.config import resolve_space, tune_config
from fedhet.tune.presets import default_space, tuner_settings
from fedhet.tune.privacy import check_planned_budget
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)



@dataclass
class TunedJob:
    """One tuning job of a tuned sweep and the re-runs of its choice."""

    base: ExperimentConfig  # the default configuration (seed: the first fresh seed)
    tuning: ExperimentConfig  # the tuning job's configuration (seed: the tuning seed; label <label>+tuned-<tuner>)
    tuner: str
    budget: int  # client-rounds
    seeds: list[int]  # the fresh seeds

    @property
    def folder(self) -> Path:
        """runs/<name>/<dataset>/<label>+tuned-<tuner>."""
        return run_dir_for(self.tuning).parent

    @property
    def tuning_dir(self) -> Path:
        return self.folder / TUNING_DIR

    def status(self) -> str:
        """finished (summary.json; a ConfigError if made with another config), resume (a population checkpoint)
        or new."""
        rundir = RunDirectory(self.tuning_dir)
        if rundir.is_finished():
            check_same_config(rundir, self.tuning)
            return "finished"
        return "resume" if (rundir.checkpoints / FILENAME).is_file() else "new"

    def reruns(self) -> list[ExperimentConfig]:
        """The chosen configuration (tune/best_config.yaml) on each fresh seed, with the default configuration's
        data, run settings and name; only once the tuning job has finished."""
        tree: JSONDict = yaml.safe_load((self.tuning_dir / "tune" / "best_config.yaml").read_text())
        base = self.base.to_dict()
        configs = []
        for seed in self.seeds:
            one = {**tree, "data": base["data"], "run": base["run"], "name": base["name"], "seed": seed,
                   "label": self.tuning.label, "tune": {}, "sweep": {}}
            cfg = from_dict(ExperimentConfig, one)
            cfg.validate()
            configs.append(cfg)
        return configs


@dataclass
class TunedPlan:
    """The default rows (a plain sweep on the fresh seeds) and the tuning jobs, in run order."""

    defaults: SweepPlan
    jobs: list[TunedJob]


def plan_tuned_sweep(cfg: ExperimentConfig, budget: str | None = None, methods: list[str] | None = None,
                     seeds: list[int] | None = None, datasets: list[str] | None = None,
                     config_dir: Path | None = None) -> TunedPlan:
    """Every tuning job of the sweep, checked (budget, tuners, seeds, method, search space) before anything runs.
    `budget` (the CLI's --tune) and `seeds` (--seeds) take the place of the block's."""
    from fedhet.algorithms import ALGORITHMS

    block = tune_block(cfg, budget, seeds)
    defaults = plan_sweep(cfg, methods, block.seeds, datasets)
    jobs = []
    for base in (c for c in defaults.configs if c.seed == block.seeds[0]):
        method = ALGORITHMS.get(base.method)
        if method.one_shot or method.centralized:
            kind = ("one-shot (one round, nothing to tune per round)" if method.one_shot
                    else "centralized (it trains on the pooled data)")
            raise ConfigError(f"a tuned sweep cannot tune '{base.variant}': method {base.method} is {kind}; drop it "
                              "from sweep.methods / --methods, or sweep it without --tune. Nothing was run.")
        jobs += [_job(base, tuner, block, config_dir) for tuner in block.tuners]
    return TunedPlan(defaults, jobs)


def _job(base: ExperimentConfig, tuner: str, block: TuneBlock, config_dir: Path | None) -> TunedJob:
    """The tuning job of one label and tuner: the config's own `tune` settings under the tuner's, sized to the
    budget, on the validation split (data.val_fraction 0.2 unless the config holds one out) with the tuning seed;
    its space checked."""
    per_round = clients_per_round(base)
    budget = client_rounds(block.budget, base.rounds * per_round)
    label = f"{base.variant}{TUNED_MARK}{tuner}"
    if budget < base.rounds * per_round:
        raise ConfigError(f"tune budget of {budget} client-rounds is below one run of '{base.variant}' (rounds="
                          f"{base.rounds} x {per_round} active clients = {base.rounds * per_round}); give at least "
                          "--tune 1x. Nothing was run.")
    space = block.space if block.space is not None else default_space(base.method)
    if isinstance(space, str) and space.endswith((".yaml", ".yml")) and config_dir is not None:
        space = str(Path(space) if Path(space).is_absolute() else config_dir / space)
    tree = base.to_dict()
    settings = {**base.tune, **tuner_settings(tuner)}
    settings.update(tuner_size(settings, base.rounds, budget // per_round), space=space)
    tree.update(seed=block.seed, label=label, sweep={}, tune=settings)
    tree["data"]["val_fraction"] = tree["data"]["val_fraction"] or 0.2
    if block.lanes or tree["run"]["runtime"] not in ("inprocess", "batched"):
        tree["run"]["runtime"] = "batched" if block.lanes else "inprocess"
    tree["run"]["runtime"] = _runtime_taken(run_dir_for(from_dict(ExperimentConfig, tree)).parent / TUNING_DIR,
                                            tree["run"]["runtime"])
    cfg = from_dict(ExperimentConfig, tree)
    try:
        cfg.validate()
        tune = tune_config(cfg)
        check_space(resolve_space(tune), cfg)
        check_planned_budget(cfg, tune, train_clients(cfg))  # privacy.dp.max_epsilon (tune/privacy.py)
    except ConfigError as err:
        raise ConfigError(f"tuned sweep, {label} ({base.data.dataset}): {err}") from err
    return TunedJob(base, cfg, tuner, budget, block.seeds)


def _runtime_taken(tuning_dir: Path, runtime: str) -> str:
    """`runtime`, or in-process where this job's earlier attempt was refused lanes and tuned in-process (its
    run directory says so): a resume or a finished job keeps the runtime its results came from."""
    try:
        old = yaml.safe_load((tuning_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return runtime
    taken = (old.get("run") or {}).get("runtime") if isinstance(old, dict) else None
    return "inprocess" if runtime == "batched" and taken == "inprocess" else runtime


def run_tuned_sweep(plan: TunedPlan, progress: bool = True) -> list[Path]:
    """The default rows, then each tuning job (skipped when finished, resumed when interrupted) and the re-runs
    of its choice (checked as a sweep's runs: a finished one made with another choice is an error, not skipped);
    the run directories of the default rows and re-runs."""
    done = run_sweep(plan.defaults, progress)
    for job in plan.jobs:
        if tune(job, progress):
            reruns = SweepPlan(job.reruns())
            check_plan(reruns)
            done += run_sweep(reruns, progress)
    return done


def tune(job: TunedJob, progress: bool = True) -> bool:
    """Run or resume the job's tuning unless it has finished, then write tuned.json; false if it stopped early."""
    from fedhet.tune.run import run_tuning

    status = job.status()
    if status == "finished":
        log.info("skipping finished tuning job %s", job.tuning_dir)
    else:
        try:
            result = run_tuning(job.tuning, job.tuning_dir, resume=status == "resume",
                                overwrite=status == "new" and job.tuning_dir.exists(), progress=progress)
        except LanesRefused as err:
            log.warning("%s: %s; it is tuned in-process instead", job.tuning.label, err)
            job.tuning.run.runtime = "inprocess"  # refused at its first round: nothing of it is lost
            result = run_tuning(job.tuning, job.tuning_dir, overwrite=True, progress=progress)
        if not result.summary:
            return False
    if not (job.folder / TUNED_FILE).is_file():
        atomic_write_text(job.folder / TUNED_FILE, json.dumps(tuned_record(job), indent=2) + "\n")
    return True


def tuned_record(job: TunedJob) -> JSONDict:
    """tuned.json: what was tuned, with what budget and spend, and what was chosen (contract of issue 40)."""
    summary = json.loads(RunDirectory(job.tuning_dir).summary_path.read_text())
    chosen = summary["tune"]  # its client_rounds and the summary's diverged: counted by the tuning job (tune/run.py)
    rows = [json.loads(line) for line in (job.tuning_dir / "tune" / "members.jsonl").read_text().splitlines()]
    tried = {(row["slot"], row["born"]) for row in rows}  # configurations: FedPop-G re-initialises slots
    space = resolve_space(tune_config(job.tuning))
    dims = {**space.server.dims, **space.client.dims}
    return {"method": job.tuning.method, "label": job.tuning.label, "default_label": job.base.variant,
            "tuner": job.tuner, "budget_client_rounds": job.budget, "spent_client_rounds": chosen["client_rounds"],
            "wall_s": summary["wall_time_s"], "tune_seed": job.tuning.seed, "seeds": job.seeds,
            "space": {k: ({"type": d.kind, "values": list(d.grid)} if d.discrete else
                          {"type": d.kind, "low": d.low, "high": d.high}) for k, d in dims.items()},
            "chosen": chosen["values"], "val_score": chosen.get("accuracy", {}).get(str(chosen["selected"])),
            "members": len(tried), "diverged": summary["diverged"], "selection": chosen["select"],
            **_privacy(summary)}


def _privacy(summary: JSONDict) -> JSONDict:
    """tuned.json's `privacy` under privacy.dp: the tuning job's (epsilon, delta) over all its member-rounds; each
    re-run on a fresh seed spends its own (its summary.json), on top (docs/tune.md)."""
    if "privacy" not in summary:
        return {}
    facts = summary["privacy"]
    return {"privacy": {"tuning_epsilon": facts["epsilon"], "delta": facts["delta"],
                        "member_rounds": facts["member_rounds"], "accountant": facts["accountant"],
                        "stopped": facts["stopped"]}}


def check_lines(plan: TunedPlan) -> list[str]:
    """`--check`: each tuning job and its re-runs with their status (re-runs wait for their tuning job)."""
    lines = []
    for job in plan.jobs:
        status = job.status()
        tune = job.tuning.tune
        lines.append(f"{status:<9} {job.tuning.label:<24} tuning seed {job.tuning.seed} ({job.budget} client-rounds:"
                     f" {tune['configs']} configurations) {job.tuning_dir}")
        reruns = job.reruns() if status == "finished" else []
        for i, seed in enumerate(job.seeds):
            if reruns:
                rerun = reruns[i]
                lines.append(f"{run_status(run_dir_for(rerun), rerun.rounds):<9} {rerun.variant:<24} seed {seed:<3} "
                             f"{run_dir_for(rerun)}")
            else:
                lines.append(f"{'waiting':<9} {job.tuning.label:<24} seed {seed:<3} (after its tuning job) "
                             f"{job.folder / f'seed{seed}'}")
    return lines

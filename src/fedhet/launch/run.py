"""One experiment, in-process or batched: check the run directory, lock it, build, run or resume."""

from __future__ import annotations

from pathlib import Path

from fedhet.config import ExperimentConfig
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.loop import PhaseHook, RoundLoop, RunResult, run_dir_for
from fedhet.engine.rundir import claimed
from fedhet.errors import FedhetError
from fedhet.runtimes.inprocess import InProcessClients


def make_executor(exp: Experiment) -> InProcessClients:
    """The client executor of `run.runtime`: batched (vectorized local training) or in-process (sequential); the
    one place that chooses, for `fedhet run`, `fedhet tune`'s population and the exports."""
    if exp.config.run.runtime == "batched":
        from fedhet.runtimes.batched import BatchedClients  # imports torch.func only when asked for

        return BatchedClients(exp)
    return InProcessClients(exp)


def run_experiment(cfg: ExperimentConfig, run_dir: str | Path | None = None, resume: bool = False,
                   stop_after: int | None = None, progress: bool = True, overwrite: bool = False,
                   allow_changes: tuple[str, ...] = (), on_phase: PhaseHook | None = None) -> RunResult:
    """Run (or resume) one experiment in this process and write its run directory.

    `resume` continues the checkpoint (an error if there is none), `overwrite` starts the run again over an
    existing one, `allow_changes` names the results-relevant keys a resume may change (`--allow-config-change`).
    The run directory is locked for the whole run; everything about it is checked before data are loaded."""
    if cfg.run.runtime not in ("inprocess", "batched"):
        raise FedhetError(f"run.runtime={cfg.run.runtime}: start Flower runs with `fedhet flower simulate|deploy`")
    if stop_after is not None and stop_after < 1:
        raise FedhetError(f"--stop-after must be a round >= 1, got {stop_after}")
    if allow_changes and not resume:
        raise FedhetError("--allow-config-change applies to a resumed run: add --resume")
    path = Path(run_dir) if run_dir else run_dir_for(cfg)
    with claimed(path, resume, overwrite):
        exp = build_experiment(cfg)
        loop = RoundLoop(exp, path, make_executor(exp), progress=progress, on_phase=on_phase)
        if resume:
            loop.resume(allow_changes)
        result = loop.run(stop_after=stop_after)
        if exp.arrangement.novel and result.rounds_completed >= cfg.rounds:
            from fedhet.engine.novel import adapt_novel

            result.summary["novel"] = adapt_novel(exp, loop.server, path, progress and not cfg.run.quiet)
        return result

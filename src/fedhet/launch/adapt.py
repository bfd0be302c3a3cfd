"""`fedhet adapt RUN_DIR [novel.key=value ...]`: adapt a finished run's held-out clients (engine/novel.py) again,
e.g. with another part (novel.part=hypernetwork) or more epochs, from the run's final checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedhet.config import load_config
from fedhet.engine.checkpoint import load_checkpoint
from fedhet.engine.experiment import build_experiment
from fedhet.engine.novel import adapt_novel
from fedhet.engine.rundir import RunDirectory
from fedhet.errors import FedhetError
from fedhet.launch.run import make_executor

ADAPT_KEYS = ("novel.epochs", "novel.part", "novel.lr", "novel.reach")


def adapt_run(run_dir: str | Path, overrides: list[str], progress: bool = True) -> dict[str, Any]:
    """Adapt the held-out clients of the finished run in `run_dir` with the run's config plus `overrides`
    (adaptation settings only); the result is merged into run_dir/novel.json and returned."""
    rundir = RunDirectory(Path(run_dir))
    if not rundir.config_path.is_file() or not rundir.latest_checkpoint.is_file():
        raise FedhetError(f"{run_dir} is not a fedhet run directory with a checkpoint (config.yaml and the latest "
                          "checkpoint); give the folder `fedhet run` printed as 'results:'")
    bad = [o for o in overrides if o.split("=", 1)[0].strip() not in ADAPT_KEYS]
    if bad:
        raise FedhetError(f"fedhet adapt changes only the adaptation ({', '.join(ADAPT_KEYS)}), not {bad}; to hold "
                          "out other clients or change training, start a new run")
    if not rundir.is_finished():
        raise FedhetError(f"{run_dir} has not finished training; finish it first (fedhet run CONFIG --resume)")
    cfg = load_config(rundir.config_path, overrides)
    with rundir.locked():
        exp = build_experiment(cfg)
        if not exp.arrangement.novel:
            raise FedhetError(f"{run_dir} held no clients out of training (novel.holdout=0 and no novel.clients), "
                              "so every client is already trained; run again with e.g. novel.holdout=0.3")
        payload = load_checkpoint(rundir.latest_checkpoint, make_executor(exp).checkpoint_config(cfg.to_dict()))
        return adapt_novel(exp, payload["server"], rundir.path, progress)

"""`fedhet adapt RUN_DIR [novel.key=value ...]`: adapt a finished run's held-out clients (engine/novel.py) again,
e.g. with another part (novel.part=hypernetwork) or more epochs, from the run's final checkpoint; with
`--data PATH [--name SITE] [--export DIR]`, a site that joins after training, on its own data (launch/site.py)."""

from __future__ import annotations

from pathlib import Path

from fedhet.engine.novel import adapt_novel
from fedhet.errors import FedhetError
from fedhet.launch.export import check_out, checked_run, load_run
from fedhet.yaml_input import JSONDict

ADAPT_KEYS = ("novel.epochs", "novel.part", "novel.lr", "novel.reach")


def adapt_run(run_dir: str | Path, overrides: list[str], progress: bool = True, data: str | Path | None = None,
              name: str | None = None, export: str | Path | None = None, overwrite: bool = False) -> JSONDict:
    """Adapt the held-out clients of the finished run in `run_dir` with the run's config plus `overrides`
    (adaptation settings only), or with `data` the new site whose data it is (named `name`, its adapted model
    exported to `export`); the result is merged into run_dir/novel.json and returned."""
    bad = [o for o in overrides if o.split("=", 1)[0].strip() not in ADAPT_KEYS]
    if bad:
        raise FedhetError(f"fedhet adapt changes only the adaptation ({', '.join(ADAPT_KEYS)}), not {bad}; to hold "
                          "out other clients or change training, start a new run")
    if data is None and (name is not None or export is not None):
        raise FedhetError("--name and --export go with --data PATH (a new site's own data)")
    rundir = checked_run(run_dir)
    if export is not None:
        check_out(Path(export), overwrite)
    with rundir.locked():
        run = load_run(rundir, overrides)
        if data is not None:
            from fedhet.launch.site import adapt_site, load_site

            client = load_site(run, data, name)
            return adapt_site(run, client, Path(data), rundir.path, Path(export) if export is not None else None)
        if not run.exp.arrangement.novel:
            raise FedhetError(f"{run_dir} held no clients out of training (novel.holdout=0 and no novel.clients), "
                              "so every client is already trained; run again with e.g. novel.holdout=0.3, or bring "
                              "a new site's own data with --data PATH")
        return adapt_novel(run.exp, run.server, rundir.path, progress)

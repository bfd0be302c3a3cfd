"""A site that joins after training: `fedhet adapt RUN_DIR --data PATH [--name SITE] [--export DIR]`.

The site brings its own data of the run's kind: for an `imagefolder` run one domain folder
(`PATH/<class>/*.png` or `PATH/{train,test}/<class>/*.png`), for a `csv` run one CSV file. It is read with the
run's data settings (options, image size, test_fraction, fraction, seed), must have the run's classes (same
label names) and input shape, and is then adapted like a held-out client (engine/novel.py: the method's
`novel_model`, else its deployed model with `novel.part` trainable) on its training split and evaluated on its
test split. The result joins novel.json as entry "<part>@site=<name>"; `--export DIR` writes the adapted model
in `fedhet export`'s format.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedhet.config import DataConfig
from fedhet.data import ClientData, FederatedData, build_federated_data
from fedhet.engine.novel import client_row, merge_novel, novel_model, summarize, train_novel
from fedhet.errors import FedhetError
from fedhet.launch.export import (
    Export,
    LoadedRun,
    check_architecture,
    fill_folder,
    model_spec,
    plain_state,
    shapes,
    write_folder,
)
from fedhet.yaml_input import JSONDict

SITE_DATASETS = ("imagefolder", "csv")
SITE_NOTE = "a site's export holds its adapted model only; the run's own export (fedhet export) holds the others"


def site_data_config(cfg: DataConfig, path: Path) -> DataConfig:
    """The run's data settings, pointed at the site's data alone (one client)."""
    if cfg.dataset not in SITE_DATASETS:
        raise FedhetError(f"--data: this run trained on dataset '{cfg.dataset}'; a new site's own data can join "
                          f"runs on your own data ({' or '.join(SITE_DATASETS)}, docs/data.md). For a built-in "
                          "dataset, hold sites out at training time instead (novel.holdout / novel.clients)")
    if not path.exists():
        raise FedhetError(f"--data '{path}' not found; give the site's "
                          + ("folder (<site>/<class>/*.png)" if cfg.dataset == "imagefolder" else "CSV file"))
    cfg = dataclasses.replace(cfg, partition="domain", clients_per_domain=1)
    if cfg.dataset == "imagefolder":
        if not path.is_dir():
            raise FedhetError(f"--data '{path}' is a file; for an imagefolder run give the site's folder "
                              "(<site>/<class>/*.png or <site>/{train,test}/<class>/*.png)")
        return dataclasses.replace(cfg, root=str(path.resolve().parent), domains=[path.resolve().name])
    return dataclasses.replace(cfg, root=str(path), domains=None)


def check_site(run: FederatedData, site: FederatedData, path: Path) -> None:
    """The site's data must have the run's classes (names and number) and input shape."""
    where = f"the site's data '{path}'"
    if len(site.classes) != len(run.classes):
        raise FedhetError(f"{where} has {len(site.classes)} classes ({', '.join(site.classes)}), the run's model "
                          f"has {len(run.classes)} ({', '.join(run.classes)}): give the site's data with the run's "
                          "classes")
    if list(site.classes) != list(run.classes):
        extra = [c for c in site.classes if c not in run.classes]
        missing = [c for c in run.classes if c not in site.classes]
        raise FedhetError(f"{where} names its classes differently from the run: {', '.join(extra)} in the site, "
                          f"{', '.join(missing)} in the run; rename them to the run's labels "
                          f"({', '.join(run.classes)})")
    if tuple(site.input_shape) != tuple(run.input_shape):
        what = "features" if len(run.input_shape) == 1 else "input shape"
        raise FedhetError(f"{where} gives {what} {tuple(site.input_shape)}, the run's model takes "
                          f"{tuple(run.input_shape)}: give the site the run's columns (csv) / channels (images)")


def load_site(run: LoadedRun, path: str | Path, name: str | None) -> ClientData:
    """The site's client data, checked against the run's data, named `name` (default: its own name)."""
    path = Path(path)
    site = build_federated_data(site_data_config(run.cfg.data, path), run.cfg.seed)
    if len(site.clients) != 1:
        raise FedhetError(f"--data '{path}' holds {len(site.clients)} clients "
                          f"({', '.join(c.name for c in site.clients)}); give one site's data")
    check_site(run.exp.data, site, path)
    client = dataclasses.replace(site.clients[0], name=name or site.clients[0].name)
    taken = [c.name for c in run.exp.data.clients]
    if client.name in taken:
        raise FedhetError(f"the run already has a client named '{client.name}'; give the site another name with "
                          "--name SITE")
    return client


def adapt_site(run: LoadedRun, client: ClientData, source: Path, run_dir: Path, export: Path | None = None
               ) -> JSONDict:
    """Adapt the site like a held-out client from the run's final server state; merge the result into
    novel.json and, with `export`, write the adapted model there. Returns the novel.json entry."""
    exp, cfg = run.exp, run.cfg.novel
    n = len(exp.data.clients)
    joined = dataclasses.replace(exp, data=dataclasses.replace(exp.data, clients=[*exp.data.clients, client]))
    novel = novel_model(joined, run.server, n, cfg.part, exp.arrangement.pool(n))
    accuracies = train_novel(joined, novel, n, cfg)
    result = {**summarize([client_row(client.name, novel, accuracies, cfg.reach)], cfg, run.cfg.train.lr),
              "site": {"name": client.name, "data": str(source.resolve())}}
    key = f"{result['part']}@site={client.name}" + ("" if cfg.lr is None else f"@lr={cfg.lr:g}")
    if export is not None:
        state = plain_state(novel.module)
        check_architecture(exp, shapes(exp), state, f"site '{client.name}'")
        facts = {"run": str(run_dir.resolve()), "name": run.cfg.name, "method": run.cfg.method, "seed": run.cfg.seed,
                 "round": run.round, "site": result["site"], "part": result["part"], "epochs": cfg.epochs}
        metrics = {client.name: {"accuracy": accuracies[-1]}}
        done = Export({client.name: state}, model_spec(run.cfg, exp), facts, metrics, None, SITE_NOTE)
        write_folder(export, lambda tmp: fill_folder(tmp, done))
        result["export"] = str(export)
    merge_novel(run_dir, key, result)
    return result


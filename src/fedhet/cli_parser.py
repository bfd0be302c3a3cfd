"""The `fedhet` command line: one argparse subparser per subcommand, and `parse_args`, which also accepts
`key=value` overrides after flags."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fedhet.cli_args import DEBUG_FLAGS, Parser, check_repeated_overrides, place_extras
from fedhet.cli_commands import (
    cmd_adapt,
    cmd_data,
    cmd_export,
    cmd_flower,
    cmd_methods,
    cmd_pretrain,
    cmd_report,
    cmd_run,
    cmd_sweep,
    cmd_tune,
)
from fedhet.launch.configs_cli import add_configs_parser
from fedhet.launch.ldm_cli import add_ldm
from fedhet.privacy.command import add_privacy_parser

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[Parser]  # what `add_subparsers` returns


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fedhet", description="Federated learning under data heterogeneity.")
    parser.add_argument("--version", action="version", version=f"fedhet {_version()}")
    parser.add_argument(*DEBUG_FLAGS, dest="verbose", action="store_true",
                        help="debug logging, and the traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_sweep, _add_tune, _add_adapt, _add_export, _add_report, _add_data, _add_pretrain,
                _add_flower):
        add(sub)
    add_privacy_parser(sub)  # fedhet.privacy's own subcommand (docs/privacy.md)
    add_ldm(sub)  # fedhet ldm pretrain | samples (docs/fedbip.md)
    add_configs_parser(sub)  # fedhet configs [--copy DIR]: the example configs shipped with fedhet
    methods = sub.add_parser("methods", help="list the registered methods")
    methods.set_defaults(func=cmd_methods)
    for command in sub.choices.values():  # -v / --debug also after the subcommand
        command.add_argument(*DEBUG_FLAGS, dest="verbose", action="store_true", default=argparse.SUPPRESS,
                             help="debug logging, and the traceback of any error")
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhet")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "(not installed)"


def _add_run(sub: Subparsers) -> None:
    """`fedhet run CONFIG [key=value ...]`: one experiment."""
    run = sub.add_parser("run", help="run one experiment: fedhet run CONFIG [key=value ...]")
    run.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    run.add_argument("overrides", nargs="*", help="config overrides, e.g. method=fedbn train.lr=0.05")
    run.add_argument("--resume", action="store_true",
                     help="continue from the run's latest checkpoint (also to extend it: a larger rounds=)")
    run.add_argument("--allow-config-change", action="append", metavar="KEY[,KEY...]",
                     help="with --resume: accept these results-relevant keys differing from the checkpoint's "
                          "(e.g. train.lr after a NaN loss); recorded in summary.json")
    run.add_argument("--overwrite", action="store_true", help="start the run again over an existing checkpoint")
    run.add_argument("--run-dir", default=None, help="where to write results (default: runs/NAME/...)")
    run.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this round")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)


def _add_tune(sub: Subparsers) -> None:
    """`fedhet tune CONFIG [key=value ...]`: population-based hyperparameter tuning (docs/tune.md)."""
    tune = sub.add_parser("tune", help="tune a method's hyperparameters (FedPop in RS / SHA): fedhet tune CONFIG "
                                       "[key=value ...]")
    tune.add_argument("config", nargs="?", help="YAML config with a tune: section (default: built-in defaults)")
    tune.add_argument("overrides", nargs="*", help="config overrides, e.g. tune.wrapper=sha data.val_fraction=0.2")
    tune.add_argument("--resume", action="store_true", help="continue the job from its last finished round")
    tune.add_argument("--overwrite", action="store_true", help="start the job again over an existing checkpoint")
    tune.add_argument("--run-dir", default=None, help="where to write results (default: runs/NAME/...)")
    tune.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this round")
    tune.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    tune.set_defaults(func=cmd_tune)


def _add_sweep(sub: Subparsers) -> None:
    """`fedhet sweep CONFIG`: methods x seeds x datasets."""
    sweep = sub.add_parser("sweep", help="methods x seeds x datasets; finished runs are skipped")
    sweep.add_argument("config")
    sweep.add_argument("overrides", nargs="*")
    sweep.add_argument("--methods", help="comma-separated (default: the config's sweep.methods)")
    sweep.add_argument("--seeds", help="comma-separated (default: the config's sweep.seeds)")
    sweep.add_argument("--datasets", help="comma-separated (default: the config's sweep.datasets)")
    sweep.add_argument("--report-dir", default=None)
    sweep.add_argument("--tune", default=None, metavar="BUDGET",
                       help="also tune every method at this budget (8x: 8 full runs' worth; 4000: client-rounds) "
                            "and re-run its choice on the seeds beside the default config (docs/tune.md, Tuned sweeps)")
    sweep.add_argument("--check", action="store_true",
                       help="validate every planned run (method args, dataset, model names) and list its status; "
                            "runs nothing")
    sweep.add_argument("-q", "--quiet", action="store_true")
    sweep.set_defaults(func=cmd_sweep)


def _add_report(sub: Subparsers) -> None:
    """`fedhet report RUN_DIR ...`: tables and curves."""
    report = sub.add_parser("report", help="paper-style table (Markdown, CSV) and learning curves")
    report.add_argument("run_dirs", nargs="+", help="run directories or folders containing them")
    report.add_argument("--out", default="report")
    report.add_argument("--reference", default=None, help="YAML of published numbers to show side by side")
    report.set_defaults(func=cmd_report)


def _add_adapt(sub: Subparsers) -> None:
    """`fedhet adapt RUN_DIR [novel.key=value ...]`: adapt a finished run's held-out clients."""
    adapt = sub.add_parser("adapt", help="adapt a finished run's held-out (novel) clients, or a new site on its own "
                                         "data (--data): fedhet adapt RUN_DIR [--data PATH] "
                                         "[novel.part=embedding|hypernetwork|personal|all novel.epochs=N]")
    adapt.add_argument("run_dir")
    adapt.add_argument("overrides", nargs="*")
    adapt.add_argument("--data", default=None, help="a site that joins after training: its own data (imagefolder "
                                                    "run: its folder; csv run: its CSV file), with the run's classes")
    adapt.add_argument("--name", default=None, help="with --data: the site's name (default: its folder / file's)")
    adapt.add_argument("--export", default=None, metavar="DIR",
                       help="with --data: write the site's adapted model here (fedhet export's format)")
    adapt.add_argument("--overwrite", action="store_true", help="with --export: replace a non-empty DIR")
    adapt.add_argument("-q", "--quiet", action="store_true")
    adapt.set_defaults(func=cmd_adapt)


def _add_export(sub: Subparsers) -> None:
    """`fedhet export RUN_DIR [--out DIR]`: a finished run's deployable models as state_dict files."""
    export = sub.add_parser("export", help="write a finished run's per-client (and global) models as plain "
                                           "state_dict files: fedhet export RUN_DIR [--out DIR] (docs/export.md)")
    export.add_argument("run_dir")
    export.add_argument("--out", default=None, help="the export folder (default: RUN_DIR/export)")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    export.set_defaults(func=cmd_export)


def _add_data(sub: Subparsers) -> None:
    """`fedhet data list | show`."""
    data = sub.add_parser("data", help="list datasets, or show a partition")
    data.add_argument("action", choices=["list", "show"])
    data.add_argument("config", nargs="?")
    data.add_argument("overrides", nargs="*")
    data.add_argument("--plot", default=None, help="write a PNG of the partition here")
    data.set_defaults(func=cmd_data)


def _add_pretrain(sub: Subparsers) -> None:
    """`fedhet pretrain CONFIG --out PATH`: a frozen backbone's central pretraining (FedDAT's stand-in)."""
    pre = sub.add_parser("pretrain", help="pretrain a backbone centrally on the config's data; cached by config")
    pre.add_argument("config", nargs="?")
    pre.add_argument("overrides", nargs="*")
    pre.add_argument("--out", required=True, help="the backbone file (model.args.checkpoint of later runs)")
    pre.add_argument("--epochs", type=int, default=1)
    pre.add_argument("--minutes", type=float, default=None, help="stop after this much wall time")
    pre.add_argument("--force", action="store_true", help="train again even if --out holds this pretraining")
    pre.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    pre.set_defaults(func=cmd_pretrain)


def _add_flower(sub: Subparsers) -> None:
    """`fedhet flower simulate | deploy | app | worker`, its options grouped by the action they serve."""
    flower = sub.add_parser("flower", help="run on Flower: simulate | deploy (local SuperLink + SuperNodes) | app | "
                                           "check | worker (a SuperNode's long-lived fedhet worker)",
                            description="simulate: Flower's simulation engine; deploy: a local SuperLink + one "
                                        "SuperNode per client; app: write a Flower App folder for `flwr run`; "
                                        "check APP --run-config '...': check a `flwr run` of that App before "
                                        "submitting it; worker: a SuperNode's long-lived fedhet worker "
                                        "(docs/flower.md, docs/deployment.md)")
    flower.add_argument("action", choices=["simulate", "deploy", "app", "check", "worker"])
    flower.add_argument("config", nargs="?")
    flower.add_argument("overrides", nargs="*")
    both = flower.add_argument_group("simulate and deploy")
    both.add_argument("--run-dir", default=None, help="where the ServerApp writes results (default: runs/NAME/...)")
    both.add_argument("--resume", action="store_true", help="continue from the run's checkpoint")
    both.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this round")
    both.add_argument("-q", "--quiet", action="store_true")
    sim = flower.add_argument_group("simulate")
    sim.add_argument("--num-cpus", type=int, default=None, help="CPUs given to Ray")
    sim.add_argument("--cpus-per-client", type=float, default=1.0,
                     help="CPUs reserved per ClientApp actor (actors = num-cpus / this)")
    folder = flower.add_argument_group("deploy and app")
    folder.add_argument("--workdir", default=None, help="deploy: Flower logs and FLWR_HOME; app: the App folder")
    app = flower.add_argument_group("app and check")
    app.add_argument("--node-data", action="store_true",
                     help="app: each SuperNode reads only its own site's data (node config data-root, client-id; "
                          "docs/deployment.md)")
    app.add_argument("--run-config", action="append", default=[],
                     help="check: the --run-config you will give `flwr run` (the App folder is the CONFIG argument)")
    deploy = flower.add_argument_group("deploy")
    deploy.add_argument("--port", type=int, default=None, help="SuperLink port (default: a free one)")
    deploy.add_argument("--tls-dir", default=None,
                        help="TLS with DIR/ca.crt, server.pem, server.key (self-signed ones are written for "
                             "127.0.0.1 if DIR has none)")
    deploy.add_argument("--no-workers", action="store_true",
                        help="no fedhet worker beside each SuperNode (every ClientApp process imports torch and "
                             "builds the experiment itself; slower)")
    deploy.add_argument("--supernode-auth", action="store_true",
                        help="SuperNode authentication (a registered key pair per node; needs --tls-dir)")
    worker = flower.add_argument_group("worker")
    worker.add_argument("--socket", default=None, help="the Unix socket to serve on")
    flower.set_defaults(func=cmd_flower)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; overrides may also come after flags (`run cfg.yaml --quiet rounds=3`)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        args.overrides = list(args.overrides or [])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    place_extras(args, extras, sub.choices[args.command]._option_string_actions)
    if hasattr(args, "overrides"):
        check_repeated_overrides([args.config or "", *args.overrides] if hasattr(args, "config") else args.overrides)
    return args

"""The `fedhet` command: run | sweep | report | data | methods | flower.

Bad input never reaches the user as a traceback: every FedhetError is one line "error: ..." on stderr and exit
code 2 (or the error's `exit_code`), Ctrl-C is one line and exit code 130, any other exception is one line
naming it and exit code 1; `-v` / `--debug` (before or after the subcommand) prints the traceback too.
`key=value` overrides may stand anywhere after the subcommand, also after flags.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from pathlib import Path

from fedhet.cli_args import (
    DEBUG_FLAGS,
    Parser,
    check_repeated_overrides,
    check_stop_after,
    config_and_overrides,
    csv_list,
    place_extras,
)
from fedhet.errors import FedhetError

log = logging.getLogger("fedhet")


def _cmd_run(args: argparse.Namespace) -> int:
    from fedhet.config import load_config
    from fedhet.engine.loop import run_experiment
    from fedhet.engine.sweep import SweepPlan, check_plan

    check_stop_after(args.stop_after)
    cfg = load_config(*config_and_overrides(args))
    if args.quiet:
        cfg.run.quiet = True
    check_plan(SweepPlan([cfg]), prefix=False)  # method, method_args, dataset and model names: before any write
    allowed = tuple(k for text in args.allow_config_change or [] for k in csv_list(text, "--allow-config-change") or [])
    result = run_experiment(cfg, args.run_dir, resume=args.resume, stop_after=args.stop_after,
                            progress=not args.quiet, overwrite=args.overwrite, allow_changes=allowed)
    _print_final(result.final)
    _print_config_changes(result.summary.get("config_changes", []))
    print(f"results: {result.run_dir}")
    return 0


def _print_config_changes(changes: list[dict]) -> None:
    """The changes accepted on resume (extended rounds, --allow-config-change), as summary.json records them."""
    from fedhet.engine.loop import ROUNDS_NOTE

    for c in changes:
        note = ROUNDS_NOTE if c["key"] == "rounds" else ""
        print(f"config change at the resume after round {c['round']}: {c['key']} {c['old']!r} -> {c['new']!r}{note}")


def _print_final(final: dict[str, dict[str, float]]) -> None:
    if not final:
        return
    print(f"{'client':<16} {'accuracy':>9} {'bal.acc':>9} {'loss':>8}")
    for name, m in final.items():
        print(f"{name:<16} {100 * m['accuracy']:>8.2f}% {100 * m['balanced_accuracy']:>8.2f}% {m['loss']:>8.4f}")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedhet.config import load_config
    from fedhet.engine.loop import run_dir_for
    from fedhet.engine.sweep import check_plan, plan_sweep, run_sweep
    from fedhet.outpaths import check_output_dir
    from fedhet.report import write_report

    methods, seeds = csv_list(args.methods, "--methods"), csv_list(args.seeds, "--seeds", int)
    datasets = csv_list(args.datasets, "--datasets")
    cfg = load_config(args.config, args.overrides)
    if args.quiet:
        cfg.run.quiet = True
    plan = plan_sweep(cfg, methods, seeds, datasets)
    checked = check_plan(plan)  # every run valid before any is trained
    if args.check:
        for one, status in checked:
            print(f"{status:<9} {one.variant:<24} seed {one.seed:<3} {one.data.dataset:<20} {run_dir_for(one)}")
        counts = {s: sum(1 for _, st in checked if st == s) for s in ("finished", "resume", "new")}
        print(f"{len(checked)} runs valid: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0
    out = Path(args.report_dir) if args.report_dir else Path(cfg.run.out_dir) / cfg.name / "report"
    check_output_dir(out, "--report-dir" if args.report_dir else "the sweep's report folder")
    run_dirs = run_sweep(plan, progress=not args.quiet)
    paths = write_report(run_dirs, out)
    print(paths.markdown.read_text())
    print(f"report: {out}")
    return 0


def _load_reference(path: str | None) -> dict | None:
    """Published numbers to print beside the measured ones: YAML {client: {method: [mean, std]}}."""
    if path is None:
        return None
    from fedhet.yaml_input import load_yaml, read_text

    ref_path = Path(path)
    if not ref_path.is_file():
        raise FedhetError(f"reference file '{path}' not found (see configs/paper/ for examples)")
    data = load_yaml(read_text(ref_path, "reference file"), f"reference file '{path}'")
    if not isinstance(data, dict):
        raise FedhetError(f"reference file '{path}' must map client -> method -> [mean, std]")
    return data


def _cmd_report(args: argparse.Namespace) -> int:
    from fedhet.outpaths import check_output_dir
    from fedhet.report import write_report

    check_output_dir(Path(args.out), "--out")
    paths = write_report([Path(p) for p in args.run_dirs], Path(args.out), reference=_load_reference(args.reference))
    print(paths.markdown.read_text())
    print(f"report: {args.out}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from fedhet.config import load_config
    from fedhet.data import build_federated_data, dataset_info, list_datasets

    if args.action == "list":
        for name in list_datasets():
            print(f"{dataset_info(name)}\n")
        return 0
    if args.plot:
        from fedhet.outpaths import check_plot_file

        check_plot_file(Path(args.plot))
    cfg = load_config(*config_and_overrides(args))
    data = build_federated_data(cfg.data, cfg.seed)
    print(data.describe())
    if args.plot:
        from fedhet.data.show import plot_partition

        print(f"plot: {plot_partition(data, Path(args.plot))}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from fedhet.algorithms import ALGORITHMS

    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        print(f"{name:<14} {doc}")
    return 0


def _cmd_flower(args: argparse.Namespace) -> int:
    """Flower runtime: simulate (simulation engine), deploy (local SuperLink + SuperNodes), app (App folder)."""
    from fedhet.config import load_config
    from fedhet.engine.loop import run_dir_for
    from fedhet.runtimes.flower import require_flower

    require_flower()
    check_stop_after(args.stop_after)
    if args.action == "worker":
        from fedhet.runtimes.flower.worker import Worker

        if not args.socket:
            raise FedhetError("fedhet flower worker needs --socket PATH (the path the SuperNode's node config names "
                              "as fedhet-worker)")
        Worker(args.socket).serve()
        return 0
    cfg = load_config(*config_and_overrides(args))
    run_dir = Path(args.run_dir) if args.run_dir else run_dir_for(cfg)
    if args.action == "simulate":
        from fedhet.runtimes.flower.simulation import run_flower_simulation

        _print_final(run_flower_simulation(cfg, run_dir, num_cpus=args.num_cpus, cpus_per_client=args.cpus_per_client,
                                           progress=not args.quiet, resume=args.resume,
                                           stop_after=args.stop_after).final)
    elif args.action == "deploy":
        from fedhet.runtimes.flower.deploy import deploy_experiment

        deploy_experiment(cfg, run_dir, workdir=args.workdir, port=args.port, resume=args.resume,
                          stop_after=args.stop_after, tls_dir=args.tls_dir, workers=not args.no_workers)
    else:
        from fedhet.runtimes.flower.deploy import write_flower_app

        config = cfg.to_dict()
        config["run"]["runtime"] = "flower"
        app = write_flower_app(args.workdir or "flower-app", config, run_dir, resume=args.resume,
                               stop_after=args.stop_after or 0)
        print(f"Flower App: {app}\nrun it with: flwr run {app} <superlink-connection> --stream")
        return 0
    print(f"results: {run_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fedhet", description="Federated learning under data heterogeneity.")
    parser.add_argument(*DEBUG_FLAGS, dest="verbose", action="store_true",
                        help="debug logging, and the traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True)

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
    run.set_defaults(func=_cmd_run)

    sweep = sub.add_parser("sweep", help="methods x seeds x datasets; finished runs are skipped")
    sweep.add_argument("config")
    sweep.add_argument("overrides", nargs="*")
    sweep.add_argument("--methods", help="comma-separated (default: the config's sweep.methods)")
    sweep.add_argument("--seeds", help="comma-separated (default: the config's sweep.seeds)")
    sweep.add_argument("--datasets", help="comma-separated (default: the config's sweep.datasets)")
    sweep.add_argument("--report-dir", default=None)
    sweep.add_argument("--check", action="store_true",
                       help="validate every planned run (method args, dataset, model names) and list its status; "
                            "runs nothing")
    sweep.add_argument("-q", "--quiet", action="store_true")
    sweep.set_defaults(func=_cmd_sweep)

    report = sub.add_parser("report", help="paper-style table (Markdown, CSV) and learning curves")
    report.add_argument("run_dirs", nargs="+", help="run directories or folders containing them")
    report.add_argument("--out", default="report")
    report.add_argument("--reference", default=None, help="YAML of published numbers to show side by side")
    report.set_defaults(func=_cmd_report)

    data = sub.add_parser("data", help="list datasets, or show a partition")
    data.add_argument("action", choices=["list", "show"])
    data.add_argument("config", nargs="?")
    data.add_argument("overrides", nargs="*")
    data.add_argument("--plot", default=None, help="write a PNG of the partition here")
    data.set_defaults(func=_cmd_data)

    flower = sub.add_parser("flower", help="run on Flower: simulate | deploy (local SuperLink + SuperNodes) | app | "
                                           "worker (a SuperNode's long-lived fedhet worker)")
    flower.add_argument("action", choices=["simulate", "deploy", "app", "worker"])
    flower.add_argument("config", nargs="?")
    flower.add_argument("overrides", nargs="*")
    flower.add_argument("--run-dir", default=None, help="where the ServerApp writes results (default: runs/NAME/...)")
    flower.add_argument("--workdir", default=None, help="deploy: Flower logs and FLWR_HOME; app: the App folder")
    flower.add_argument("--port", type=int, default=None, help="deploy: SuperLink port (default: a free one)")
    flower.add_argument("--num-cpus", type=int, default=None, help="simulate: CPUs given to Ray")
    flower.add_argument("--cpus-per-client", type=float, default=1.0,
                        help="simulate: CPUs reserved per ClientApp actor (actors = num-cpus / this)")
    flower.add_argument("--resume", action="store_true", help="simulate / deploy: continue from the run's checkpoint")
    flower.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this round")
    flower.add_argument("--tls-dir", default=None,
                        help="deploy: TLS with DIR/ca.crt, server.pem, server.key (self-signed ones are written "
                             "for 127.0.0.1 if DIR has none)")
    flower.add_argument("--no-workers", action="store_true",
                        help="deploy: no fedhet worker beside each SuperNode (every ClientApp process imports "
                             "torch and builds the experiment itself; slower)")
    flower.add_argument("--socket", default=None, help="worker: the Unix socket to serve on")
    flower.add_argument("-q", "--quiet", action="store_true")
    flower.set_defaults(func=_cmd_flower)

    methods = sub.add_parser("methods", help="list the registered methods")
    methods.set_defaults(func=_cmd_methods)
    for command in sub.choices.values():  # -v / --debug also after the subcommand
        command.add_argument(*DEBUG_FLAGS, dest="verbose", action="store_true", default=argparse.SUPPRESS,
                             help="debug logging, and the traceback of any error")
    return parser


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


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _fail(message: str, verbose: bool, code: int) -> int:
    """Print the traceback (with -v) and one line "error: ..." to stderr; return the exit code."""
    if verbose:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """The console entry point: 0 on success, else one line on stderr and a non-zero exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = any(a in DEBUG_FLAGS for a in argv)
    hint = "" if verbose else " (run with -v for the traceback)"
    try:
        args = parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        return int(args.func(args))
    except KeyboardInterrupt:
        return _fail("interrupted (Ctrl-C); run the command again to start over (a run that wrote a checkpoint "
                     "continues with --resume)", verbose, 130)
    except BrokenPipeError:  # `fedhet methods | head`: the reader left; say nothing more
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except FedhetError as err:
        return _fail(str(err), verbose, err.exit_code)
    except OSError as err:
        where = f" '{err.filename}'" if err.filename else ""
        return _fail(f"{err.strerror or _first_line(str(err))}{where}: check the path, its permissions and the free "
                     f"space{hint}", verbose, 1)
    except Exception as err:  # noqa: BLE001 (the last line of defence: one line, not a traceback)
        return _fail(f"unexpected {type(err).__name__}: {_first_line(str(err))} - this input is not checked "
                     f"yet or fedhet has a bug; please report it{hint}", verbose, 1)


if __name__ == "__main__":
    sys.exit(main())

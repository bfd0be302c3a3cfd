"""The handlers of the `fedhet` subcommands: each takes the parsed arguments and returns the exit code.

Heavy modules (torch, the engine, Flower) are imported inside the handlers, so `fedhet --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet.cli_args import check_stop_after, config_and_overrides, csv_list
from fedhet.errors import FedhetError

if TYPE_CHECKING:
    from fedhet.config import ExperimentConfig
    from fedhet.report import ReportPaths
    from fedhet.report.table import Reference
    from fedhet.yaml_input import JSONDict


def _load(args: argparse.Namespace, quiet: bool = False) -> ExperimentConfig:
    """The command's config file (or fedhet's defaults) with its key=value overrides (`config_and_overrides`);
    `quiet` (a run's --quiet) also sets run.quiet, which the run's own printing reads."""
    from fedhet.config import load_config

    cfg = load_config(*config_and_overrides(args))
    cfg.run.quiet = cfg.run.quiet or quiet
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from fedhet.launch.run import run_experiment
    from fedhet.launch.sweep import SweepPlan, check_plan

    check_stop_after(args.stop_after)
    cfg = _load(args, args.quiet)
    check_plan(SweepPlan([cfg]), prefix=False, statuses=False)  # method, dataset, model names: before any write
    allowed = tuple(k for text in args.allow_config_change or [] for k in csv_list(text, "--allow-config-change") or [])
    result = run_experiment(cfg, args.run_dir, resume=args.resume, stop_after=args.stop_after,
                            progress=not args.quiet, overwrite=args.overwrite, allow_changes=allowed)
    _print_final(result.final, cfg.run.quiet, result.summary.get("attack"))
    _print_config_changes(result.summary.get("config_changes", []))
    if "novel" in result.summary:
        _print_novel(result.summary["novel"])
    print(f"results: {result.run_dir}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from fedhet.tune.run import run_tuning

    check_stop_after(args.stop_after)
    cfg, config = _load(args, args.quiet), config_and_overrides(args)[0]
    result = run_tuning(cfg, args.run_dir, resume=args.resume, overwrite=args.overwrite, progress=not args.quiet,
                        stop_after=args.stop_after, config_dir=Path(config).parent if config else None)
    if result.summary:
        _print_final(result.summary["final"], cfg.run.quiet)
        chosen = result.summary["tune"]
        rule = "validation" if chosen["select"] == "val" else "test"
        print(f"best configuration (member {chosen['selected']}, highest mean {rule} accuracy at the end; the "
              "progress bar ranks by validation loss): "
              + ", ".join(f"{k}={v}" for k, v in chosen["values"].items()))
        print(f"run it: fedhet run {result.run_dir / 'tune' / 'best_config.yaml'}")
    else:
        print(f"stopped after round {result.rounds_completed}; continue with --resume")
    print(f"results: {result.run_dir}")
    return 0


def _print_novel(novel: dict[str, Any]) -> None:  # Any: parsed JSON
    """The held-out clients' adaptation (engine/novel.py), one line per client and the mean."""
    print(f"novel clients, adapting '{novel['part']}' for {novel['epochs']} epochs:")
    for row in novel["clients"]:
        print(f"  {row['client']:<16} {100 * row['accuracy'][0]:6.2f}% -> {100 * row['final']:6.2f}% "
              f"(best {100 * row['best']:.2f}%, reached by epoch {row['epochs_to_reach']})")
    print(f"  {'mean':<16} {100 * novel['mean_accuracy'][0]:6.2f}% -> {100 * novel['mean_final']:6.2f}% "
          f"(epochs to reach {novel['mean_epochs_to_reach']:.1f})")


def cmd_adapt(args: argparse.Namespace) -> int:
    from fedhet.launch.adapt import adapt_run

    result = adapt_run(args.run_dir, list(args.overrides), progress=not args.quiet, data=args.data, name=args.name,
                       export=args.export, overwrite=args.overwrite)
    _print_novel(result)
    if "export" in result:
        print(f"adapted model: {result['export']}")
    print(f"results: {Path(args.run_dir) / 'novel.json'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import json

    from fedhet.launch.export import export_run

    out = export_run(args.run_dir, args.out, overwrite=args.overwrite)
    manifest = json.loads((out / "export.json").read_text())
    for name, entry in manifest["clients"].items():
        print(f"  {name:<16} {entry['file']}")
    glob = manifest["global"]
    print(f"  {'global':<16} {glob['file'] or 'none: ' + glob['note']}")
    print(f"exported: {out}  (load one: fedhet.load_exported('{out}', client=NAME))")
    return 0


def _print_config_changes(changes: list[dict[str, Any]]) -> None:  # Any: config values
    """The changes accepted on resume (extended rounds, --allow-config-change), as summary.json records them."""
    from fedhet.engine.loop import ROUNDS_NOTE

    for c in changes:
        note = ROUNDS_NOTE if c["key"] == "rounds" else ""
        print(f"config change at the resume after round {c['round']}: {c['key']} {c['old']!r} -> {c['new']!r}{note}")


def _print_final(final: dict[str, dict[str, float]], quiet: bool, attack: JSONDict | None = None) -> None:
    from fedhet.report.final_table import attack_lines, final_table

    for line in final_table(final, quiet) + attack_lines(attack):
        print(line)


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedhet.config import load_config
    from fedhet.engine.loop import run_dir_for
    from fedhet.launch.sweep import check_plan, plan_sweep, run_sweep
    from fedhet.outpaths import check_output_dir
    from fedhet.report import write_report
    from fedhet.tune.sweep import check_lines, plan_tuned_sweep, run_tuned_sweep

    methods, seeds = csv_list(args.methods, "--methods"), csv_list(args.seeds, "--seeds", int)
    datasets = csv_list(args.datasets, "--datasets")
    cfg = load_config(args.config, args.overrides)  # a sweep names its config file (no key=value in its place)
    cfg.run.quiet = cfg.run.quiet or args.quiet
    tuned = plan_tuned_sweep(cfg, args.tune, methods, seeds, datasets, Path(args.config).parent) if (
        args.tune is not None or cfg.sweep.get("tune")) else None  # tune/sweep.py
    plan = tuned.defaults if tuned else plan_sweep(cfg, methods, seeds, datasets)
    checked = check_plan(plan)  # every run valid before any is trained
    if args.check:
        for one, status in checked:
            print(f"{status:<9} {one.variant:<24} seed {one.seed:<3} {one.data.dataset:<20} {run_dir_for(one)}")
        print("".join(line + "\n" for line in check_lines(tuned)) if tuned else "", end="")
        counts = {s: sum(1 for _, st in checked if st == s) for s in ("finished", "resume", "new")}
        print(f"{len(checked)} runs valid: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0
    out = Path(args.report_dir) if args.report_dir else Path(cfg.run.out_dir) / cfg.name / "report"
    check_output_dir(out, "--report-dir" if args.report_dir else "the sweep's report folder")
    run_dirs = run_tuned_sweep(tuned, not args.quiet) if tuned else run_sweep(plan, progress=not args.quiet)
    _print_report(write_report(run_dirs, out))
    return 0


def _load_reference(path: str | None) -> Reference | None:
    """Published numbers to print beside the measured ones: YAML {client: {method: [mean, std]}}."""
    if path is None:
        return None
    from fedhet.config.examples import find_config
    from fedhet.yaml_input import load_yaml, read_text

    ref_path = find_config(path)  # configs/paper/... is also shipped with fedhet
    if not ref_path.is_file():
        raise FedhetError(f"reference file '{path}' not found (see configs/paper/ for examples)")
    data = load_yaml(read_text(ref_path, "reference file"), f"reference file '{path}'")
    if not isinstance(data, dict):
        raise FedhetError(f"reference file '{path}' must map client -> method -> [mean, std]")
    return data


def _print_report(paths: ReportPaths) -> None:
    """A report's terminal summary and where the whole report is (`fedhet.report.ReportPaths`)."""
    print(paths.summary, end="")
    print(f"report (tables per client, curves, runs): {paths.markdown}")


def cmd_report(args: argparse.Namespace) -> int:
    from fedhet.outpaths import check_output_dir
    from fedhet.report import write_report

    check_output_dir(Path(args.out), "--out")
    _print_report(write_report([Path(p) for p in args.run_dirs], Path(args.out),
                               reference=_load_reference(args.reference)))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    if args.action == "list":  # from the shipped catalog: no torch import
        from fedhet.config import DataConfig
        from fedhet.dataset_catalog import load_catalog, presence

        root = DataConfig().resolved_root()  # $FEDHET_DATA
        print(f"data root: {root or 'not set (FEDHET_DATA or data.root)'}\n")
        for entry in load_catalog():
            print(f"{entry['text']}\non this machine: {presence(entry, root)}\n")
        return 0
    from fedhet.data import build_federated_data

    if args.plot:
        from fedhet.outpaths import check_plot_file

        check_plot_file(Path(args.plot))
    cfg = _load(args)
    data = build_federated_data(cfg.data, cfg.seed)
    print(data.describe())
    if args.plot:
        from fedhet.data.show import partition_label, plot_partition

        print(f"plot: {plot_partition(data, Path(args.plot), label=partition_label(cfg.data, cfg.seed))}")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from fedhet.launch.pretrain import pretrain_backbone

    done = pretrain_backbone(_load(args), args.out, epochs=args.epochs, minutes=args.minutes, force=args.force,
                             progress=not args.quiet)
    how = "pretrained" if done.trained else "found (same config and budget; --force trains again)"
    print(f"backbone {how}: {done.path}  held-out accuracy {done.accuracy:.4f}  ({done.meta.get('steps')} steps, "
          f"{done.meta.get('seconds')} s)")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """Every built-in method with its whole description and what it needs; read without importing torch."""
    import textwrap

    from fedhet.method_catalog import TUNERS, method_catalog

    for e in method_catalog():
        kind = "one-shot" if e.one_shot else "centralized oracle" if e.centralized else \
            "personalized (each client deploys its own model)" if e.personalized else "one global model"
        runtimes = "in-process" if e.centralized else "in-process, Flower; batched where its rule allows"
        print(textwrap.fill(e.summary, 110, initial_indent=f"{e.name:<11} ", subsequent_indent=" " * 12))
        print(f"{'':<11} {kind}; runtimes: {runtimes}" + (f"; needs: {e.requires}" if e.requires else ""))
    print(textwrap.fill(f"tuners: {TUNERS}", 110, subsequent_indent=" " * 12))
    print("Batched: run.runtime=batched checks at start whether a method vectorizes and refuses it by name "
          "otherwise (docs/runtimes_batched.md lists which do). Plug-in methods (imports:) are not listed here.")
    return 0


def cmd_flower(args: argparse.Namespace) -> int:
    """Flower runtime: simulate (simulation engine), deploy (local SuperLink + SuperNodes), app (App folder)."""
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
    if args.action == "check":
        from fedhet.runtimes.flower.app_checks import check_overrides, summary_line

        print(summary_line(check_overrides(args.config or "flower-app", args.run_config)))
        return 0
    cfg = _load(args)
    cfg.attack.validate("flower")  # an attack runs in process only: refused by name (config/attack.py)
    run_dir = Path(args.run_dir) if args.run_dir else run_dir_for(cfg)
    if args.workdir is not None or args.action == "app":
        from fedhet.outpaths import check_output_dir

        holds = "the Flower App" if args.action == "app" else "Flower's logs and FLWR_HOME"
        check_output_dir(Path(args.workdir or "flower-app"), "--workdir", holds)
    if args.action == "simulate":
        from fedhet.runtimes.flower.simulation import run_flower_simulation

        _print_final(run_flower_simulation(cfg, run_dir, num_cpus=args.num_cpus, cpus_per_client=args.cpus_per_client,
                                           progress=not args.quiet, resume=args.resume,
                                           stop_after=args.stop_after).final, cfg.run.quiet or args.quiet)
    elif args.action == "deploy":
        from fedhet.runtimes.flower.deploy import deploy_experiment

        deploy_experiment(cfg, run_dir, workdir=args.workdir, port=args.port, resume=args.resume,
                          stop_after=args.stop_after, tls_dir=args.tls_dir, workers=not args.no_workers,
                          supernode_auth=args.supernode_auth, progress=False if args.quiet else None)
    else:
        from fedhet.runtimes.flower.deploy import write_flower_app

        config = cfg.to_dict()
        config["run"]["runtime"] = "flower"
        app = write_flower_app(args.workdir or "flower-app", config, run_dir, resume=args.resume,
                               stop_after=args.stop_after or 0, node_data=args.node_data)
        print(f"Flower App: {app}\nrun it with: flwr run {app} <superlink-connection> --stream\n(check a --run-config "
              f"first: fedhet flower check {app} --run-config \"train.lr=0.05\")")
        return 0
    print(f"results: {run_dir}")
    return 0


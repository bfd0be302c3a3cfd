"""`fedhet privacy RUN_DIR [--split-members train] [--split-nonmembers test] [-q]`: membership inference on a
run's deployed models (rundir.py), a table on stdout and privacy.json in the run directory.

Registered by one line in `fedhet.cli_parser.build_parser`; torch and the engine are imported only when the
command runs, so `fedhet --help` stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    from fedhet.yaml_input import JSONDict

    Subparsers: TypeAlias = argparse._SubParsersAction[Any]  # Any: argparse's own parameter

COLUMNS = (("loss gap", "loss", "gap"), ("entropy gap", "entropy", "gap"), ("loss acc", "loss", "attack_accuracy"),
           ("loss AUC", "loss", "auc"), ("mentr acc", "modified_entropy", "attack_accuracy"))


def add_privacy_parser(sub: Subparsers) -> None:
    """Add the `privacy` subcommand to the `fedhet` parser."""
    privacy = sub.add_parser("privacy", help="membership inference on a run's deployed models (loss / entropy gaps "
                                             "and threshold attacks): fedhet privacy RUN_DIR")
    privacy.add_argument("run_dir", help="a run directory (runs/<name>/<dataset>/<method>/seed<k>) with a checkpoint")
    privacy.add_argument("--split-members", default="train", choices=("train", "val", "test"),
                         help="each client's split whose samples count as members (default: train)")
    privacy.add_argument("--split-nonmembers", default="test", choices=("train", "val", "test"),
                         help="each client's split whose samples count as non-members (default: test)")
    privacy.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    privacy.set_defaults(func=cmd_privacy)


def format_result(result: JSONDict) -> list[str]:
    """The table `fedhet privacy` prints: one row per client, then avg and pooled, then Table 4's numbers."""
    lines = [f"{'client':<16} {'members':>8} {'non-mem':>8} " + " ".join(f"{title:>11}" for title, _, _ in COLUMNS)]
    rows = {**result["clients"], "avg": result["avg"], "pooled": result["pooled"]}
    for name, report in rows.items():
        cells = " ".join(f"{report[score][key]:>11.4f}" for _, score, key in COLUMNS)
        lines.append(f"{name:<16} {report['num_members']:>8} {report['num_nonmembers']:>8} {cells}")
    table4 = result["table4"]
    lines.append(f"Table 4 (pooled, mean non-member - mean member; lower = better privacy): entropy "
                 f"{table4['entropy']:.4f}, loss {table4['loss']:.4f}")
    if not result.get("finished", True):
        lines.insert(0, f"NOTE: this run is not finished: the model attacked is its latest checkpoint, after round "
                        f"{result.get('round', '?')} of {result.get('rounds', '?')} (finish it with fedhet run "
                        "CONFIG --resume for the deployed model's numbers)")
    return lines


def cmd_privacy(args: argparse.Namespace) -> int:
    """Run the evaluation, print the table and where privacy.json is."""
    from fedhet.privacy.rundir import PRIVACY_FILE, evaluate_run

    result = evaluate_run(args.run_dir, args.split_members, args.split_nonmembers, progress=not args.quiet)
    print("\n".join(format_result(result)))
    print(f"results: {Path(args.run_dir) / PRIVACY_FILE}")
    return 0

"""`fedhet privacy RUN_DIR [--split-members train] [--split-nonmembers test] [-q]`: membership inference on a
run's deployed models (rundir.py), a table on stdout and privacy.json in the run directory. `--view server`: the
same attack on what each client uploads (server_view.py); `--attack inversion [--client NAME] [--batch B]
[--steps K] [--iters N] [--restarts R] [--method dlg|ig]`: reconstruct a client's images from its upload
(invert_run.py).

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
    privacy = sub.add_parser("privacy", help="attacks on a run: membership inference on its deployed models or on "
                                             "its clients' uploads, inversion of an upload: fedhet privacy RUN_DIR")
    privacy.add_argument("run_dir", help="a run directory (runs/<name>/<dataset>/<method>/seed<k>) with a checkpoint")
    privacy.add_argument("--attack", default="membership", choices=("membership", "inversion"),
                         help="membership inference (default) or inversion of one client's upload")
    privacy.add_argument("--view", default="deployed", choices=("deployed", "server"),
                         help="membership: attack each client's deployed model (default) or what it uploads")
    privacy.add_argument("--client", default=None, help="inversion: the client attacked (default: the first)")
    privacy.add_argument("--batch", type=int, default=1, help="inversion: images in the attacked batch (default 1)")
    privacy.add_argument("--steps", type=int, default=1, help="inversion: local SGD steps on it (default 1)")
    privacy.add_argument("--iters", type=int, default=500, help="inversion: attack iterations (default 500)")
    privacy.add_argument("--restarts", type=int, default=1,
                         help="inversion: tries from other random starts, the best objective kept (default 1)")
    privacy.add_argument("--method", default="ig", choices=("dlg", "ig"),
                         help="inversion: dlg (L2, L-BFGS) or ig (cosine + TV, Adam; default)")
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


def format_server_view(result: JSONDict) -> list[str]:
    """The table of `--view server`: per client, avg and pooled, the uploaded model's loss attack and the
    calibrated loss change."""
    lines = [f"{'client':<16} {'members':>8} {'non-mem':>8} {'loss gap':>9} {'loss AUC':>9} {'change AUC':>11} "
             f"{'change acc':>11}"]
    for name, r in {**result["clients"], "avg": result["avg"], "pooled": result["pooled"]}.items():
        lines.append(f"{name:<16} {r['num_members']:>8} {r['num_nonmembers']:>8} {r['loss']['gap']:>9.4f} "
                     f"{r['loss']['auc']:>9.4f} {r['loss_change']['auc']:>11.4f} "
                     f"{r['loss_change']['attack_accuracy']:>11.4f}")
    return [f"server view: the uploads of round {result['attacked_round']} (loss change = uploaded - global)", *lines]


def format_inversion(result: JSONDict) -> list[str]:
    """The table of `--attack inversion`: one row per true image, then the means."""
    lines = [f"inversion ({result['inversion']}, {result['iters']} iterations) of client {result['client']}'s "
             f"upload, batch {result['batch']}, {result['steps']} local step(s), labels {result['labels']}",
             f"{'image':>6} {'match':>6} {'PSNR dB':>8} {'SSIM':>7}"]
    for i, m in enumerate(result["images"]):
        lines.append(f"{i:>6} {m['match']:>6} {m['psnr']:>8.2f} {m['ssim']:>7.4f}")
    lines.append(f"{'mean':>6} {'':>6} {result['psnr']:>8.2f} {result['ssim']:>7.4f}")
    return lines


def cmd_privacy(args: argparse.Namespace) -> int:
    """Run the attack, print its table and where privacy.json is."""
    from fedhet.privacy.rundir import PRIVACY_FILE

    progress = not args.quiet
    if args.attack == "inversion":
        from fedhet.privacy.invert_run import invert_run

        lines = format_inversion(invert_run(args.run_dir, args.client, args.batch, args.iters, args.method,
                                            args.steps, restarts=args.restarts))
    elif args.view == "server":
        from fedhet.privacy.server_view import evaluate_server_view

        lines = format_server_view(evaluate_server_view(args.run_dir, args.split_members, args.split_nonmembers,
                                                        progress))
    else:
        from fedhet.privacy.rundir import evaluate_run

        lines = format_result(evaluate_run(args.run_dir, args.split_members, args.split_nonmembers, progress))
    print("\n".join(lines))
    print(f"results: {Path(args.run_dir) / PRIVACY_FILE}")
    return 0

"""The node-side steps of a real fedhet deployment (FedBN quickstart, 5 rounds) from Flower's DEBUG logs.

Per SuperNode and message: the pull, the time until the new ClientApp process has started ("to app start":
the SuperExec's task poll, the process start and Flower's import), the app (the lean ClientApp's hop to the
fedhet worker and the training), the SuperNode's reply wait (0.5 s checks), the push, and the idle time to the
node's next message (its 3 s sleep after an empty pull). Complements flower_breakdown.py, which follows the no-op
floor's messages from the server's push on.

    python benchmarks/flower_deploy_breakdown.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

os.environ["FLWR_LOG_LEVEL"] = "DEBUG"  # read by every Flower process the federation starts
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flower_breakdown import events  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.runtimes.flower.deploy import deploy_experiment  # noqa: E402

MARKS = ("Receiving:", "Received successfully", "Start `flwr-clientapp` process", "Runtime.PushMessages",
         "Sending:", "Sent successfully")


def messages(log: Path) -> list[dict[str, float]]:
    """The time of each mark, per message of one SuperNode's log."""
    _, found = events([log])
    out, cur = [], {}
    for stamp, text in found:
        mark = next((m for m in MARKS if text.startswith(m)), None)
        if mark is not None:
            cur[mark] = stamp
            if mark == MARKS[-1]:
                out.append(cur)
                cur = {}
    return out


def steps(msgs: list[dict[str, float]]) -> list[dict[str, float]]:
    pull, received, started, pushed, sending, sent = MARKS
    out = []
    for a, b in zip(msgs, [*msgs[1:], None], strict=True):
        row = {"pull": a[received] - a[pull], "to app start": a[started] - a[received], "app": a[pushed] - a[started],
               "reply wait": a[sending] - a[pushed], "push": a[sent] - a[sending]}
        if b is not None:
            row["idle to next"] = b[pull] - a[sent]
        out.append(row)
    return out


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="fedhet-deploy-breakdown-"))
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml",
                      ["method=fedbn", "rounds=5", "run.quiet=true"])
    deploy_experiment(cfg, base / "run", workdir=base / "work", progress=False)
    rows = [row for log in sorted((base / "work" / "logs").glob("supernode-*.log")) for row in steps(messages(log))]
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        print(f"{key:>14}: mean {statistics.mean(values):.2f} s, min {min(values):.2f}, max {max(values):.2f}")
    summary = json.loads((base / "run" / "summary.json").read_text())
    print(f"round_time_s {summary.get('round_time_s')}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Where a deployed Flower round's time goes: runs the no-op floor of benchmarks/flower_overhead.py with
FLWR_LOG_LEVEL=DEBUG (Flower's logs get millisecond timestamps) and splits every message's trip from the
ServerApp's push to the ServerApp seeing its reply into the steps Flower takes:

    idle wait     ServerApp push -> the SuperNode's pull returns it ("Receiving:"); the SuperNode sleeps 3 s
                  after every empty pull (hard-coded in flwr 1.41)
    pull          "Receiving:" -> "Received successfully" (the message's objects fetched)
    spawn         -> the new flwr-clientapp process logs its first line (the SuperExec's task poll,
                  FLWR_SUPEREXEC_TASK_POLL_INTERVAL, plus fork/exec and Python start-up)
    import        -> "Start `flwr-clientapp` process" (the process imports Flower)
    app           -> the ClientApp pushes its reply ("Runtime.PushMessages": FAB, app import, message pull,
                  the no-op handler)
    reply wait    -> "Sending:" (the SuperNode checks for the reply in 0.5 s steps)
    push          -> "Sent successfully"
    server pull   -> the ServerApp's pull sees the reply (its poll interval)

    python benchmarks/flower_breakdown.py --rounds 5 --task-poll-interval 1 --out /tmp/breakdown_default.json

Round 1 (FAB download, first imports) is left out of the means. Per-round times are those of the DEBUG run
(compare with benchmarks/flower_overhead.py --modes floor for the plain one).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["FLWR_LOG_LEVEL"] = "DEBUG"  # read by every Flower process the federation starts

from flower_overhead import run_floor, workload  # noqa: E402

from fedhet.atomic import atomic_write_text  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"^\w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):\s+(.*)$")
STEPS = (("idle wait", "Receiving:"), ("pull", "Received successfully"), ("spawn", "DEBUG logs enabled"),
         ("import", "Start `flwr-clientapp` process"), ("app", "Runtime.PushMessages"), ("reply wait", "Sending:"),
         ("push", "Sent successfully"))


def events(logs: list[Path]) -> tuple[str, list[tuple[float, str]]]:
    """(node id, [(unix time, message)] in time order) of one SuperNode's logs (with isolation "process" its
    SuperExec's log holds the ClientApp processes' lines), the no-op handler's own lines included."""
    node, found = "", []
    for log in logs:
        for raw in log.read_text(errors="replace").splitlines():
            line = ANSI.sub("", raw)
            if line.startswith("[noop] handler "):
                found.append((float(line.split()[-1]), "handler"))
            elif m := STAMP.match(line):
                stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((stamp, m.group(2)))
                if m.group(2).startswith("SuperNode ID: "):
                    node = m.group(2).split()[-1]
    return node, sorted(found, key=lambda e: e[0])


def trips(found: list[tuple[float, str]], waves: list[dict[str, Any]], node: str) -> list[dict[str, float]]:
    """One dict of step durations per wave for this node, matched in order (one message per node per wave)."""
    out, i = [], 0
    for wave in waves:
        times = [wave["push"]]
        for _, marker in STEPS:
            while i < len(found) and not found[i][1].startswith(marker):
                i += 1
            if i == len(found):
                raise ValueError(f"node {node}: no {marker!r} for wave {wave['round']} {wave['kind']}")
            times.append(found[i][0])
        times.append(wave["replies"][node])
        steps = [name for name, _ in STEPS] + ["server pull"]
        out.append({name: b - a for name, a, b in zip(steps, times[:-1], times[1:], strict=True)})
    return out


def breakdown(work: Path) -> dict[str, Any]:
    """Mean seconds of each step over nodes and waves (round 1 left out), and along each wave's last reply."""
    floor = json.loads((work / "floor.json").read_text())
    waves = floor["waves"]
    per_node = {}
    logs = work / "floor-flower" / "logs"
    for log in sorted(logs.glob("supernode-*.log")):
        node, found = events([log, *logs.glob(f"superexec-{log.stem.split('-')[1]}.log")])
        per_node[node] = trips(found, waves, node)
    keep = [w for w, wave in enumerate(waves) if wave["round"] > 1]
    steps = list(next(iter(per_node.values()))[0])
    mean = {s: statistics.mean(per_node[n][w][s] for n in per_node for w in keep) for s in steps}
    last = [max(waves[w]["replies"].items(), key=lambda kv: float(kv[1]))[0] for w in keep]  # the node waited for
    critical = {s: statistics.mean(per_node[n][w][s] for n, w in zip(last, keep, strict=True)) for s in steps}
    wave_s = statistics.mean(max(waves[w]["replies"].values()) - waves[w]["push"] for w in keep)
    rounds = floor["round_s"][1:]
    return {"mean_step_s": mean, "last_reply_step_s": critical, "wave_s": wave_s,
            "round_s": statistics.mean(rounds), "round_s_all": floor["round_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--poll-interval", type=float, default=0.2, help="the no-op ServerApp's reply polling")
    parser.add_argument("--task-poll-interval", type=float, default=None, help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL")
    parser.add_argument("--isolation", default="subprocess", choices=("subprocess", "process"))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fedhet-flower-breakdown-"))
    cfg = workload(args.rounds, [])
    floor = run_floor(cfg, work, args.poll_interval, args.task_poll_interval, [], isolation=args.isolation)
    report = {"rounds": args.rounds, "poll_interval": args.poll_interval,
              "task_poll_interval": args.task_poll_interval, "isolation": args.isolation,
              "load_avg": os.getloadavg(), "total_s": floor["total_s"], **breakdown(work)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()

"""Issue 41 item 7, the thesis's privacy and robustness claims measured: one resumable command that regenerates
docs/results/privacy_robustness.md (the page says what each section measures and how).

    python benchmarks/privacy_robustness.py --plan            # the planned cells and time; runs nothing
    python benchmarks/privacy_robustness.py                   # every section, seeds 0,1,2, offline + digits
    python benchmarks/privacy_robustness.py --sections b --seeds 0 --datasets offline --cells none-mean,none-median
    python benchmarks/privacy_robustness.py --smoke --runs /tmp/pr --out /tmp/pr/page.md    # tiny, seconds per cell

Each cell is a `fedhet sweep` run, <runs>/pr_<section>_<setting>/<dataset>/<cell>/seed<k>: finished runs are
skipped, interrupted ones resumed; an attack (`fedhet privacy`) is skipped when privacy.json has its entry, and one
fedhet refuses is recorded with the reason. Seeds go outermost. With --runs runs (the default) finished runs are
archived in git (benchmarks/run_archive.py) and restored first. Every call rewrites the whole page from the runs
present (privacy_robustness_page.py; "pending" where none); the time each section took is summed in <out>.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DP_DELTA = 1e-3  # < 1/N for N = 40 clients
DP_CLIP = 1.0  # C, fixed (not tuned)
EPSILONS: tuple[float | None, ...] = (1.0, 4.0, 8.0, None)  # None: no DP (epsilon = infinity)
METHODS_A = ("fedavg", "fedbn", "ditto", "ditto_mmd", "fraug")
METHODS_D = ("fedavg", "fedbn", "fraug")  # section a's epsilon = inf runs, attacked on their uploads
FEDDAT_D = ("feddat", "adapter", "full")  # configs/feddat/tables.yaml's variants
ATTACKS = ("none", "label_flip", "sign_flip")
DEFENSES = ("mean", "median", "trimmed_mean", "krum", "norm_bound", "geometric_median")
NORM_BOUND = 1.0  # M of norm_bound, the DP clip norm (not tuned)
SIGN_FACTOR = 4.0  # k of sign_flip: uploads g - 4 d
INVERSION = {"batch": 2, "steps": 1, "iters": 300, "method": "ig"}  # batch 2: BatchNorm1d cannot train on one image


@dataclass(frozen=True)
class Setting:
    """One benchmark: its config and overrides, the attackers of section b and the planning constants."""

    key: str
    config: str
    overrides: tuple[str, ...]
    rounds: int
    attackers: tuple[str, ...]  # section b's attackers, none from the outlier domain
    outlier: str  # the honest outlier domain (the one a defense may punish)
    client: str  # the client whose upload section d inverts
    round_s: float  # planning: CPU s a round of 10 clients (offline measured: 2.6, + ~6 s a run for data, evals)
    attack_s: float = 15.0  # planning: seconds of one attack (membership, server view, inversion) on a run
    q: float = 0.25  # clients sampled per round / clients: the accountant's sampling rate


_SHIFT = ("data.clients_per_domain=10", "server.fraction_fit=0.25", "eval.every=10", "run.checkpoint_every=10")
SETTINGS = {
    "offline": Setting("offline", "configs/quickstart.yaml", (*_SHIFT, "data.fraction=1.0"), 30,
                       ("clean#0", "colored#0", "thick_blur#0"), "inverted", "clean#0", round_s=2.8),
    # small_cnn at the quickstart's lr stands in for the FedBN CNN (digits_cnn: ~10x the cost per step)
    "digits": Setting("digits", "configs/cpu/digits.yaml", (*_SHIFT, "data.max_train_per_client=60",
                      "data.max_test_per_client=50", "model.name=small_cnn", "model.args={width: 16}", "train.lr=0.1",
                      "run.num_threads=1"), 20, ("mnist#0", "synth_digits#0", "usps#0"), "mnist_m", "mnist#0",
                      round_s=2.9),
    "easy_vqa": Setting("easy_vqa", "configs/feddat/tables.yaml", ("data.dataset=easy_vqa_domain",), 20, (), "", "",
                        round_s=6.0, attack_s=20.0),
}
SMOKE = ("rounds=2", "eval.every=1", "train.local_steps=2", "data.clients_per_domain=3", "server.fraction_fit=0.5",
         "run.checkpoint_every=1", "run.num_threads=1")  # 12 clients, 6 per round


@dataclass(frozen=True)
class Cell:
    """One cell of a section: a sweep variant (method and nested settings) on one setting."""

    section: str
    setting: Setting
    label: str
    variant: dict[str, Any] = field(hash=False)  # Any: YAML values
    attacks: tuple[str, ...] = ()  # membership | server | inversion

    @property
    def name(self) -> str:  # section d attacks section a's runs (FedDAT's are its own)
        shared = self.section == "d" and self.setting.key != "easy_vqa"
        return f"pr_{'a' if shared else self.section}_{self.setting.key}"


@cache
def noise_for(epsilon: float, q: float, rounds: int, delta: float = DP_DELTA) -> float:
    """The sigma that spends `epsilon` (never more) in `rounds` rounds at rate q: bisection on fedhet's accountant."""
    from fedhet.core.dp_accountant import epsilon as spent

    low, high = 0.1, 100.0  # epsilon decreases in sigma; 100 spends < 0.1 in any setting here
    while high / low > 1 + 1e-4:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if spent(q, mid, rounds, delta) > epsilon else (low, mid)
    return math.ceil(high * 1e4) / 1e4  # rounded up: epsilon never above the target


def section_a(s: Setting) -> list[Cell]:
    """DP cost: each method at each epsilon (sigma calibrated for the setting's rounds and q)."""
    cells = []
    for method in METHODS_A:
        for eps in EPSILONS:
            dp = {} if eps is None else {"privacy": {"dp": {"mode": "server", "clip": DP_CLIP, "delta": DP_DELTA,
                                                           "noise_multiplier": noise_for(eps, s.q, s.rounds)}}}
            cells.append(Cell("a", s, f"{method}_eps{'inf' if eps is None else f'{eps:g}'}", {"method": method, **dp},
                              ("membership",)))
    return cells


def defense(rule: str, attackers: int) -> dict[str, Any]:  # Any: YAML values
    """The server section of one defense (the mean: uniform, as the base configs)."""
    server: dict[str, Any] = {"aggregation": "uniform" if rule == "mean" else rule}  # Any: YAML values
    if rule != "mean":
        server["byzantine"] = attackers
    if rule == "trimmed_mean":
        server["trim"] = 0.3  # int(0.3 n) >= f for f = 3 of n = 10
    if rule == "norm_bound":
        server["norm_bound"] = NORM_BOUND
    return server


def section_b(s: Setting) -> list[Cell]:
    """Robust aggregation under feature shift: attacks x defenses, FedBN (BatchNorm local)."""
    cells = []
    for attack in ATTACKS:
        extra = {} if attack == "none" else {"attack": {
            "kind": attack, "clients": list(s.attackers), **({"factor": SIGN_FACTOR} if attack == "sign_flip" else {})}}
        for rule in DEFENSES:
            cells.append(Cell("b", s, f"{attack}-{rule}", {"method": "fedbn", "server": defense(rule, len(s.attackers)),
                                                           **extra}))
    return cells


def section_d(s: Setting) -> list[Cell]:
    """Inversion and membership inference of the uploads: section a's no-DP runs, or FedDAT's variants."""
    if s.key == "easy_vqa":
        return [Cell("d", s, label, {"method": "feddat"} if label == "feddat" else {
            "method": "peft", "method_args": {"kind": label}}, ("membership", "server")) for label in FEDDAT_D]
    return [Cell("d", s, f"{m}_epsinf", {"method": m}, ("membership", "server", "inversion")) for m in METHODS_D]


def plan(sections: str, settings: list[Setting]) -> list[Cell]:
    """Every cell of the chosen sections on the chosen settings, in page order."""
    cells: list[Cell] = []
    for s in settings:
        if "a" in sections and s.key != "easy_vqa":
            cells += section_a(s)
        if "b" in sections and s.key != "easy_vqa":
            cells += section_b(s)
        if "d" in sections:
            cells += section_d(s)
    return cells


def smoke(s: Setting) -> Setting:
    """The tiny version of a setting (--smoke): 12 clients, 6 per round, 2 rounds, one attacker."""
    return replace(s, overrides=(*s.overrides, *SMOKE), rounds=2, attackers=(s.attackers[0],), q=0.5)


def attack_key(cell: Cell, attack: str) -> str:
    """The privacy.json entry an attack writes (fedhet.privacy: rundir, server_view, invert_run)."""
    if attack == "inversion":
        return f"inversion_{INVERSION['method']}_{cell.setting.client}_b{INVERSION['batch']}_k{INVERSION['steps']}"
    return "server_train_vs_test" if attack == "server" else "train_vs_test"


def train(cell: Cell, seed: int, runs: Path) -> Path:
    """The cell's run on `seed` (a finished run skipped, an interrupted one resumed): its run directory."""
    from fedhet.config import load_config
    from fedhet.launch.sweep import plan_sweep, run_sweep

    s = cell.setting
    cfg = load_config(ROOT / s.config, [*s.overrides, f"rounds={s.rounds}", f"name={cell.name}",
                                        f"run.out_dir={runs}", "run.quiet=true"])
    cfg.sweep = {"variants": {cell.label: cell.variant}}
    return run_sweep(plan_sweep(cfg, [cell.label], [seed]), progress=False)[0]


def attack(cell: Cell, run_dir: Path, refused: dict[str, str]) -> None:
    """The cell's attacks on its run, each skipped when privacy.json has its entry (or fedhet refused it)."""
    from fedhet.errors import FedhetError
    from fedhet.privacy.invert_run import invert_run
    from fedhet.privacy.rundir import PRIVACY_FILE, evaluate_run
    from fedhet.privacy.server_view import evaluate_server_view

    path = run_dir / PRIVACY_FILE
    done = json.loads(path.read_text()) if path.is_file() else {}
    for kind in cell.attacks:
        where = f"{run_dir}:{kind}"
        if attack_key(cell, kind) in done or where in refused:
            continue
        try:
            if kind == "membership":
                evaluate_run(run_dir, progress=False)
            elif kind == "server":
                evaluate_server_view(run_dir, progress=False)
            else:
                invert_run(run_dir, cell.setting.client, INVERSION["batch"], INVERSION["iters"], INVERSION["method"],
                           INVERSION["steps"])
        except FedhetError as err:
            refused[where] = str(err)


def planned_seconds(cells: list[Cell], seeds: int) -> dict[str, float]:
    """The planned seconds of each section: training (a run shared by two sections counted once) and attacks."""
    out: dict[str, float] = {}
    seen: set[tuple[str, str]] = set()
    for c in cells:
        s = c.setting
        train_s = 0.0 if (c.name, c.label) in seen else s.rounds * s.round_s
        seen.add((c.name, c.label))
        out[c.section] = out.get(c.section, 0.0) + seeds * (train_s + len(c.attacks) * s.attack_s)
    return out


def sibling(name: str) -> ModuleType:
    """benchmarks/<name>.py (beside this file, not a package): the page writer, run_archive."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(todo: list[Cell], seeds: list[int], runs: Path, record: dict[str, Any], save: Callable[[], None]
        ) -> None:  # Any: JSON
    """Train and attack every cell of `todo` on every seed (seeds outermost); the time of each section is added to
    `record`, and `save` (the page and the record) runs after each cell."""
    from fedhet.errors import FedhetError

    for seed in seeds:
        for cell in todo:
            start = time.perf_counter()
            try:
                run_dir = train(cell, seed, runs)
            except FedhetError as err:
                record["refused"][f"{cell.name}/{cell.label}/seed{seed}"] = str(err)
                continue
            attack(cell, run_dir, record["refused"])
            if runs.resolve() == (ROOT / "runs").resolve():
                sibling("run_archive").save([run_dir])
            record["seconds"][cell.section] = record["seconds"].get(cell.section, 0.0) + time.perf_counter() - start
            save()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="a,b,c,d,e", help="comma-separated, of a,b,c,d,e (default all)")
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; --smoke: 0)")
    parser.add_argument("--datasets", default="offline,digits,easy_vqa", help="settings (easy_vqa: section d only)")
    parser.add_argument("--cells", default="", help="cell labels to run, e.g. none-mean,fedbn_eps4 (default all)")
    parser.add_argument("--smoke", action="store_true", help="tiny: offline only, 12 clients, 2 rounds (tests)")
    parser.add_argument("--plan", action="store_true", help="print the planned cells and time, run nothing")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the runs present")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "privacy_robustness.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("FEDHET_DATA", str(ROOT.parent / "shared" / "data"))
    os.chdir(ROOT)  # FedDAT's config names its backbone relative to the checkout
    keys = ["offline"] if args.smoke else [k.strip() for k in args.datasets.split(",") if k.strip()]
    settings = [smoke(SETTINGS[k]) if args.smoke else SETTINGS[k] for k in keys]  # a KeyError names a bad key
    seeds = [int(x) for x in (args.seeds or ("0" if args.smoke else "0,1,2")).split(",")]
    every = plan("abcde", settings)
    wanted = set(filter(None, args.cells.split(",")))
    todo = [c for c in plan(args.sections.replace(",", ""), settings) if not wanted or c.label in wanted]
    planned = planned_seconds(every, len(seeds))
    print(f"planned (2 cores, h): {({k: round(v / 3600, 2) for k, v in sorted(planned.items())})}, total "
          f"{sum(planned.values()) / 3600:.2f} h; this call: {len(todo)} cells x {len(seeds)} seeds")
    if args.plan:
        return
    page = sibling("privacy_robustness_page")
    record = page.read_record(args.out)

    def save() -> None:  # the page and its record, after each cell
        page.write(args.out, every, seeds, args.runs, record, planned, args.smoke)

    if not (ROOT / "runs" / "feddat" / "backbone.pt").is_file():  # FedDAT's backbone: fedhet pretrain first
        todo = [c for c in todo if c.setting.key != "easy_vqa"]
    if not args.page_only:
        if args.runs.resolve() == (ROOT / "runs").resolve():
            sibling("run_archive").restore()
        run(todo, seeds, args.runs, record, save)
    save()
    print(f"page: {args.out}")


if __name__ == "__main__":
    main()

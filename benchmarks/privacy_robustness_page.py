"""docs/results/privacy_robustness.md from the run directories of benchmarks/privacy_robustness.py: every cell's
numbers over the seeds present (mean ± sample std), "pending" where no seed has finished, the refusals fedhet
gave, and each thesis claim re-stated as holds / does not hold / not measured from those numbers."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCRIPT = "python benchmarks/privacy_robustness.py"
FEDDAT_LABELS = ("feddat", "adapter", "full")
UPLOADS = {"fedavg": "the whole model, BatchNorm statistics included",
           "fedbn": "every layer but BatchNorm (weights, biases, statistics stay local)",
           "fraug": "the classifier's shared part and the generator g (BatchNorm, RTNet, prototypes local)",
           "feddat": "A_s, the shared adapter (local adapters stay)", "adapter": "the adapters",
           "full": "the whole model (full fine-tuning)"}
NOT_RUN_C = ("not run: `fedhet tune` accepts `attack:` and its members' clients do attack (tune/population.py "
             "aggregates through engine.rounds.aggregate_round, which rewrites the attackers' uploads; their "
             "batches are poisoned by runtimes/inprocess.py), but the tuning job records neither the attackers nor "
             "the honest clients' accuracy (docs/robust.md, Runtimes: \"the tuning job reports no attack metrics\"), "
             "and FedPop's evolution replaces hyperparameter configurations (population members), all of which "
             "train on the same clients: nothing in it can remove a client, so \"does the evolution remove them\" "
             "has no quantity to read. Measuring it needs attack metrics in tune's summary (not built here).")
NOT_RUN_E = ("not run: fedhet has no function that decodes a run's uploaded latents. The pieces exist "
             "(models/ldm/client.py instance_latents: the upload z(T) of the interpolated latents, or with "
             "start_latent=fresh its centre; the LDM's VAE; privacy/image_quality.best_matches for PSNR / SSIM), but "
             "joining them to a run (its LDM checkpoint, the upload reproduced from the run's seed, the decode, the "
             "scoring) is more than one small function, and this page measures with existing tools only. The "
             "membership attack on FedBiP's synthetic-data classifier exists: docs/results/fedbip.md.")
NOT_RUN_FRAUG = ("not run: no input-space FRAug variant (`data.input_noise_std` is Gaussian input noise, not FRAug's "
                 "augmentation)")
KEYS_D = (("psnr", 2), ("ssim", 3), ("server_auc", 3), ("change_auc", 3), ("server_adv", 3), ("adv", 3))


def read_record(out: Path) -> dict[str, Any]:  # Any: JSON
    """The record beside the page (seconds per section, refusals), or an empty one."""
    path = out.with_suffix(".json")
    record = json.loads(path.read_text()) if path.is_file() else {}
    return {"seconds": record.get("seconds", {}), "refused": record.get("refused", {})}


def run_dirs(cell: Any, seeds: Sequence[int], runs: Path) -> list[Path]:  # Any: privacy_robustness.Cell
    """The cell's finished run directories among `seeds`."""
    return [p for seed in seeds for p in sorted(runs.glob(f"{cell.name}/*/{cell.label}/seed{seed}"))
            if (p / "summary.json").is_file()]


def numbers(run_dir: Path, outlier: str) -> dict[str, float]:
    """One run's numbers: honest mean, worst-domain and outlier-domain accuracy (domain = the mean of its honest
    clients, a client named <domain>#<k>), membership advantages and AUCs, inversion PSNR / SSIM (as present)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    attackers = set(summary.get("attack", {}).get("clients", []))
    honest = {c: m["accuracy"] for c, m in summary["final"].items() if c != "avg" and c not in attackers}
    domains: dict[str, list[float]] = {}
    for client, acc in honest.items():
        domains.setdefault(client.split("#")[0], []).append(acc)
    means = {d: sum(v) / len(v) for d, v in domains.items()}
    out = {"acc": sum(honest.values()) / len(honest), "worst": min(means.values())}
    if outlier in means:
        out["outlier"] = means[outlier]
    path = run_dir / "privacy.json"
    priv = json.loads(path.read_text()) if path.is_file() else {}
    if "train_vs_test" in priv:
        out["adv"] = priv["train_vs_test"]["avg"]["loss"]["advantage"]
    if "server_train_vs_test" in priv:
        view = priv["server_train_vs_test"]["avg"]
        out.update(server_auc=view["loss"]["auc"], change_auc=view["loss_change"]["auc"],
                   server_adv=view["loss_change"]["advantage"])
    inversion = [v for k, v in priv.items() if k.startswith("inversion_")]
    if inversion:
        out.update(psnr=inversion[0]["psnr"], ssim=inversion[0]["ssim"])
    return out


def collect(cell: Any, seeds: Sequence[int], runs: Path) -> dict[str, list[float]]:  # Any: Cell
    """Each number of the cell over its finished seeds."""
    values: dict[str, list[float]] = {}
    for run_dir in run_dirs(cell, seeds, runs):
        for key, value in numbers(run_dir, cell.setting.outlier).items():
            values.setdefault(key, []).append(value)
    return values


def missing(cell: Any, refused: dict[str, str]) -> str:  # Any: Cell
    """What a cell without a finished seed says: refused (a run fedhet stopped, e.g. a diverged loss) or pending."""
    return "refused (below)" if any(k.startswith(f"{cell.name}/{cell.label}/") for k in refused) else "pending"


def fmt(values: list[float] | None, seeds: int, scale: float = 100.0, digits: int = 1) -> str:
    """mean ± sample std (scaled), with the seed count when some seeds are missing; 'pending' without any."""
    if not values:
        return "pending"
    mean = sum(values) / len(values) * scale
    std = math.sqrt(sum((v * scale - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    return text + (f" ({len(values)} of {seeds} seeds)" if len(values) < seeds else "")


def mean(values: list[float] | None) -> float | None:  # None: no value
    return sum(values) / len(values) if values else None


def table_a(cells: list[Any], seeds: Sequence[int], runs: Path, refused: dict[str, str]) -> list[str]:  # Any: Cell
    """Section a on one setting: methods x epsilon, accuracy / worst domain and the MIA advantage."""
    eps = [c.label.split("_eps")[1] for c in cells if c.label.startswith(cells[0].variant["method"] + "_eps")]
    head = []
    for e in eps:
        cell = next(c for c in cells if c.label.endswith(f"_eps{e}"))
        sigma = cell.variant.get("privacy", {}).get("dp", {}).get("noise_multiplier")
        head.append(f"ε = {'∞' if e == 'inf' else e}" + (f" (σ = {sigma:g})" if sigma else " (no DP)"))
    lines = ["| method | " + " | ".join(head) + " |", "|---" * (len(eps) + 1) + "|"]
    for method in dict.fromkeys(c.variant["method"] for c in cells):
        row = []
        for e in eps:
            cell = next(c for c in cells if c.label == f"{method}_eps{e}")
            v = collect(cell, seeds, runs)
            row.append(f"{fmt(v.get('acc'), len(seeds))} / {fmt(v.get('worst'), len(seeds))} · adv "
                       f"{fmt(v.get('adv'), len(seeds), 1.0, 3)}" if v else missing(cell, refused))
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return lines


def table_b(cells: list[Any], seeds: Sequence[int], runs: Path, refused: dict[str, str]
            ) -> tuple[list[str], list[str]]:  # Any: Cell
    """Section b on one setting: the table, and the defenses within 1 point of the mean's worst domain (no attack)."""
    lines = [f"| attack | defense | honest mean | worst domain | {cells[0].setting.outlier} | Δ worst vs none-mean |",
             "|---|---|---|---|---|---|"]
    base = mean(collect(next(c for c in cells if c.label == "none-mean"), seeds, runs).get("worst"))
    within = []
    for cell in cells:
        attack, rule = cell.label.split("-", 1)
        v = collect(cell, seeds, runs)
        worst = mean(v.get("worst"))
        delta = "" if worst is None or base is None else f"{(worst - base) * 100:+.1f}"
        if attack == "none" and worst is not None and base is not None and rule != "mean" and worst >= base - 0.01:
            within.append(f"{rule} ({delta})")
        acc = fmt(v.get("acc"), len(seeds)) if v else missing(cell, refused)
        lines.append(f"| {attack} | {rule} | {acc} | {fmt(v.get('worst'), len(seeds))} | "
                     f"{fmt(v.get('outlier'), len(seeds))} | {delta} |")
    return lines, within


def table_d(cells: list[Any], seeds: Sequence[int], runs: Path) -> list[str]:  # Any: Cell
    """Section d on one setting: what each method uploads, inversion and membership from the uploads."""
    lines = ["| method | uploads | inversion PSNR dB | SSIM | server view: loss AUC | loss-change AUC | "
             "loss-change adv | deployed MIA adv |", "|---" * 8 + "|"]
    for cell in cells:
        v = collect(cell, seeds, runs)
        method = cell.label.removesuffix("_epsinf")
        numbers_d = " | ".join(fmt(v.get(key), len(seeds), 1.0, digits) for key, digits in KEYS_D)
        lines.append(f"| {method} | {UPLOADS[method]} | {numbers_d} |")
    return lines


def machine() -> str:
    """The CPU model (`grep "model name" /proc/cpuinfo | head -1`) and the core count."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{names[0] if names else 'unknown'}, {len(names)} logical cores visible"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def header(seeds: Sequence[int], record: dict[str, Any], planned: dict[str, float], smoke: bool
           ) -> list[str]:  # Any: JSON
    took = ", ".join(f"{k} {v / 60:.1f} min" for k, v in sorted(record["seconds"].items())) or "nothing run yet"
    plan = ", ".join(f"{k} {v / 3600:.2f} h" for k, v in sorted(planned.items()))
    return [
        "# Privacy and robustness: the thesis's claims measured (issue 41 item 7)", "",
        *(["**SMOKE RUN** (`--smoke`: 12 clients, 2 rounds): these numbers test the script, they measure nothing.",
           ""] if smoke else []),
        f"Regenerate (resumable: finished runs and attacks are skipped): `{SCRIPT}`; one section: "
        f"`{SCRIPT} --sections b`; the plan: `{SCRIPT} --plan`. Seeds: {', '.join(map(str, seeds))}. "
        f"Machine: {machine()}; commit {commit()}. FEDHET_DATA=/work/shared/data (../shared/data).", "",
        "**Data** (stand-ins): *offline* = `configs/quickstart.yaml`'s offline_digits (scikit-learn's 8x8 digits "
        "rendered in 4 domain styles; `inverted` is the outlier domain) with `data.fraction=1.0`; *digits* = "
        "`configs/cpu/digits.yaml` (MNIST, MNIST-M, USPS real, generated SynthDigits for SVHN; MNIST-M the outlier) "
        "with 60 training / 50 test images per client (600 / 500 per domain, as the one-client-per-domain config) "
        "and small_cnn (width 16, lr 0.1 as the quickstart) standing in for the FedBN CNN (about 10x the cost per "
        "step). Both with `data.clients_per_domain=10` (40 clients) and `server.fraction_fit=0.25` (10 sampled per "
        "round): 4 clients would make client-level DP meaningless. Rounds: offline 30 (quickstart: 40), digits 20; "
        "one torch thread, one job at a time. Numbers: mean ± sample std over the seeds, accuracy in %; a domain's "
        "accuracy is the mean of its honest clients'; 'worst' is the lowest domain.", "",
        f"**Time** (2 cores): planned {plan}, total {sum(planned.values()) / 3600:.2f} h (goal ≤ 6 h), from the "
        f"per-round and per-attack CPU seconds in the script's SETTINGS (an idle machine: wall = CPU with one "
        f"thread); taken so far (wall, on a machine shared with other jobs): {took}.", ""]


TEXT = {
    "a": ["## a. The accuracy cost of client-level DP", "",
          "DP-FedAvg, server mode (docs/privacy.md): each sampled client's update of the shared keys clipped to "
          "C = 1.0 (fixed, not tuned), Gaussian noise σC/m on the mean, δ = 1e-3; σ found by bisection on fedhet's "
          "own RDP accountant (core/dp_accountant.py) so that ε(δ) after the last round at q = 10/40 is the target. "
          "Cell: honest mean accuracy / worst domain · MIA advantage (TPR − FPR of the best loss threshold on the "
          "deployed models, train vs test, mean over clients: `fedhet privacy RUN_DIR`)."],
    "b": ["## b. Robust aggregation under feature shift", "",
          "FedBN (BatchNorm local: the rules see the shared keys only). Three of the 40 clients attack, one in each "
          "domain but the outlier (offline: clean#0, colored#0, thick_blur#0; digits: mnist#0, synth_digits#0, "
          "usps#0), so the outlier domain is honest: label_flip trains on y → 9 − y, sign_flip uploads g − 4d. "
          "mean = uniform averaging (the configs' own); trimmed_mean β = 0.3 (int(0.3·10) = 3 ≥ f); krum f = 3; "
          "norm_bound M = 1.0 (not tuned); geometric_median RFA's defaults. Accuracies over honest clients only."],
    "d": ["## d. Inversion and membership inference from the uploads", "",
          "Section a's ε = ∞ runs, attacked on what each client uploads: inversion `fedhet privacy RUN_DIR --attack "
          "inversion --client <first client> --batch 2 --steps 1 --iters 300` (inverting gradients; batch 2: "
          "BatchNorm1d cannot train on one image) and `--view server` (membership on the upload; loss change = "
          "uploaded − global loss). FedDAT: `configs/feddat/tables.yaml` on easy_vqa_domain (A_s vs the adapter "
          "baseline vs full fine-tuning), membership only: the inversion refuses vision-language samples and "
          "AdamW-trained runs (docs/privacy.md, Limits).", "", f"FRAug vs the same augmentation in input space: "
          f"{NOT_RUN_FRAUG}."],
}


def groups(cells: list[Any], section: str) -> dict[str, list[Any]]:  # Any: Cell
    """The section's cells by setting, in page order."""
    out: dict[str, list[Any]] = {}
    for c in cells:
        if c.section == section:
            out.setdefault(c.setting.key, []).append(c)
    return out


def sections(every: list[Any], seeds: Sequence[int], runs: Path, refused: dict[str, str]
             ) -> tuple[list[str], list[str]]:  # Any: Cell
    """Sections a to e, and the defenses of b within 1 point of the mean's worst domain (per setting)."""
    lines: list[str] = []
    within: list[str] = []
    for sec in "abcde":
        if sec == "c":
            lines += ["## c. FedPop vs RS / SHA with malicious clients", "", NOT_RUN_C, ""]
            continue
        if sec == "e":
            lines += ["## e. FedBiP: inversion of the uploaded latents", "", NOT_RUN_E, ""]
            continue
        lines += [*TEXT[sec], ""]
        for key, cells in groups(every, sec).items():
            if not any(run_dirs(c, seeds, runs) for c in cells):
                lines += [f"### {key}", "", f"pending: run `{SCRIPT} --sections {sec} --datasets {key}`", ""]
                continue
            if sec == "b":
                table, ok = table_b(cells, seeds, runs, refused)
                within.append(f"{key}: {', '.join(ok) or 'none'}")
            else:
                table = table_a(cells, seeds, runs, refused) if sec == "a" else table_d(cells, seeds, runs)
            lines += [f"### {key}", "", *table, ""]
    return lines, within


def claims(every: list[Any], seeds: Sequence[int], runs: Path, within: list[str]) -> list[str]:  # Any: Cell
    """Each thesis claim: holds / does not hold / not measured, with the numbers it rests on."""
    def value(cell_label: str, section: str, key: str) -> float | None:
        cells = [c for c in every if c.section == section and c.label == cell_label]
        return mean([x for c in cells for x in collect(c, seeds, runs).get(key, [])])

    fraug, fedbn = value("fraug_epsinf", "d", "psnr"), value("fedbn_epsinf", "d", "psnr")
    vs_fedbn = "pending" if fraug is None or fedbn is None else f"inversion PSNR FRAug {fraug:.2f} dB vs FedBN " \
                                                                  f"{fedbn:.2f} dB (section d)"
    sat = {m: value(m, "d", "server_auc") for m in FEDDAT_LABELS}
    if None in sat.values():
        feddat = "not measured yet (pending section d, easy_vqa)"
    else:
        lower = all(sat["feddat"] <= sat[m] for m in ("adapter", "full"))
        feddat = ("holds" if lower else "does not hold") + " on the server view's loss AUC: " + ", ".join(
            f"{m} {v:.3f}" for m, v in sat.items())
    return ["## The thesis's claims", "",
            f"- FRAug: embedding-space augmentation leaks less than input-space augmentation — **not measured** "
            f"({NOT_RUN_FRAUG}); against FedBN: {vs_fedbn}.",
            f"- FedDAT: keeping part of the adapters local mitigates inference — {feddat}.",
            "- FedPop: the evolution eliminates malicious participants — **not measured** (section c).",
            "- FedBiP: uploaded latents do not give the images away — **not measured** (section e); membership on "
            "its synthetic-data classifier: docs/results/fedbip.md.",
            "- A personalization-aware robust default within 1 point of plain averaging on the worst domain, no "
            "attack (the lead picks the default): " + ("; ".join(within) if within else "pending (section b)") + ".",
            ""]


def write(out: Path, every: list[Any], seeds: Sequence[int], runs: Path, record: dict[str, Any],
          planned: dict[str, float], smoke: bool = False) -> None:  # Any: Cell, JSON
    """The page and its record (<out>.json: seconds per section, refusals)."""
    body, within = sections(every, seeds, runs, record["refused"])
    lines = [*header(seeds, record, planned, smoke), *body, *claims(every, seeds, runs, within)]
    if record["refused"]:
        lines += ["## Refused by fedhet", "", *(f"- `{k}`: {v}" for k, v in sorted(record["refused"].items())), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")

"""What a results page stands on: the runs' `stand_in:` notes and their setting, printed under every title.

A run at CPU scale replaces the paper's backbone, LDM, data or budget with something that runs here. The config
says so in `stand_in:` (free text, not results-relevant), and every generated page (`fedhet report`'s report.md
and the benchmarks' table pages) prints it from the runs' configs, so no number is read without its label.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedhet.yaml_input import JSONDict

BEGIN, END = "<!-- stand-ins -->", "<!-- /stand-ins -->"  # the block's bounds, so it can be replaced in place
NONE_DECLARED = ("**Stand-ins.** None declared: no run's config has a `stand_in:` note. Before comparing with a "
                 "paper, check the setting below against the paper's.")


def _section(config: JSONDict, name: str) -> Mapping[str, Any]:  # Any: parsed YAML
    value = config.get(name)
    return value if isinstance(value, Mapping) else {}


def _joined(values: Iterable[Any]) -> str:  # Any: config values (parsed YAML)
    return ", ".join(sorted({str(v) for v in values if v not in (None, "")}, key=lambda s: (len(s), s)))


def _budget(config: JSONDict) -> str:
    """Rounds and local work of one config, e.g. "20 rounds x 10 local steps, batch 32"."""
    if config.get("tune"):  # a tuning job's members pick their own local work
        return f"{config.get('rounds', '?')} rounds per configuration (train.* as tuned)"
    train = _section(config, "train")
    steps = train.get("local_steps")
    local = f"{steps} local steps" if steps else f"{train.get('local_epochs', 1)} local epoch(s)"
    return f"{config.get('rounds', '?')} rounds x {local}, batch {train.get('batch_size', '?')}"


def _dataset(config: JSONDict) -> str:
    return str(_section(config, "data").get("dataset", "?"))


def stand_in_lines(configs: Sequence[JSONDict]) -> list[str]:
    """One "**Stand-ins.**" line per distinct note, naming the datasets it covers when the runs hold several."""
    notes: dict[str, set[str]] = {}
    for config in configs:
        note = str(config.get("stand_in") or "").strip()
        if note:
            notes.setdefault(note, set()).add(_dataset(config))
    if not notes:
        return [NONE_DECLARED]
    datasets = {_dataset(c) for c in configs}
    lines = []
    for note, where in notes.items():
        scope = f" ({_joined(where)})" if len(datasets) > 1 else ""
        lines.append(f"**Stand-ins{scope}.** {note}")
    undeclared = sorted(datasets - set().union(*notes.values()))
    if undeclared:
        lines.append(f"**Stand-ins ({', '.join(undeclared)}).** None declared in these runs' configs.")
    return lines


def setting_lines(configs: Sequence[JSONDict]) -> list[str]:
    """One "**Setting.**" line per dataset: model(s), budget(s) and seeds, as the runs' configs have them."""
    by_dataset: dict[str, list[JSONDict]] = {}
    for config in configs:
        by_dataset.setdefault(_dataset(config), []).append(config)
    lines = []
    for dataset, group in sorted(by_dataset.items()):
        models = _joined(_section(c, "model").get("name") for c in group)
        budgets = "; ".join(sorted({_budget(c) for c in group}))
        seeds = _joined(c.get("seed") for c in group)
        lines.append(f"**Setting ({dataset}).** model {models}; {budgets}; seeds {seeds}.")
    return lines


def setting_section(configs: Sequence[JSONDict]) -> str:
    """The Markdown block under a page's title: stand-in notes, then the setting per dataset."""
    return "\n\n".join([BEGIN, *stand_in_lines(configs), *setting_lines(configs), END]) + "\n"


def run_configs(roots: Iterable[Path]) -> list[JSONDict]:
    """The config.yaml of every finished run (a summary.json beside it) under `roots`, for pages built from
    run folders without `load_runs`."""
    configs = []
    for root in roots:
        for summary in sorted(Path(root).rglob("summary.json")):
            path = summary.parent / "config.yaml"
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
            if isinstance(loaded, dict):
                configs.append(loaded)
    return configs

"""The top level of a config: `ExperimentConfig`, one method on one dataset with one model, and its sections."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from fedhet.config.attack import AttackConfig
from fedhet.config.novel import NovelConfig
from fedhet.config.privacy import PrivacyConfig
from fedhet.config.sections import (
    DataConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    ServerConfig,
    TrainConfig,
    _check,
)
from fedhet.yaml_input import JSONDict


@dataclass
class ExperimentConfig:
    """One experiment: a method on a dataset with a model, for `rounds` rounds from `seed`."""

    name: str = "experiment"
    method: str = "fedavg"
    method_args: JSONDict = field(default_factory=dict)
    label: str = ""  # name of this variant in run dirs and report columns (e.g. an ablation); default: method
    # what stands in for the paper's setting (backbone, LDM, data, budget); printed under every report's title
    stand_in: str = ""
    seed: int = 0
    rounds: int = 50
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    novel: NovelConfig = field(default_factory=NovelConfig)  # held-out clients adapted after training
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)  # differential privacy while training
    attack: AttackConfig = field(default_factory=AttackConfig)  # clients that misbehave while training
    sweep: JSONDict = field(default_factory=dict)  # methods / seeds / datasets for `fedhet sweep`
    tune: JSONDict = field(default_factory=dict)  # search space and tuner for `fedhet tune` (fedhet.tune.config)
    imports: list[str] = field(default_factory=list)  # plugin modules / .py files, imported by validate()

    def validate(self) -> None:
        if self.imports:  # first: they may register the dataset, model or method named below
            from fedhet.plugins import import_plugins

            import_plugins(self.imports)
        _check(self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")
        _check(re.fullmatch(r"[A-Za-z0-9_.+-]*", self.label) is not None and self.label not in (".", ".."),
               f"label may hold only letters, digits and _ . + - and may not be . or .. (it names a folder), got "
               f"{self.label!r}")
        _check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        for section in (self.data, self.train, self.server, self.eval, self.run, self.novel):
            section.validate()
        self.privacy.validate(self.server.aggregation)
        self.attack.validate(self.run.runtime)

    def to_dict(self) -> JSONDict:
        return {k: _to_plain(v) for k, v in dataclasses.asdict(self).items()}

    @property
    def variant(self) -> str:
        """The label shown in run dirs and reports: `label` when set, else the method name."""
        return self.label or self.method


def _to_plain(obj: Any) -> Any:  # Any: a config value, made plain YAML data
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


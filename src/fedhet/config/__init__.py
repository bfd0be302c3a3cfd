"""Typed experiment configuration: YAML -> dataclasses, with nearest-key errors and `key=value` overrides.

Every section is a dataclass with defaults; unknown keys raise a ConfigError naming the nearest valid key and
bad values are rejected by `validate()` before any training starts. The sections live in `sections.py`, the top
level in `experiment.py`, the YAML-to-type conversion in `typed.py` and file / override reading in `loading.py`;
everything public is importable from `fedhet.config`.
"""

from fedhet.config.experiment import ExperimentConfig
from fedhet.config.loading import deep_merge, flatten, load_config, parse_overrides, set_path
from fedhet.config.novel import NOVEL_PARTS, NovelConfig
from fedhet.config.sections import (
    LOCAL_OPTIMIZERS,
    RUNTIMES,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    ServerConfig,
    TrainConfig,
)
from fedhet.config.typed import from_dict

__all__ = [
    "LOCAL_OPTIMIZERS",
    "RUNTIMES",
    "DataConfig",
    "EvalConfig",
    "ExperimentConfig",
    "ModelConfig",
    "NOVEL_PARTS",
    "NovelConfig",
    "RunConfig",
    "ServerConfig",
    "TrainConfig",
    "deep_merge",
    "flatten",
    "from_dict",
    "load_config",
    "parse_overrides",
    "set_path",
]

"""The errors fedhet raises on bad input: each says what is wrong and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedhetError(Exception):
    """Base class: a user-facing error whose message says what to do; `fedhet` exits with `exit_code`."""

    exit_code: int = 2


class ConfigError(FedhetError):
    """A config key or value is invalid."""


class LanesRefused(ConfigError):
    """run.runtime=batched cannot train this method or model as lanes (docs/runtimes_batched.md's rules); a caller
    that chose lanes itself (a tuned sweep's `lanes: true`) trains in-process instead."""


class UsageError(FedhetError):
    """A command-line argument is malformed (an unknown flag, a bad list or number)."""


class DatasetNotFoundError(FedhetError):
    """A dataset is not on disk; the message says where to get it and where to put it."""


class CheckpointError(FedhetError):
    """A checkpoint is corrupt or does not match the run."""


class TrainingDivergedError(FedhetError):
    """The loss became NaN or infinite."""


def nearest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest valid choice, or '' when none is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def unknown_choice(kind: str, name: str, choices: Iterable[str]) -> ConfigError:
    """An error for an unknown registry name, naming the nearest valid choice and listing all."""
    choices = sorted(choices)
    return ConfigError(f"unknown {kind} '{name}'{nearest(name, choices)}; valid: {', '.join(choices)}")

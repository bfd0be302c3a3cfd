"""Reading back a checkpoint runs no code (issue 15 item 6): `fedhet.engine.safe_load` rebuilds tensors, numbers,
containers and fedhet's state classes only; a crafted file is refused with one clear error and nothing of it
runs, while every state a method writes still loads unchanged."""

from __future__ import annotations

import dataclasses
import enum
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.cli import main
from fedhet.config import load_config
from fedhet.core.contract import ClientState
from fedhet.engine import safe_load
from fedhet.engine.checkpoint import load_checkpoint
from fedhet.engine.safe_load import UntrustedFileError, allow_types, load_trusted
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "data.max_test_per_client=32", "data.fraction=0.1",
        "run.num_threads=1", "seed=0"]
REFUSED = "holds objects other than tensors, numbers and fedhet states"


class Crafted:
    """What an attacker would put in a file: unpickling it runs a shell command (here: it creates `marker`)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def _checkpoint_run(tmp_path: Path, *extra: str) -> tuple[Path, list[str]]:
    """A run stopped after round 1 of 2 (so `--resume` would continue it) and its overrides."""
    overrides = [*BASE, "rounds=2", "run.checkpoint_every=1", *extra]
    run = tmp_path / "run"
    run_experiment(load_config(None, overrides), run, stop_after=1)
    return run, overrides


def test_a_crafted_checkpoint_is_refused_by_resume_and_runs_nothing(tmp_path: Path, capsys) -> None:
    run, overrides = _checkpoint_run(tmp_path, "method=fedavg")
    latest, marker = run / "checkpoints" / "latest.pt", tmp_path / "pwned"
    payload = load_trusted(latest, "the test's checkpoint")
    payload["clients"][0].local["evil"] = Crafted(marker)  # a real checkpoint with one crafted object inside
    torch.save(payload, latest)

    assert main(["run", *overrides, "--run-dir", str(run), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err  # one line, no traceback
    assert f"checkpoint '{latest}' {REFUSED}" in err and "was not loaded" in err and "posix.system" in err, err
    with pytest.raises(UntrustedFileError, match=REFUSED):
        load_checkpoint(latest, load_config(None, overrides).to_dict())
    assert not marker.exists()
    torch.load(latest, weights_only=False)  # the full unpickler (the old loader) does run it: the file is armed
    assert marker.exists()


def test_the_deploy_interrupt_message_refuses_a_crafted_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from fedhet.runtimes.flower.deploy import _interrupted_message

    path, marker = tmp_path / "latest.pt", tmp_path / "pwned"
    torch.save({"round": Crafted(marker)}, path)
    with pytest.raises(UntrustedFileError, match=f"checkpoint '{path}' {REFUSED}"):
        _interrupted_message(path, since=0.0, wait=0.0)
    assert not marker.exists()


def _same(a: Any, b: Any, where: str = "") -> None:
    """`a` and `b` are equal, type for type and tensor for tensor (bit for bit), at any depth."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


RICH = {  # methods whose states hold more than tensors: nested dataclasses, optimizer states, counters, tuples
    "ditto_mmd_mmdd": ["method=ditto_mmd", "method_args.penalty=mmdd", "method_args.kernel_steps=2",
                       "train.persist_optimizer=true"],
    "ditto_mmd_mkmmd": ["method=ditto_mmd", "train.optimizer=adam", "train.persist_optimizer=true"],
    "scaffold": ["method=scaffold"],
    "fraug": ["method=fraug", "train.persist_optimizer=true"],
    "fedbn_adam": ["method=fedbn", "train.optimizer=adam", "train.persist_optimizer=true",
                   "server.optimizer=adam", "server.lr=0.01"],
    "partialfed_adaptive": ["method=partialfed", "method_args.variant=adaptive"],
    "fedproto": ["method=fedproto"],
}


@pytest.mark.parametrize("case", sorted(RICH))
def test_every_state_of_a_real_checkpoint_loads_unchanged(tmp_path: Path, case: str) -> None:
    run, overrides = _checkpoint_run(tmp_path, *RICH[case])
    latest = run / "checkpoints" / "latest.pt"
    loaded = load_checkpoint(latest, load_config(None, overrides).to_dict())
    reference = torch.load(latest, map_location="cpu", weights_only=False)  # our own file: the full unpickler
    reference["config_changes"] = loaded["config_changes"]  # load_checkpoint appends this resume's (none)
    _same(loaded, reference, "checkpoint")
    if case == "ditto_mmd_mmdd":  # the nested kernel states, with their AdamW state, made it
        assert any(k.optim for s in loaded["clients"].values() for k in s.penalty.mmdd.values())


class Mode(enum.Enum):
    SLOW = "slow"
    FAST = "fast"


@dataclasses.dataclass
class Inner:
    weights: torch.Tensor
    mode: Mode = Mode.SLOW


@dataclasses.dataclass(kw_only=True)
class MyState(ClientState):
    """A user's own method state: a nested dataclass and an enum, found through the field annotations."""

    inner: Inner | None = None
    history: dict[str, list[Inner]] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class Opaque:
    """A type no annotation names: refused until `allow_types` lets it in."""

    def __init__(self, value: int) -> None:
        self.value = value


def _saved(obj: object) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_a_users_own_state_types_load_and_others_need_allow_types(monkeypatch) -> None:
    state = MyState(inner=Inner(torch.arange(3.0), Mode.FAST), history={"a": [Inner(torch.ones(2))]},
                    local={"w": torch.zeros(2)}, extra={"steps": 3, "seen": {1, 2}, "shape": torch.Size([2, 3])})
    _same(load_trusted(_saved(state), "a state"), state)

    monkeypatch.setattr(safe_load, "_EXTRA", set())
    opaque = MyState(extra={"o": Opaque(7)})
    with pytest.raises(UntrustedFileError, match=f"a state {REFUSED} .*Opaque.*allow_types"):
        load_trusted(_saved(opaque), "a state")
    allow_types(Opaque)
    assert load_trusted(_saved(opaque), "a state").extra["o"].value == 7

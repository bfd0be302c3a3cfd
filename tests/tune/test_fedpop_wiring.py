"""The FedPop tuner's wiring (src/fedhet/tune): SHA keeps the best third, FedPop-G copies the top member's whole
federation (server optimizer state and client states, as copies), the runner anneals FedPop-L's eps over its
window 0.2 T_g from each member's (re)initialisation, lanes with different local epochs give the in-process
population, and a bad search-space file is one error naming it."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tune_testing import BASE, played

import fedhet.tune.population as population_module
from fedhet.config import load_config
from fedhet.errors import ConfigError
from fedhet.tune import anneal, fedpop_l, member_score
from fedhet.tune.config import tune_config
from fedhet.tune.population import Population
from fedhet.tune.run import run_tuning
from fedhet.tune.wrappers import sha_rounds, survivors

TOL = 1e-5  # tests/tune/test_population_lanes.py's


def same(a: Any, b: Any) -> bool:
    """Equal values, tensors compared exactly, through dicts, lists and dataclasses."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and same(vars(a), vars(b))
    return bool(a == b)


def objects(x: Any) -> set[int]:
    """The ids of every tensor, dict, list and dataclass inside `x`: what a shared, uncopied state would share (a
    tuple of immutables may be shared by deepcopy itself, so tuples are looked into, not counted)."""
    if isinstance(x, torch.Tensor):
        return {id(x)}
    if isinstance(x, tuple):
        return set().union(*(objects(v) for v in x))
    if isinstance(x, dict):
        inner = list(x.values())
    elif isinstance(x, list):
        inner = list(x)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        inner = list(vars(x).values())
    else:
        return set()
    return {id(x)}.union(*(objects(v) for v in inner))


# ---------------------------------------------------------------- 1. SHA keeps the best third
def test_sha_survivors_are_the_lowest_scores() -> None:
    """Catches SHA keeping the worst (or any other) third instead of the 3 lowest scores of 9."""
    slots = [4, 0, 7, 2, 8, 1, 6, 3, 5]
    scores = [0.9, 0.5, 0.1, 2.0, float("nan"), 0.3, 1.5, 0.2, float("inf")]
    assert survivors(slots, scores, 3) == sorted([7, 3, 1])  # scores 0.1, 0.2, 0.3
    assert survivors(slots[:3], scores[:3], 3) == [7]


def test_a_sha_run_keeps_the_best_scored_members_at_each_elimination(tmp_path: Path) -> None:
    """Catches a SHA run that keeps the worst third (or ranks by anything but the logged scores' power law)."""
    extra = ["tune.wrapper=sha", "tune.configs=9", "tune.eliminations=2", "rounds=3", "tune.g_interval=1.0",
             "tune.clients=fixed", "tune.fedpop_l=false", "tune.fedpop_g=false", "tune.score=powerlaw"]
    cfg = load_config(None, [*BASE, *extra])
    run_tuning(cfg, tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "tune" / "members.jsonl").read_text().splitlines()]
    tune, alive = tune_config(cfg), set(range(9))
    for rnd in sha_rounds(3, 2, 9, 3):  # [1, 2]
        history = {s: [r["score"] for r in rows if r["slot"] == s and r["round"] <= rnd] for s in alive}
        score = {s: member_score(h, tune.score, tune.gamma_g, window=tune.g_rounds(3)) for s, h in history.items()}
        best = sorted(alive, key=lambda s: (score[s], s))[:len(alive) // 3]
        kept = {r["slot"] for r in rows if r["round"] == rnd and r["alive"]}
        assert kept == set(best) and len(set(score.values())) == len(alive)  # distinct: the best is well defined
        alive = kept
    assert len(alive) == 1


# ---------------------------------------------------------------- 2. FedPop-G copies the whole federation
def test_fedpop_g_copies_the_server_optimizer_state_and_client_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches FedPop-G copying only server.model (not server.opt), not copying client states, or sharing them."""
    real = Population.global_search
    copies: list[tuple[Any, Any, Any]] = []  # (the child just after the copy, the top before, the child before)

    def spy(self: Population, rnd: int) -> None:
        before = {m.slot: copy.deepcopy((m.server, m.clients)) for m in self.members}
        real(self, rnd)
        for child in (m for m in self.members if m.born == rnd):
            parent = self.members[child.parent]  # type: ignore[index]
            assert objects((child.server, child.clients)).isdisjoint(objects((parent.server, parent.clients)))
            copies.append((copy.deepcopy((child.server, child.clients)), before[parent.slot], before[child.slot]))

    monkeypatch.setattr(Population, "global_search", spy)
    space = ("tune.space={client: {train.lr: {type: log_uniform, low: -2, high: -0.5}}, server: {server.lr: "
             "{type: log_uniform, low: -0.3, high: 0.3}, server.momentum: {type: uniform, low: 0.3, high: 0.9}}}")
    played(space, "train.persist_optimizer=true", "train.momentum=0.9")
    assert copies  # T_g = 2 over 4 rounds: FedPop-G ran and replaced a member
    for (server, clients), (top_server, top_clients), (own_server, own_clients) in copies:
        assert top_server.opt and any(k.startswith("m/") for k in top_server.opt)  # FedAvgM's momentum buffers
        assert same(server.model, top_server.model) and same(server.opt, top_server.opt)
        assert not same(own_server.opt, top_server.opt)  # the copy changed the bottom member's state
        assert top_clients and all(state.optim for state in top_clients.values())  # persisted local momentum
        assert same(clients, top_clients) and not same(own_clients, top_clients)


# ---------------------------------------------------------------- 3. FedPop-L's annealing and window
@pytest.mark.parametrize("rounds,g_interval,t_g", [(4, 0.5, 2), (8, 0.75, 6)])
def test_fedpop_l_gets_eps_annealed_over_its_window_since_each_rebirth(monkeypatch: pytest.MonkeyPatch, rounds: int,
                                                                       g_interval: float, t_g: int) -> None:
    """Catches the runner annealing FedPop-L's eps over R_c instead of 0.2 T_g, or passing rounds_since_init=0."""
    calls: list[dict[str, Any]] = []
    now: dict[str, int] = {}
    real_search, signature = Population.local_search, inspect.signature(fedpop_l)

    def search(self: Population, member: Any, rnd: int, scores: list[float]) -> None:
        now.update(rnd=rnd, born=member.born)
        real_search(self, member, rnd, scores)

    def recording(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        out = fedpop_l(*args, **kwargs)
        calls.append({**bound.arguments, **now, "changed": out != [dict(b) for b in bound.arguments["betas"]]})
        return out

    monkeypatch.setattr(Population, "local_search", search)
    monkeypatch.setattr(population_module, "fedpop_l", recording)
    pop = played("tune.fedpop_l=true", f"rounds={rounds}", f"tune.g_interval={g_interval}")
    tune = pop.tune
    assert pop.t_g == t_g and len(calls) == rounds * len(pop.members)
    for call in calls:
        since = call["rnd"] - call["born"] - 1
        assert call["rounds_since_init"] == since
        assert call["eps"] == pytest.approx(anneal(tune.eps0, since, tune.l_window * t_g), abs=1e-12)
        assert call["p_re"] == pytest.approx(anneal(tune.p_re0, call["rnd"], rounds), abs=1e-12)
        assert (call["t_g"], call["share"]) == (t_g, tune.l_window)
        assert call["changed"] == (since < tune.l_window * t_g)  # the window: 1 round (T_g 2) or 2 (T_g 6)
    assert any(c["born"] > 0 and c["rounds_since_init"] == 0 for c in calls)  # a reborn member's window reopens
    assert any(0 < c["rounds_since_init"] < tune.l_window * t_g for c in calls) == (t_g == 6)


# ---------------------------------------------------------------- 4. lanes with their own epochs
def test_lanes_with_different_local_epochs_give_the_in_process_population() -> None:
    """Catches the batched runtime running every lane for the same step count (the max / min of its epochs)."""
    space = ("tune.space={client: {train.lr: {type: log_uniform, low: -2, high: -0.7}, train.local_epochs: "
             "{type: int, low: 1, high: 3}, train.batch_size: {type: choice, values: [16, 32]}}, server: "
             "{server.lr: {type: log_uniform, low: -0.3, high: 0.3}}}")
    extra = [space, "train.local_steps=null", "rounds=2", "run.batched_min_lanes=1", "data.max_train_per_client=40"]
    seq, lanes = played(*extra), played(*extra, "run.runtime=batched")
    assert len({dict(beta)["train.local_epochs"] for beta in seq.tried.betas}) > 1  # lanes of 1 and 2 epochs
    for a, b in zip(seq.members, lanes.members, strict=True):
        assert (a.alpha, a.beta0, a.betas, a.parent, a.born) == (b.alpha, b.beta0, b.betas, b.parent, b.born)
        assert a.history == pytest.approx(b.history, rel=TOL)
        assert all(torch.allclose(a.server.model[k], b.server.model[k], atol=TOL, rtol=TOL) for k in a.server.model)


# ---------------------------------------------------------------- 5. a bad search-space file
MALFORMED = ("client:\n  train.lr: {type: log_uniform, low: -2, high: -0.5}\n"
             "  train.momentum: type: uniform\n"  # line 3: a mapping value where none may be
             "server: {}\n")


@pytest.mark.parametrize("kind", ["malformed", "missing"])
def test_a_bad_search_space_file_is_one_error_naming_it(tmp_path: Path, kind: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Catches a malformed or missing tune.space file surfacing as a traceback, or an error without its path/line."""
    from fedhet.cli import main

    path = tmp_path / "space.yaml"
    if kind == "malformed":
        path.write_text(MALFORMED)
    overrides = [o for o in BASE if not o.startswith("tune.space=")]
    with pytest.raises(ConfigError) as err:
        run_tuning(load_config(None, [*overrides, f"tune.space={path}"]), tmp_path / "run", progress=False)
    message = str(err.value)
    assert str(path) in message and ("not found" in message if kind == "missing" else "line 3" in message)
    config = tmp_path / "experiment.yaml"  # a relative path, read from the config file's folder
    config.write_text("tune:\n  space: space.yaml\n")
    code = main(["tune", "--quiet", "--run-dir", str(tmp_path / "cli"), str(config), *overrides])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(path) in lines[0]

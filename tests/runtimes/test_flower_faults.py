"""Faults on the Flower runtime: lost, failed and malformed replies, offline and restarted nodes, stop + resume.

The fast tests drive the real adapter (FlowerRoundLoop, FlowerClients, the ClientApp handlers, Flower's
Message / RecordDict objects) through a loop-back Grid that can drop, break or replace replies. Their reference
is the in-process runtime with the faulty clients left out of the affected rounds' fit, which is what the
Flower runtime promises (a client whose reply is not aggregated keeps its previous state), so the comparisons
are exact (`==` on metrics.jsonl rows), as in test_flower.py. One slow test kills a real SuperNode.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fedhet_testing import for_method, metric_rows

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read when flwr is imported
pytest.importorskip("flwr")

from flwr.app import ArrayRecord, Context, Error, MetricRecord, RecordDict  # noqa: E402
from flwr.app import Message as FlowerMessage  # noqa: E402

from fedhet.algorithms import ALGORITHMS  # noqa: E402
from fedhet.algorithms.base import spec_of  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.core.messages import Message  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.local import fit_client  # noqa: E402
from fedhet.engine.loop import Interrupted, RoundLoop  # noqa: E402
from fedhet.engine.safe_load import load_trusted  # noqa: E402
from fedhet.engine.sampling import sample_clients  # noqa: E402
from fedhet.launch.run import run_experiment  # noqa: E402
from fedhet.runtimes.flower import client as flower_client  # noqa: E402
from fedhet.runtimes.flower.faults import FAULTS_FILE, STOPPED_FILE, RoundFailed, short_reason  # noqa: E402
from fedhet.runtimes.flower.records import evaluate_reply_content, fit_reply_content  # noqa: E402
from fedhet.runtimes.flower.round_loop import FlowerRoundLoop  # noqa: E402
from fedhet.runtimes.flower.validation import (  # noqa: E402
    ReplyRejected,
    check_arrays,
    evaluate_reply,
    expected_reply_spec,
    fit_reply,
)
from fedhet.runtimes.inprocess import InProcessClients  # noqa: E402

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "train.lr=0.1", "data.max_test_per_client=20", "run.quiet=true", "run.device=cpu",
        "run.num_threads=1", "rounds=3"]

# (message type, round, client id) -> what to do with the client's reply: return a new reply, or None to lose it
Fault = Callable[[FlowerMessage, FlowerMessage], FlowerMessage | None]


def cfg(*extra: str):
    return load_config(None, BASE + list(extra))


def rows(run_dir: Path) -> list[dict]:
    return metric_rows(run_dir)


pytestmark = pytest.mark.usefixtures("private_flower_home")


class FaultyGrid:
    """A loop-back Grid (the ClientApp handlers in this process, one Context per node) that applies `faults`
    to chosen replies and can take nodes offline or bring a partition back on a new node (a restart)."""

    def __init__(self, setup: flower_client.ClientSetup, num_nodes: int,
                 faults: dict[tuple[str, int, int], Fault] | None = None) -> None:
        self.setup, self.num_nodes, self.faults = setup, num_nodes, faults or {}
        self.contexts = {100 + i: self._context(100 + i, i) for i in range(num_nodes)}
        self.offline: set[int] = set()
        self.sent_to_offline: list[int] = []  # messages pushed to an offline node (never answered)
        self.replies: dict[str, FlowerMessage] = {}
        self.on_push: Callable[[FlowerMessage], None] | None = None

    def _context(self, node: int, partition: int) -> Context:
        return Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                       node_config={"partition-id": partition, "num-partitions": self.num_nodes})

    def restart(self, partition: int, new_node: int) -> None:
        """The SuperNode of `partition` comes back under a new node id with an empty context.state."""
        old = next(n for n, c in self.contexts.items() if c.node_config["partition-id"] == partition)
        self.offline.add(old)
        self.contexts[new_node] = self._context(new_node, partition)

    def get_node_ids(self) -> list[int]:
        return [n for n in self.contexts if n not in self.offline]

    def push_messages(self, messages) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg_id = uuid.uuid4().hex
            ids.append(msg_id)
            if self.on_push is not None:
                self.on_push(msg)
            node, kind = msg.metadata.dst_node_id, msg.metadata.message_type
            if node in self.offline:
                self.sent_to_offline.append(node)
                continue  # never answered
            try:
                reply = flower_client.handle(kind, msg, self.contexts[node], self.setup)
            except Exception as err:  # noqa: BLE001 - as a SuperNode does: an error reply
                reply = msg.create_error_reply(Error(code=2, reason=f"{type(err).__name__}: {err}"))
            if not kind.startswith("query"):
                rnd = int(msg.content.config_records["config"]["server-round"])
                fault = self.faults.get((kind, rnd, int(self.contexts[node].node_config["partition-id"])))
                if fault is not None:
                    reply = fault(msg, reply)
            if reply is not None:
                self.replies[msg_id] = reply
        return ids

    def pull_messages(self, message_ids) -> list[FlowerMessage]:
        return [self.replies.pop(i) for i in reversed(list(message_ids)) if i in self.replies]


# ---------------------------------------------------------------------------------- faults to inject
def lose(msg: FlowerMessage, reply: FlowerMessage) -> None:
    return None


def error(msg: FlowerMessage, reply: FlowerMessage) -> FlowerMessage:
    return msg.create_error_reply(Error(code=2, reason="ClientApp crashed (injected)"))


def edit_arrays(edit: Callable[[dict[str, torch.Tensor]], None]) -> Fault:
    def fault(msg: FlowerMessage, reply: FlowerMessage) -> FlowerMessage:
        content = reply.content
        arrays = dict(content.array_records["arrays"].to_torch_state_dict())
        edit(arrays)
        content["arrays"] = ArrayRecord(arrays)
        return FlowerMessage(content, reply_to=msg)

    return fault


def first_float(arrays: dict[str, torch.Tensor]) -> str:
    return next(k for k, v in arrays.items() if v.is_floating_point())


def _wrong_shape(arrays: dict[str, torch.Tensor]) -> None:
    key = first_float(arrays)
    arrays[key] = arrays[key].flatten()[:3].clone()


def _nan(arrays: dict[str, torch.Tensor]) -> None:
    key = first_float(arrays)
    value = arrays[key].clone()
    value.view(-1)[0] = float("nan")
    arrays[key] = value


def _rename(arrays: dict[str, torch.Tensor]) -> None:
    arrays["evil.weight"] = arrays.pop(first_float(arrays))


def _double(arrays: dict[str, torch.Tensor]) -> None:
    key = first_float(arrays)
    arrays[key] = arrays[key].double()


wrong_shape, with_nan, wrong_name, wrong_dtype = (edit_arrays(f) for f in (_wrong_shape, _nan, _rename, _double))


class SkippingClients(InProcessClients):
    """The in-process reference: clients in `skip` (round -> client ids) take no part in that round's fit."""

    def __init__(self, exp, skip: dict[int, set[int]]) -> None:
        super().__init__(exp)
        self.skip = skip

    def fit(self, rnd, messages):
        return super().fit(rnd, {c: m for c, m in messages.items() if c not in self.skip.get(rnd, set())})


def reference(c, run_dir: Path, skip: dict[int, set[int]]) -> list[dict]:
    exp = build_experiment(c)
    RoundLoop(exp, run_dir, SkippingClients(exp, skip), progress=False).run()
    return rows(run_dir)


def flower_loop(c, run_dir: Path, grid: FaultyGrid, **kwargs) -> FlowerRoundLoop:
    return FlowerRoundLoop(build_experiment(c), run_dir, grid, progress=False, poll_interval=0.01,  # type: ignore
                           **kwargs)


# ---------------------------------------------------------------------------------- validation
def test_validation_names_the_problem(task_identity) -> None:
    arrays = {"w": torch.randn(3, 2), "n": torch.tensor(4)}
    spec = spec_of(arrays)
    check_arrays({k: v.clone() for k, v in arrays.items()}, spec)
    cases = [({"w": arrays["w"]}, "missing 'n'"),
             ({**arrays, "x": torch.ones(1)}, "unexpected 'x'"),
             ({**arrays, "w": torch.randn(2, 3)}, r"'w' has shape \(2, 3\), expected \(3, 2\)"),
             ({**arrays, "w": arrays["w"].half()}, "'w' has dtype torch.float16, expected torch.float32"),
             ({**arrays, "w": torch.full((3, 2), float("inf"))}, "'w' holds 6 NaN/inf"),
             ({**arrays, "n": torch.tensor(4.0)}, "'n' has dtype torch.float32")]
    for bad, reason in cases:
        with pytest.raises(ReplyRejected, match=reason):
            check_arrays(bad, spec)
    assert fit_reply(fit_reply_content(Message(arrays), 5), spec)[1] == 5
    with pytest.raises(ReplyRejected, match="negative example count"):
        fit_reply(fit_reply_content(Message(arrays), -1), spec)
    no_count = fit_reply_content(Message(arrays), 5)
    del no_count["metrics"]["num-examples"]
    with pytest.raises(ReplyRejected, match="num-examples"):
        fit_reply(no_count, spec)
    assert evaluate_reply(evaluate_reply_content(None)) is None
    full = evaluate_reply(evaluate_reply_content({"accuracy": 0.5, "balanced_accuracy": 0.5, "loss": 1.0,
                                                  "num_examples": 7}))
    assert full == {"accuracy": 0.5, "balanced_accuracy": 0.5, "loss": 1.0, "num_examples": 7}
    # a Flower quickstart ClientApp's names are read as fedhet's; what it does not report is NaN
    stock = evaluate_reply(RecordDict({"metrics": MetricRecord({"eval_acc": 0.5, "eval_loss": 2.0,
                                                                 "num-examples": 3})}))
    assert stock["accuracy"] == 0.5 and stock["loss"] == 2.0 and math.isnan(stock["balanced_accuracy"])
    with pytest.raises(ReplyRejected, match="'loss' is inf"):
        evaluate_reply(RecordDict({"metrics": MetricRecord({"loss": float("inf"), "num-examples": 3})}))
    with pytest.raises(ReplyRejected, match="without metrics"):
        evaluate_reply(RecordDict())


def test_a_minus_one_dimension_matches_any_size_and_nothing_else() -> None:
    spec = {"z": ((-1, 4), torch.float32)}
    check_arrays({"z": torch.zeros(7, 4)}, spec)
    check_arrays({"z": torch.zeros(0, 4)}, spec)
    for bad in (torch.zeros(7, 5), torch.zeros(7), torch.zeros(7, 4, 1)):
        with pytest.raises(ReplyRejected, match="has shape"):
            check_arrays({"z": bad}, spec)


def test_error_reasons_are_shortened_to_the_root_exception() -> None:
    ray_like = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m"
                "\n  File \"x.py\", line 1, in f\n    raise ValueError(\nValueError: Expected more than 1 value per "
                "channel\n\nThe above exception was the direct cause of the following exception:\n\n"
                "flwr.clientapp.client_app.ClientAppException: \nException ClientAppException occurred. Message: x'>")
    assert short_reason(ray_like) == "ValueError: Expected more than 1 value per channel"
    assert short_reason("<class 'fedhet.errors.FedhetError'>:<'client 2 has no state'>") == \
        "FedhetError: client 2 has no state"
    assert short_reason("plain reason") == "plain reason"


@pytest.mark.parametrize("method", [m for m in ALGORITHMS.names() if not ALGORITHMS.get(m).centralized])
def test_every_method_reply_matches_the_expected_layout(method) -> None:
    """Honest replies of every registered method pass the server's checks (else the Flower runtime would
    reject them); a method with an unusual layout must declare it with `Algorithm.reply_layout`."""
    exp = build_experiment(load_config(None, for_method(method, [*BASE, "rounds=2"])))
    alg = exp.algorithm
    broadcast = alg.broadcast(alg.init_server(), exp.round_info(1), 0)
    out, _ = fit_client(alg, broadcast, alg.init_client(0), exp.context(0, 1, exp.data.clients[0]))
    check_arrays(out.arrays, expected_reply_spec(alg, broadcast))


# ---------------------------------------------------------------------------------- faults within the minimum
def test_faulty_replies_are_left_out_and_the_round_goes_on(tmp_path, task_identity, caplog) -> None:
    """Lost, failed and malformed replies are logged with the client and the reason and left out; the run
    equals the in-process run in which those clients skip those rounds (they keep their previous state)."""
    c = cfg("method=fedbn", "server.min_fit_fraction=0.5", "server.reply_timeout=0.3")
    faults = {("train", 1, 3): wrong_name, ("train", 1, 2): wrong_dtype, ("train", 2, 1): lose,
              ("train", 2, 3): wrong_shape, ("train", 3, 2): with_nan, ("train", 3, 0): error,
              ("evaluate", 3, 1): lose}
    expected = reference(c, tmp_path / "inprocess", {1: {2, 3}, 2: {1, 3}, 3: {0, 2}})
    grid = FaultyGrid(flower_client.ClientSetup(c.to_dict()), 4, faults)
    with caplog.at_level(logging.WARNING, logger="fedhet.runtimes.flower.server"):
        result = flower_loop(c, tmp_path / "flower", grid).run()
    got = rows(tmp_path / "flower")
    # round 3: client 1's evaluation reply was lost, so it is missing from that round's rows (and from 'avg')
    names = [cl.name for cl in build_experiment(c).data.clients]
    assert [r for r in got if r["round"] < 3] == [r for r in expected if r["round"] < 3]
    assert {r["client"] for r in got if r["round"] == 3} == set(names) - {names[1]} | {"avg"}
    for row in got:
        if row["round"] == 3 and row["client"] != "avg":
            assert row == next(r for r in expected if r["round"] == 3 and r["client"] == row["client"])
    assert result.rounds_completed == 3
    log = caplog.text
    for reason in (f"round 1 train: client 3 ({names[3]}, node 103) left out: reply rejected: wrong array names: "
                   "missing 'features.0.weight'; unexpected 'evil.weight'",
                   "has dtype torch.float64, expected torch.float32", "client 1", "no reply within 0.3 s",
                   "has shape (3,), expected", "holds 1 NaN/inf value(s)", "ClientApp crashed (injected)"):
        assert reason in log, reason
    faults_rows = [json.loads(line) for line in (tmp_path / "flower" / FAULTS_FILE).read_text().splitlines()]
    assert {(r["round"], r["phase"], r["client"]) for r in faults_rows} == {
        (1, "train", 2), (1, "train", 3), (2, "train", 1), (2, "train", 3), (3, "train", 0), (3, "train", 2),
        (3, "evaluate-test", 1)}


def test_offline_node_is_skipped_and_a_restarted_node_rejoins(tmp_path, task_identity) -> None:
    """An offline SuperNode is not waited for; when its partition comes back on a new node (a restarted
    SuperNode with an empty context.state), the client continues from its state in the state folder."""
    c = cfg("method=ditto", "server.min_fit_fraction=0.5")
    expected = reference(c, tmp_path / "inprocess", {2: {1}})
    grid = FaultyGrid(flower_client.ClientSetup(c.to_dict(), state_dir=str(tmp_path / "states")), 4)

    def node_dies_then_restarts(msg: FlowerMessage) -> None:
        if msg.metadata.message_type != "evaluate" or grid.contexts[msg.metadata.dst_node_id].node_config[
                "partition-id"] != 3:
            return
        rnd = msg.content.config_records["config"]["server-round"]
        if rnd == 1:
            grid.offline.add(101)  # client 1's node dies after round 1 (its evaluation is done)
        if rnd == 2:
            grid.restart(1, new_node=201)  # and is back for round 3

    grid.on_push = node_dies_then_restarts
    loop = flower_loop(c, tmp_path / "flower", grid)
    loop.run()
    assert grid.sent_to_offline == []  # nothing sent to the dead node, so no wait for reply_timeout (3600 s)
    got = rows(tmp_path / "flower")
    assert [r for r in got if r["round"] != 2] == [r for r in expected if r["round"] != 2]
    assert loop.flower.link.node_of[1] == 201
    # the restarted node read round 1's state from the state folder, then trained round 3
    assert flower_client.stored_rounds(grid.contexts[201]) == [1, 3]


# ---------------------------------------------------------------------------------- too few replies: stop, resume
def test_too_few_replies_stop_with_a_checkpoint_and_resume_continues(tmp_path, task_identity) -> None:
    """Below the minimum the run stops with one clear error and the checkpoint of the last completed round;
    a new Flower run (fresh nodes: empty context.state, states from the state folder) resumes it, and the
    result equals an uninterrupted in-process run bit for bit (Ditto's personal models included)."""
    c = cfg("method=ditto", "server.fraction_fit=0.5", "rounds=4")
    run_experiment(c, tmp_path / "inprocess", progress=False)
    victim = sample_clients(c.seed, 3, 4, 0.5)[0]
    setup = flower_client.ClientSetup(c.to_dict(), state_dir=str(tmp_path / "states"))
    grid = FaultyGrid(setup, 4, {("train", 3, victim): lose})
    loop = flower_loop(c, tmp_path / "flower", grid, timeout=0.2)
    with pytest.raises(RoundFailed) as info:
        loop.run()
    message = str(info.value)
    assert "round 3 train: only 1 of 2 clients answered validly and server.min_fit_fraction=1.0 needs 2" in message
    assert f"client {victim}" in message and "no reply within 0.2 s" in message and "--resume" in message
    assert load_trusted(tmp_path / "flower" / "checkpoints" / "latest.pt", "checkpoint")["round"] == 2
    assert json.loads((tmp_path / "flower" / STOPPED_FILE).read_text())["round"] == 2
    assert max(r["round"] for r in rows(tmp_path / "flower")) == 2

    fresh = FaultyGrid(setup, 4)  # a new run: nodes keep nothing in memory
    resumed = flower_loop(c, tmp_path / "flower", fresh)
    resumed.resume()
    assert resumed.round == 2
    resumed.run()
    assert rows(tmp_path / "flower") == rows(tmp_path / "inprocess")
    assert not (tmp_path / "flower" / STOPPED_FILE).exists()
    # old states are pruned: each client keeps at most the rounds the server may still ask for
    for folder in (tmp_path / "states").iterdir():
        assert len(list(folder.glob("round_*.pt"))) <= 3, sorted(folder.iterdir())


def test_failed_evaluation_rolls_back_the_aggregated_round(tmp_path, task_identity) -> None:
    """Too few evaluation replies after a successful fit: the aggregated round is undone (server state, the
    clients' state rounds), the checkpoint is the previous round's, and the resumed run (clients reading the
    states of that round, which their nodes kept) equals an uninterrupted in-process run."""
    c = cfg("method=fedbn", "server.min_fit_fraction=0.5", "server.min_evaluate_fraction=1.0", "rounds=3")
    run_experiment(c, tmp_path / "inprocess", progress=False)
    setup = flower_client.ClientSetup(c.to_dict(), state_dir=str(tmp_path / "states"))
    with pytest.raises(RoundFailed, match=r"round 2 evaluate \(test\): only 3 of 4 .*min_evaluate_fraction=1.0"):
        flower_loop(c, tmp_path / "flower", FaultyGrid(setup, 4, {("evaluate", 2, 2): error})).run()
    payload = load_trusted(tmp_path / "flower" / "checkpoints" / "latest.pt", "checkpoint")
    assert payload["round"] == 1 and payload["clients"] == {"state_round": {0: 1, 1: 1, 2: 1, 3: 1}}
    resumed = flower_loop(c, tmp_path / "flower", FaultyGrid(setup, 4))
    resumed.resume()
    resumed.run()
    assert rows(tmp_path / "flower") == rows(tmp_path / "inprocess")


def test_resume_without_client_states_fails_clearly(tmp_path, task_identity) -> None:
    """Clients without their states (no state folder, new run) cannot continue: the error says so."""
    c = cfg("method=fedbn", "rounds=3")
    grid = FaultyGrid(flower_client.ClientSetup(c.to_dict()), 4)
    flower_loop(c, tmp_path / "flower", grid).run(stop_after=1)
    resumed = flower_loop(c, tmp_path / "flower", FaultyGrid(flower_client.ClientSetup(c.to_dict()), 4))
    resumed.resume()
    with pytest.raises(RoundFailed, match="has no state of round 1.*state-dir"):
        resumed.run()


def test_stop_event_interrupts_with_a_checkpoint(tmp_path, task_identity) -> None:
    """`stop_event` (the simulation's Ctrl-C) stops a round that waits for replies: rollback, checkpoint."""
    c = cfg("method=fedbn", "rounds=3")
    stop = threading.Event()

    def stop_and_lose(msg: FlowerMessage, reply: FlowerMessage) -> None:
        stop.set()
        return None

    grid = FaultyGrid(flower_client.ClientSetup(c.to_dict()), 4, {("train", 2, 0): stop_and_lose})
    with pytest.raises(Interrupted):
        flower_loop(c, tmp_path / "flower", grid, stop_event=stop).run()
    payload = load_trusted(tmp_path / "flower" / "checkpoints" / "latest.pt", "checkpoint")
    assert payload["round"] == 1 and payload["clients"] == {"state_round": {0: 1, 1: 1, 2: 1, 3: 1}}


def test_inprocess_refuses_a_flower_checkpoint(tmp_path, task_identity) -> None:
    """A Flower checkpoint holds no client states, so the in-process runtime must not resume it."""
    from fedhet.errors import CheckpointError

    c = cfg("method=fedbn", "rounds=2")
    flower_loop(c, tmp_path / "run", FaultyGrid(flower_client.ClientSetup(c.to_dict()), 4)).run(stop_after=1)
    with pytest.raises(CheckpointError, match="different config"):
        run_experiment(c, tmp_path / "run", resume=True, progress=False)


def test_simulation_stop_and_resume_matches_inprocess(tmp_path) -> None:
    """`fedhet flower simulate --stop-after 1`, then `--resume` in a new simulation (new Ray actors, empty
    context.state: the client states come from <run dir>/client_states): equal to one in-process run. Under
    local DP (privacy.dp.mode=local: the Ray actors clip and noise their updates), so the default suite runs DP on
    Flower's simulation too: the epsilon rows and the noise survive the resume (tests/runtimes/test_flower_dp.py)."""
    from fedhet.cli import main

    extra = ["method=ditto", "server.fraction_fit=0.5", "privacy.dp.mode=local", "privacy.dp.delta=0.01"]
    run_experiment(cfg(*extra), tmp_path / "inprocess", progress=False)
    args = ["flower", "simulate", *BASE, *extra, "--run-dir", str(tmp_path / "sim"), "--num-cpus", "2", "-q"]
    assert main([*args, "--stop-after", "1"]) == 0
    assert load_trusted(tmp_path / "sim" / "checkpoints" / "latest.pt", "checkpoint")["round"] == 1
    assert not (tmp_path / "sim" / "summary.json").exists()
    assert main(args) == 2  # a checkpoint is there: refuses to start over without --resume
    assert main([*args, "--resume"]) == 0
    assert rows(tmp_path / "sim") == rows(tmp_path / "inprocess")
    assert [r["dp_rounds"] for r in rows(tmp_path / "sim") if r["split"] == "privacy"] == [1, 2, 3]
    assert any((tmp_path / "sim" / "client_states").rglob("round_*.pt"))


def test_local_federation_stop_reaches_detached_descendants(tmp_path) -> None:
    """Flower starts its SuperExecs in new sessions; stop() must end them (and what they started) too."""
    from fedhet.runtimes.flower.deploy import LocalFederation, descendants

    federation = LocalFederation(0, tmp_path)
    federation.logs.mkdir(parents=True)
    proc = federation._spawn("tree", ["sh", "-c", "setsid sleep 300 & sleep 300 & wait"])
    deadline = time.monotonic() + 60
    while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    family = descendants(proc.pid)
    assert len(family) >= 2
    federation.stop(grace=5)
    for pid in family:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid


def test_flwr_run_stops_on_a_task_start_loop(tmp_path) -> None:
    """Flower relaunching a task that never checks in (an overloaded machine) ends with a clear error."""
    from fedhet.errors import FedhetError
    from fedhet.runtimes.flower.deploy import _check_task_starts

    (tmp_path / "superlink.log").write_text("ok\n" + "Runtime task-token authentication failed.\n" * 3)
    _check_task_starts(tmp_path)
    (tmp_path / "supernode-0.log").write_text("Runtime task-token authentication failed.\n" * 3)
    with pytest.raises(FedhetError, match="30 s task-token window"):
        _check_task_starts(tmp_path)


# ---------------------------------------------------------------------------------- a real SuperNode killed
@pytest.mark.slow
def test_killed_supernode_round_goes_on(tmp_path) -> None:
    """SuperLink + 2 SuperNodes on 127.0.0.1; SuperNode 1 is killed (SIGKILL) after round 1: with
    min_fit_fraction=0.5 the run finishes on the other node and logs the lost client in faults.jsonl."""
    from fedhet.runtimes.flower.deploy import LocalFederation, flwr_run, write_flower_app

    c = cfg("method=fedbn", "data.domains=[clean, inverted]", "server.min_fit_fraction=0.5",
            "server.reply_timeout=240")
    config = c.to_dict()
    config["run"]["runtime"] = "flower"
    run_dir = tmp_path / "run"
    app = write_flower_app(tmp_path / "work" / "app", config, run_dir, client_state_dir=str(run_dir / "client_states"),
                           per_run_dir=False)
    errors: list[BaseException] = []
    with LocalFederation(2, tmp_path / "work") as federation:
        def submit() -> None:
            try:
                flwr_run(app, federation, timeout=900)
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        thread = threading.Thread(target=submit)
        thread.start()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and thread.is_alive():
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and any(json.loads(line)["round"] == 1 for line in metrics.read_text().splitlines()):
                break
            time.sleep(1)
        federation.kill_node(1, signal.SIGKILL)
        thread.join(timeout=900)
    assert not errors, errors
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 3
    faults = [json.loads(line) for line in (run_dir / FAULTS_FILE).read_text().splitlines()]
    assert {r["client"] for r in faults} == {1} and {r["round"] for r in faults} >= {2, 3}
    last = [r for r in rows(run_dir) if r["round"] == 3]
    assert {r["client"] for r in last} == {"clean", "avg"}

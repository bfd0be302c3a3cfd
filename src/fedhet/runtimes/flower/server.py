"""The ServerApp side: the shared `RoundLoop`, with its clients reached through Flower messages.

`FlowerClients` has the interface of `InProcessClients` (fit / evaluate / get_states / set_states), so
sampling, broadcast, aggregation, evaluation rows, checkpoints and the run directory are the in-process
runtime's own code; only where a client's fit / evaluate runs differs, and what happens when a client
does not answer, fails, or answers with something the server cannot use (see docs/flower.md "Faults"):

- each wave (train, evaluate) waits at most `server.reply_timeout` seconds; a client whose SuperNode is
  offline, whose ClientApp raised, that sent no reply in time, or whose reply fails the checks in
  `validation` is left out of the round, with a logged reason and a row in the run's `faults.jsonl`;
- the round goes on when at least `server.min_fit_fraction` of the sampled clients (evaluation:
  `min_evaluate_fraction` of all clients) answered validly. Aggregation then runs over the replies received
  (the algorithm's own weighting, e.g. FedAvg's sample-count weights renormalised over them); a client left
  out keeps the state it had before the round (see `client`);
- otherwise the run stops with `RoundFailed` after writing the checkpoint of the last completed round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from flwr.app import MessageType
from flwr.serverapp import Grid

from fedhet.core.messages import Message, Reply
from fedhet.engine.experiment import Experiment
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import checkpoint_config
from fedhet.runtimes.flower.faults import RoundFailed, required
from fedhet.runtimes.flower.records import LOCAL_EPOCHS, LR, RUN_FOLDER, request_content
from fedhet.runtimes.flower.transport import NodeLink
from fedhet.runtimes.flower.validation import ReplyRejected, evaluate_reply, expected_reply_spec, fit_reply
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)
class FlowerClients:
    """Runs the clients' fit / evaluate on Flower nodes (one node per client, found by its partition-id)."""

    def __init__(self, exp: Experiment, grid: Grid, timeout: float | None = None, wait_for_nodes: float = 300.0,
                 poll_interval: float = 0.2, stop_event: threading.Event | None = None,
                 on_fault: Callable[[JSONDict], None] | None = None, partition_query: bool = True,
                 link: NodeLink | None = None) -> None:
        """`link`: nodes already mapped (a node-data run maps them to learn the data first), else mapped here."""
        if exp.arrangement.pooled:
            raise FedhetError(f"'{exp.config.method}' trains one model on the pooled data of all clients; "
                              "it has no federated counterpart, run it in-process")
        self.exp, self.on_fault = exp, on_fault
        # what Flower's quickstart ClientApps read from a train request (fedhet's own clients use their config)
        self.train_config = {LR: exp.config.train.lr, LOCAL_EPOCHS: exp.config.train.local_epochs}
        self.link = link or NodeLink(grid, exp.config.server.reply_timeout if timeout is None else timeout,
                                     poll_interval, stop_event)
        # the last round whose fit reply of each client was aggregated (0: none); also at the last checkpoint
        # and at the start of the current round: the states a client may still be asked for
        self.state_round: dict[int, int] = {}
        self.run_folder = ""  # per-run-dir: this run's folder name, sent so clients keep their states per run
        self.checkpoint_round: dict[int, int] = {}
        self.start_round: dict[int, int] = {}
        if link is None:
            self.link.map_nodes(self.num_train_clients, wait_for_nodes, ask=partition_query)

    @property
    def num_train_clients(self) -> int:
        return len(self.exp.data.clients)

    # -------------------------------------------------------------- the executor interface
    def fit(self, rnd: int, messages: dict[int, Message]) -> list[Reply]:
        """Local training on the sampled clients' nodes; the valid replies in the order of `messages`."""
        contents = {cid: request_content(msg, rnd, **self.train_config, **self._state_meta(cid))
                    for cid, msg in messages.items()}
        received, problems = self.link.exchange(MessageType.TRAIN, contents, f"fit-{rnd}")
        replies = []
        for cid, msg in messages.items():
            if cid not in received:
                continue
            try:
                reply, num_examples = fit_reply(received[cid], expected_reply_spec(self.exp.algorithm, msg),
                                                local_dp=self.exp.config.privacy.dp.mode == "local")
                replies.append(Reply(cid, reply, num_examples))
            except ReplyRejected as err:
                problems[cid] = f"reply rejected: {err}"
        self._report(rnd, "train", problems)
        need = required(self.exp.config.server.min_fit_fraction, len(messages))
        if len(replies) < need:
            raise RoundFailed(self._shortfall(rnd, "train", len(replies), len(messages), need, problems,
                                              f"server.min_fit_fraction={self.exp.config.server.min_fit_fraction}"))
        self.state_round = {**self.state_round, **{r.client_id: rnd for r in replies}}
        return replies

    def evaluate(self, rnd: int, messages: dict[int, Message], split: str) -> dict[str, dict[str, float]]:
        """The metrics of each client in `messages` on its own split, keyed by client name in client order (as
        in-process); clients that failed are left out."""
        contents = {cid: request_content(messages[cid], rnd, split=split, **self._state_meta(cid))
                    for cid in sorted(messages)}
        received, problems = self.link.exchange(MessageType.EVALUATE, contents, f"evaluate-{split}-{rnd}")
        results = {}
        for cid, client in enumerate(self.exp.data.clients):
            if cid not in received:
                continue
            try:
                metrics = evaluate_reply(received[cid])
            except ReplyRejected as err:
                problems[cid] = f"reply rejected: {err}"
                continue
            if metrics is not None:
                results[client.name] = metrics
        self._report(rnd, f"evaluate-{split}", problems)
        server = self.exp.config.server
        fraction = server.min_fit_fraction if server.min_evaluate_fraction is None else server.min_evaluate_fraction
        need = required(fraction, len(contents))
        answered = len(contents) - len(problems)
        if answered < need:
            which = "min_fit_fraction" if server.min_evaluate_fraction is None else "min_evaluate_fraction"
            raise RoundFailed(self._shortfall(rnd, f"evaluate ({split})", answered, len(contents), need, problems,
                                              f"server.{which}={fraction}"))
        return results

    def begin_round(self, rnd: int) -> None:
        """The states each client holds when the round starts: a rollback may ask for them again."""
        self.start_round = dict(self.state_round)

    def on_disk(self) -> None:
        """The state rounds at the checkpoint: a resume may ask for them again."""
        self.checkpoint_round = dict(self.state_round)

    def checkpoint_config(self, config: JSONDict) -> JSONDict:
        return checkpoint_config(config)

    def get_states(self) -> JSONDict:
        """Client states stay on the clients; the server keeps (and checkpoints) only which round's state
        each client should use."""
        return {"state_round": dict(self.state_round)}

    def set_states(self, states: JSONDict) -> None:
        if states and set(states) != {"state_round"}:
            raise FedhetError("the Flower runtime keeps client states on the clients; a checkpoint with client "
                              "states (from the in-process runtime) cannot be pushed to them")
        self.state_round = {int(k): int(v) for k, v in states.get("state_round", {}).items()}

    # -------------------------------------------------------------- bookkeeping
    def _state_meta(self, cid: int) -> JSONDict:
        rounds = {self.checkpoint_round.get(cid, 0), self.start_round.get(cid, 0)}
        meta: JSONDict = {"state-round": self.state_round.get(cid, 0), "keep-rounds": sorted(rounds)}
        return {**meta, RUN_FOLDER: self.run_folder} if self.run_folder else meta

    def _report(self, rnd: int, phase: str, problems: dict[int, str]) -> None:
        for cid, reason in sorted(problems.items()):
            name = self.exp.data.clients[cid].name
            log.warning("round %d %s: client %d (%s, node %s) left out: %s", rnd, phase, cid, name,
                        self.link.node_of.get(cid), reason)
            if self.on_fault is not None:
                self.on_fault({"round": rnd, "phase": phase, "client": cid, "name": name,
                               "node": self.link.node_of.get(cid), "reason": reason, "time": time.time()})

    def _shortfall(self, rnd: int, phase: str, ok: int, total: int, need: int, problems: dict[int, str],
                   rule: str) -> str:
        details = "; ".join(f"client {cid} ({self.exp.data.clients[cid].name}): {reason}"
                            for cid, reason in sorted(problems.items()))
        return (f"round {rnd} {phase}: only {ok} of {total} clients answered validly and {rule} needs {need}. "
                f"{details}.")

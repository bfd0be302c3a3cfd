"""Any fedhet method as a Flower `Strategy` plus a `ClientApp`, to drop into your own Flower app.

    strategy = FedhetStrategy.from_config("configs/quickstart.yaml", ["method=ditto_mmd"])
    result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=3)
    client_app = fedhet_client_app("configs/quickstart.yaml", ["method=ditto_mmd"])

Flower's own `Strategy.start` drives the rounds (sampling nodes is the method's: fedhet samples clients with the
config's seed and `server.fraction_fit`, as in-process). The strategy keeps the method's whole server state
(SCAFFOLD's control variates, a server optimizer, ...); the ArrayRecord Flower passes around is its global
model, which `aggregate_train` returns for Flower's `Result` and `evaluate_fn`, and what Flower hands back
becomes the method's global model (a wrapper's change reaches the clients: Flower's DP strategies' noise). Per-client
evaluation rows
(as in a run directory's metrics.jsonl) collect in `strategy.metrics`; `aggregate_evaluate` returns their
uniform client average, as the papers report it. What a run directory adds (checkpoints, resume, fault
rows) is the job of fedhet's own ServerApp (`fedhet flower deploy / app`); this class is for Flower users who
keep their own loop. With the same config and seed its global model is the in-process runtime's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from flwr.serverapp import Grid
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedhet.config import ExperimentConfig, load_config
from fedhet.core.dp import dp_steps
from fedhet.core.messages import Message, Reply
from fedhet.engine.dp_run import open_ledger, refusal
from fedhet.engine.experiment import build_experiment
from fedhet.engine.rounds import aggregate_round
from fedhet.engine.rundir import METRIC_KEYS, client_rows
from fedhet.engine.sampling import sample_clients
from fedhet.errors import FedhetError
from fedhet.runtimes.flower.faults import required
from fedhet.runtimes.flower.records import NUM_EXAMPLES, SERVER_ROUND, SPLIT, request_content
from fedhet.runtimes.flower.transport import NodeLink
from fedhet.runtimes.flower.validation import ReplyRejected, evaluate_reply, expected_reply_spec, fit_reply
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)


class FedhetStrategy(Strategy):
    """The fedhet method of `config` as a Flower Strategy (its ClientApp: `fedhet_client_app(config)`)."""

    def __init__(self, config: ExperimentConfig, timeout: float = 3600.0, wait_for_nodes: float = 300.0,
                 partition_query: bool = True) -> None:
        self.exp = build_experiment(config)
        if self.exp.arrangement.pooled:
            raise FedhetError(f"'{config.method}' trains one model on the pooled data; it has no Flower strategy")
        self.alg, self.server = self.exp.algorithm, self.exp.init_server()
        self.timeout, self.wait_for_nodes, self.partition_query = timeout, wait_for_nodes, partition_query
        self.metrics: list[JSONDict] = []  # evaluation rows (and privacy.dp's epsilon rows), as metrics.jsonl
        self.ledger = open_ledger(self.exp, len(self.exp.data.clients))  # privacy.dp's accountant (None: no DP)
        self.node_of: dict[int, int] = {}  # client id -> node id, found at the first round
        self.state_round: dict[int, int] = {}  # the last round whose fit reply of each client was aggregated
        self._sent: dict[int, Message] = {}  # this round's broadcast per sampled client
        self._split = "test"  # of the current evaluation
        self._handed: dict[str, torch.Tensor] = self.alg.server_model(self.server).state_dict()  # to Flower, last

    @classmethod
    def from_config(cls, path: str | Path | None = None, overrides: Sequence[str] = (),
                    **kwargs: Any) -> FedhetStrategy:  # Any: FedhetStrategy's own keyword arguments
        """From a fedhet YAML config and `key=value` overrides, as on fedhet's command line."""
        return cls(load_config(path, list(overrides)), **kwargs)

    def initial_arrays(self) -> ArrayRecord:
        """The method's global model as Flower's ArrayRecord (pass it to `start`)."""
        self._handed = self.alg.server_model(self.server).state_dict()
        return ArrayRecord(self._handed)

    def summary(self) -> None:
        cfg = self.exp.config
        log.info("fedhet %s on %s: %d clients, server.fraction_fit=%g, seed %d", cfg.method, cfg.data.dataset,
                 len(self.exp.data.clients), cfg.server.fraction_fit, cfg.seed)

    # -------------------------------------------------------------- training
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[FlowerMessage]:
        """The sampled clients' broadcasts (`config`'s entries go along, e.g. for stock ClientApps); a round
        past privacy.dp.max_epsilon raises Flower's PrivacyBudgetExhausted, as Flower's DP strategies do."""
        self._adopt(arrays)
        reason = refusal(self.ledger, self.server)
        if reason is not None:
            raise PrivacyBudgetExhausted(reason)
        cfg, nodes = self.exp.config, self._nodes(grid)
        sampled = sample_clients(cfg.seed, server_round, len(nodes), cfg.server.fraction_fit,
                                 cfg.server.min_fit_clients)
        info = self.exp.round_info(server_round)
        self._sent = {cid: self.alg.broadcast(self.server, info, cid) for cid in sampled}
        return [self._message(MessageType.TRAIN, cid, msg, server_round, config) for cid, msg in self._sent.items()]

    def aggregate_train(self, server_round: int, replies: Iterable[FlowerMessage]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The method's aggregation over the valid replies, in the order of the sampled clients, privately under
        privacy.dp (engine/rounds.py, as in-process); None when fewer than `server.min_fit_fraction` of them
        answered validly (the state stays as it was)."""
        valid = {}
        for cid, reply in self._by_client(replies, set(self._sent)):
            try:
                msg, num_examples = fit_reply(reply.content, expected_reply_spec(self.alg, self._sent[cid]),
                                              local_dp=self.exp.config.privacy.dp.mode == "local")
            except ReplyRejected as err:
                log.warning("round %d: client %d's reply rejected: %s", server_round, cid, err)
                continue
            valid[cid] = (Reply(cid, msg, num_examples), reply.content)
        ordered = [valid[cid] for cid in self._sent if cid in valid]
        need = required(self.exp.config.server.min_fit_fraction, len(self._sent))
        if len(ordered) < need:
            log.warning("round %d: %d of %d clients answered validly, %d needed; the round is skipped",
                        server_round, len(ordered), len(self._sent), need)
            return None, None
        self.server = aggregate_round(self.exp, self.alg, self.server, server_round, self._sent,
                                      [r for r, _ in ordered]).server  # privacy.dp's step included
        if self.ledger is not None:
            self.metrics.append(self.ledger.row(server_round, dp_steps(self.server)))
        self.state_round.update({r.client_id: server_round for r, _ in ordered})
        return self.initial_arrays(), aggregate_metricrecords([c for _, c in ordered], NUM_EXAMPLES)

    # -------------------------------------------------------------- evaluation
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                           ) -> Iterable[FlowerMessage]:
        """Every client evaluates its deployed model on its split (`config["split"]`, default 'test')."""
        self._adopt(arrays)
        info, nodes = self.exp.round_info(server_round), self._nodes(grid)
        extra = {k: v for k, v in config.items() if k != SPLIT}
        split = self._split = str(config.get(SPLIT, "test"))
        return [self._message(MessageType.EVALUATE, cid, self.alg.broadcast(
                    self.server, info, self.exp.arrangement.state_of[cid]), server_round, extra, split=split)
                for cid in sorted(nodes)]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[FlowerMessage]) -> MetricRecord | None:
        """The per-client rows go to `self.metrics`; returned: their uniform average (with the examples' total)."""
        per_client: dict[int, dict[str, float]] = {}
        for cid, reply in self._by_client(replies, set(self.node_of)):
            try:
                metrics = evaluate_reply(reply.content)
            except ReplyRejected as err:
                log.warning("round %d: client %d's evaluation rejected: %s", server_round, cid, err)
                continue
            if metrics is not None:
                per_client[cid] = metrics
        names = {cid: self.exp.data.clients[cid].name for cid in sorted(per_client)}
        rows = client_rows(server_round, self._split, {names[cid]: per_client[cid] for cid in names})
        self.metrics.extend(rows)
        avg = next((r for r in rows if r["client"] == "avg"), None)
        if avg is None:
            return None
        return MetricRecord({**{k: avg[k] for k in METRIC_KEYS}, NUM_EXAMPLES: avg["num_examples"]})

    # -------------------------------------------------------------- plumbing
    def _message(self, kind: str, cid: int, msg: Message, rnd: int, config: ConfigRecord | JSONDict,
                 **bookkeeping: Any) -> FlowerMessage:  # Any: record values of any Flower type
        extra = {k: v for k, v in config.items() if k != SERVER_ROUND}
        state: JSONDict = {"state-round": self.state_round.get(cid, 0), "keep-rounds": []}
        content = request_content(msg, rnd, **extra, **bookkeeping, **state)
        return FlowerMessage(content, dst_node_id=self.node_of[cid], message_type=kind)

    def _nodes(self, grid: Grid) -> dict[int, int]:
        if not self.node_of:
            link = NodeLink(grid, min(self.timeout, 120.0), 0.2, None)
            self.node_of = link.map_nodes(len(self.exp.data.clients), self.wait_for_nodes, self.partition_query)
        return self.node_of

    def _by_client(self, replies: Iterable[FlowerMessage], expected: set[int]
                   ) -> Iterable[tuple[int, FlowerMessage]]:
        """(client id, reply) for the replies without error from a node holding one of `expected`."""
        client_of = {node: cid for cid, node in self.node_of.items()}
        for reply in replies:
            cid = client_of.get(reply.metadata.src_node_id)
            if cid is None or cid not in expected:
                log.warning("a reply from node %s, which holds no client asked this round, is ignored",
                            reply.metadata.src_node_id)
            elif reply.has_error():
                log.warning("client %d failed: %s", cid, reply.error.reason)
            else:
                yield cid, reply

    def _adopt(self, arrays: ArrayRecord) -> None:
        """The global model Flower hands in becomes the method's: what this strategy last handed out, unless a
        wrapper changed it (Flower's DP strategies add their noise to it) or `start` got other initial values.
        Other names mean other initial arrays: an error."""
        if set(arrays) != set(self._handed):
            raise FedhetError("FedhetStrategy.start: pass initial_arrays=strategy.initial_arrays() (the method keeps "
                              "its own server state; these arrays have other names)")
        given = arrays.to_torch_state_dict()
        changed = {k: given[k] for k in self.server.model if k in given and not torch.equal(given[k], self._handed[k])}
        if changed:
            self.server = dataclasses.replace(self.server, model={**self.server.model, **changed})
            self._handed = {**self._handed, **changed}


def fedhet_client_app(path: str | Path | None = None, overrides: Sequence[str] = (),
                      config: ExperimentConfig | None = None, train_mods: Sequence[Mod] = ()) -> ClientApp:
    """The ClientApp of `FedhetStrategy` for the same config: one client per SuperNode (its partition-id), its
    state kept on the node; `train_mods`: Flower mods around its training (e.g. `fixedclipping_mod`)."""
    from fedhet.runtimes.flower.app import FlowerSettings, make_client_app

    cfg = config if config is not None else load_config(path, list(overrides))
    return make_client_app(FlowerSettings(config=cfg.to_dict()), train_mods)

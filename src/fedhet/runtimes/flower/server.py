"""The ServerApp side: the shared `RoundLoop`, with its clients reached through Flower messages.

`FlowerClients` has the interface of `InProcessClients` (fit / evaluate / get_states / set_states), so
sampling, broadcast, aggregation, evaluation rows, checkpoints and the run directory are the in-process
runtime's own code; only where a client's fit / evaluate runs differs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import Message as FlowerMessage
from flwr.app import MessageType, RecordDict
from flwr.serverapp import Grid

from fedhet.engine.experiment import Experiment
from fedhet.engine.loop import RoundLoop
from fedhet.engine.messages import Message, Reply
from fedhet.errors import FedhetError
from fedhet.runtimes.flower.records import from_content, metrics_from_content, reply_from_content, to_content

log = logging.getLogger(__name__)


class FlowerClients:
    """Runs the clients' fit / evaluate on Flower nodes (one node per client, found by its partition-id)."""

    def __init__(self, exp: Experiment, grid: Grid, timeout: float = 3600.0, wait_for_nodes: float = 300.0) -> None:
        if exp.algorithm.centralized:
            raise FedhetError(f"'{exp.config.method}' trains one model on the pooled data of all clients; "
                              "it has no federated counterpart, run it in-process")
        self.exp, self.grid, self.timeout = exp, grid, timeout
        self.node_of = self._map_nodes(wait_for_nodes)

    @property
    def num_train_clients(self) -> int:
        return len(self.exp.data.clients)

    # -------------------------------------------------------------- the executor interface
    def fit(self, rnd: int, messages: dict[int, Message]) -> list[Reply]:
        """Local training on the sampled clients' nodes; replies in the order of `messages` (as in-process)."""
        contents = {cid: to_content(msg, round=rnd, client=cid) for cid, msg in messages.items()}
        replies = self._exchange(MessageType.TRAIN, contents, f"fit-{rnd}")
        return [reply_from_content(replies[cid]) for cid in messages]

    def evaluate(self, rnd: int, messages: dict[int, Message], split: str) -> dict[str, dict[str, float]]:
        """Each client's metrics on its own split, keyed by client name in client order (as in-process)."""
        contents = {cid: to_content(messages[cid], round=rnd, client=cid, split=split)
                    for cid in range(len(self.exp.data.clients))}
        replies = self._exchange(MessageType.EVALUATE, contents, f"evaluate-{split}-{rnd}")
        results = {}
        for cid, client in enumerate(self.exp.data.clients):
            metrics = metrics_from_content(replies[cid])
            if metrics is not None:
                results[client.name] = metrics
        return results

    def get_states(self) -> dict[int, Any]:
        """Client states stay on the clients (Flower's context.state), never on the server."""
        return {}

    def set_states(self, states: dict[int, Any]) -> None:
        if states:
            raise FedhetError("the Flower runtime keeps client states on the clients; a checkpoint with client "
                              "states cannot be pushed to them")

    # -------------------------------------------------------------- transport
    def _map_nodes(self, wait_for_nodes: float) -> dict[int, int]:
        """client id -> node id, asking every connected node for its partition-id."""
        n = self.num_train_clients
        deadline = time.monotonic() + wait_for_nodes
        nodes = list(self.grid.get_node_ids())
        while len(nodes) < n:
            if time.monotonic() > deadline:
                raise FedhetError(f"only {len(nodes)} of {n} SuperNodes connected within {wait_for_nodes:.0f} s")
            time.sleep(0.5)
            nodes = list(self.grid.get_node_ids())
        queries = [FlowerMessage(RecordDict(), dst_node_id=node, message_type=MessageType.QUERY, group_id="nodes")
                   for node in nodes]
        node_of: dict[int, int] = {}
        for reply in self._send(queries):
            _, meta = from_content(reply.content)
            cid = int(meta["client"])
            if cid in node_of:
                raise FedhetError(f"two SuperNodes ({node_of[cid]}, {reply.metadata.src_node_id}) hold partition {cid}")
            node_of[cid] = reply.metadata.src_node_id
        missing = sorted(set(range(n)) - set(node_of))
        if missing:
            raise FedhetError(f"no SuperNode holds partition(s) {missing}")
        log.info("flower nodes: %s", node_of)
        return node_of

    def _exchange(self, message_type: str, contents: dict[int, RecordDict], group: str) -> dict[int, RecordDict]:
        """Send one message per client and return the reply contents keyed by client id."""
        client_of = {node: cid for cid, node in self.node_of.items()}
        messages = [FlowerMessage(content, dst_node_id=self.node_of[cid], message_type=message_type, group_id=group)
                    for cid, content in contents.items()]
        return {client_of[r.metadata.src_node_id]: r.content for r in self._send(messages)}

    def _send(self, messages: list[FlowerMessage]) -> Iterable[FlowerMessage]:
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        if len(replies) != len(messages):
            raise FedhetError(f"{len(messages) - len(replies)} of {len(messages)} Flower nodes did not reply within "
                              f"{self.timeout:.0f} s")
        errors = [f"node {r.metadata.src_node_id}: {r.error.reason}" for r in replies if r.has_error()]
        if errors:
            raise FedhetError("Flower clients failed: " + "; ".join(errors))
        return replies


class FlowerRoundLoop(RoundLoop):
    """The in-process RoundLoop with `FlowerClients` as its client executor."""

    def __init__(self, exp: Experiment, run_dir: Path, grid: Grid, progress: bool = True,
                 timeout: float = 3600.0, wait_for_nodes: float = 300.0) -> None:
        super().__init__(exp, run_dir, progress=progress)
        self.clients = FlowerClients(exp, grid, timeout=timeout, wait_for_nodes=wait_for_nodes)  # type: ignore

    def resume(self) -> None:
        raise FedhetError("resuming is not supported on the Flower runtime yet (client states live on the nodes)")

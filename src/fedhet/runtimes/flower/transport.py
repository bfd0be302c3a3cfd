"""How the Flower server reaches its clients: which SuperNode holds which client, and one wave of messages
pushed and polled for replies (with a deadline, a stop event, and every failure named)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Iterable
from typing import TypeVar

from flwr.app import Message as FlowerMessage
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedhet.errors import FedhetError
from fedhet.runtimes.flower.faults import short_reason
from fedhet.runtimes.flower.records import CONFIG, DATA_SCHEMA, PARTITION_ID, QUERY_PARTITION

K = TypeVar("K", bound=Hashable)  # what `send`'s messages are keyed by (client ids, node ids)

log = logging.getLogger("fedhet.runtimes.flower.server")  # one logger for the server side's messages


class NodeLink:
    """The grid plus the client -> node map (`node_of`, found by asking every node its partition-id)."""

    def __init__(self, grid: Grid, timeout: float, poll_interval: float,
                 stop_event: threading.Event | None) -> None:
        self.grid, self.timeout, self.poll_interval, self.stop_event = grid, timeout, poll_interval, stop_event
        self.node_of: dict[int, int] = {}
        self.schemas: dict[int, str] = {}  # client id -> its node's data schema (node-data runs, local_data.py)
        self.query_failures: dict[int, str] = {}  # node id -> why it did not answer the partition query

    def map_nodes(self, n: int, wait_for_nodes: float, ask: bool = True) -> dict[int, int]:
        """client id -> node id: every connected node is asked once which partition it holds (`query`); nodes
        that do not say (a stock Flower ClientApp has no such query) get the free client ids in node-id order,
        as all nodes do with `ask=False` (run config `partition-query = false`: no query is sent)."""
        deadline = time.monotonic() + wait_for_nodes
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < n:
            if time.monotonic() > deadline:
                raise FedhetError(f"only {len(nodes)} of {n} SuperNodes connected within {wait_for_nodes:.0f} s")
            time.sleep(0.5)
            nodes = sorted(self.grid.get_node_ids())
        node_of = self.query(nodes, self.timeout, strict=True) if ask else {}
        anonymous = [node for node in nodes if node not in node_of.values()]
        free = [cid for cid in range(n) if cid not in node_of]
        if anonymous and ask:
            log.warning("%d SuperNode(s) did not say which partition they hold (a ClientApp without fedhet's "
                        "partition query); they serve the free client id(s) in node-id order", len(anonymous))
        if anonymous:
            node_of.update(dict(zip(free, anonymous, strict=False)))
        missing = sorted(set(range(n)) - set(node_of))
        if missing:
            raise FedhetError(f"no SuperNode holds partition(s) {missing}")
        log.info("flower nodes: %s", node_of)
        self.node_of = node_of
        return node_of

    def query(self, nodes: Iterable[int], timeout: float, strict: bool) -> dict[int, int]:
        """Ask `nodes` which client (partition-id) they hold; nodes that do not answer it are left out.
        strict: two nodes holding one partition, or an answer outside [0, num clients), is an error."""
        messages = {node: FlowerMessage(RecordDict(), dst_node_id=node, message_type=QUERY_PARTITION,
                                        group_id="nodes") for node in nodes}
        replies, failures = self.send(messages, timeout)
        for node, reason in failures.items():
            log.info("node %s did not answer the partition query: %s", node, reason)
        self.query_failures.update(failures)
        node_of: dict[int, int] = {}
        for node, reply in replies.items():
            config = reply.config_records.get(CONFIG)
            value = None if config is None else config.get(PARTITION_ID)
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            if value in node_of:
                if strict:
                    raise FedhetError(f"two SuperNodes ({node_of[value]}, {node}) hold partition {value}")
                log.warning("two SuperNodes (%s, %s) hold partition %d; keeping %s", node_of[value], node, value,
                            node)
            node_of[value] = node
            if config is not None and isinstance(schema := config.get(DATA_SCHEMA), str):
                self.schemas[value] = schema
        return node_of

    def refresh_nodes(self, cids: Iterable[int]) -> set[int]:
        """The clients among `cids` whose SuperNode is offline; a client whose partition a new SuperNode
        (e.g. a restarted one) now holds is moved to that node."""
        online = set(self.grid.get_node_ids())
        offline = {cid for cid in cids if self.node_of[cid] not in online}
        unknown = online - set(self.node_of.values())
        if offline and unknown:
            for cid, node in self.query(unknown, min(self.timeout, 60.0), strict=False).items():
                if cid in self.node_of and self.node_of[cid] not in online:
                    log.warning("client %d is now on SuperNode %s (was %s)", cid, node, self.node_of[cid])
                    self.node_of[cid] = node
                    offline.discard(cid)
        return offline

    def exchange(self, message_type: str, contents: dict[int, RecordDict], group: str
                  ) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """One message per client; (reply contents, failure reasons), both keyed by client id."""
        offline = self.refresh_nodes(contents)
        failures = {cid: f"its SuperNode (node {self.node_of[cid]}) is offline" for cid in offline}
        messages = {cid: FlowerMessage(content, dst_node_id=self.node_of[cid], message_type=message_type,
                                       group_id=group) for cid, content in contents.items() if cid not in offline}
        replies, errors = self.send(messages, self.timeout)
        return replies, {**failures, **errors}

    def send(self, messages: dict[K, FlowerMessage], timeout: float) -> tuple[dict[K, RecordDict], dict[K, str]]:
        """Push the messages, poll for their replies until all arrived or `timeout` passed.

        Returns the reply contents and the failure reasons (error replies, unpushable messages, missing replies),
        both keyed like `messages`. Polls every `poll_interval` seconds (Flower's own `send_and_receive`
        polls every 3 s); raises KeyboardInterrupt when `stop_event` is set, so the loop checkpoints."""
        keys = list(messages)
        ids = list(self.grid.push_messages([messages[k] for k in keys]))
        if len(ids) != len(keys):  # a grid that leaves out what it could not push: match by the ids it set
            pushed = {str(i) for i in ids if i}
            ids = [m if (m := str(messages[k].metadata.message_id)) in pushed else "" for k in keys]
        failures: dict[K, str] = {}
        pending: dict[str, K] = {}
        for key, msg_id in zip(keys, ids, strict=True):  # the grids keep the order of the messages
            if msg_id:
                pending[str(msg_id)] = key
            else:
                failures[key] = "the message could not be pushed to the SuperLink"
        expected_node = {key: messages[key].metadata.dst_node_id for key in keys}
        replies: dict[K, RecordDict] = {}
        deadline = time.monotonic() + timeout
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                got = pending.pop(reply.metadata.reply_to_message_id, None)
                if got is None:
                    continue
                if reply.has_error():
                    failures[got] = f"error reply (code {reply.error.code}): {short_reason(reply.error.reason)}"
                elif reply.metadata.src_node_id != expected_node[got]:
                    failures[got] = f"reply from node {reply.metadata.src_node_id} instead of {expected_node[got]}"
                else:
                    replies[got] = reply.content
            if not pending:
                break
            if self.stop_event is not None and self.stop_event.is_set():
                raise KeyboardInterrupt
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.poll_interval, left))
        for key in pending.values():
            failures[key] = f"no reply within {timeout:g} s (server.reply_timeout)"
        return replies, failures

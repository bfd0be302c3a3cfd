"""An in-process Flower Grid for tests: each node runs a real `ClientApp` object (fedhet's or a stock one) on
Flower's own Message / RecordDict / Context objects, with one Context per node kept across messages as a
SuperNode keeps it. Drives fedhet's ServerApp loop, `FedhetStrategy` and Flower's own strategies alike."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp


class AppGrid:
    """`apps[i]` answers the messages of node 100 + i, whose node config says partition-id i."""

    def __init__(self, apps: list[ClientApp], run_config: dict[str, Any] | None = None) -> None:
        self.apps = {100 + i: app for i, app in enumerate(apps)}
        self.contexts = {node: Context(run_id=1, node_id=node, state=RecordDict(), run_config=run_config or {},
                                       node_config={"partition-id": node - 100, "num-partitions": len(apps)})
                         for node in self.apps}
        self.replies: dict[str, Message] = {}
        self.sent: list[tuple[int, str]] = []  # (node, message type) in the order they were pushed

    def get_node_ids(self) -> list[int]:
        return list(self.apps)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg_id = uuid.uuid4().hex
            node = msg.metadata.dst_node_id
            self.sent.append((node, msg.metadata.message_type))
            try:
                reply = self.apps[node](msg, self.contexts[node])
            except Exception as err:  # noqa: BLE001 - as a SuperNode does: an error reply
                reply = Message(Error(code=2, reason=f"{type(err).__name__}: {err}"), reply_to=msg)
            self.replies[msg_id] = reply
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))

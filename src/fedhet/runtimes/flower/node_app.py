"""A lean ClientApp for deployments: forwards each message to the node's fedhet worker when it has one.

Flower's deployment runtime (flwr 1.41) starts one new ClientApp process per message; fedhet's full ClientApp
(`fedhet.runtimes.flower.app`) then imports torch, torchvision and fedhet and rebuilds the experiment every
time, several seconds per message on a small CPU (docs/results/runtimes.md). This module imports only Flower.
When the SuperNode's node config names a worker socket (`fedhet-worker="/path/node0.sock"`), the message
content and the node's `Context` (its `state` included) go to that long-lived worker
(`fedhet flower worker --socket PATH`, `fedhet.runtimes.flower.worker`), which has everything loaded once,
like the simulation engine's actors; the reply content and the updated `context.state` come back. Without a
worker, the message is answered here by the full client (`fedhet.runtimes.flower.client`), imported on first use.

The socket is a Unix domain socket: worker and SuperNode run on the same machine. The channel is
authenticated with a key the worker writes beside its socket (`<socket>.key`, mode 0600): only a process of
the user running the worker can connect. What crosses it is Flower's protobuf serialisation of the records and
the context (worker_wire.py), never a pickle, so neither side can be made to run code by the other's bytes.
"""

from __future__ import annotations

import importlib.util
import json
from multiprocessing.connection import Client
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedhet.runtimes.flower.worker_key import read_key
from fedhet.runtimes.flower.worker_wire import WireError, read_reply, request_bytes

WORKER_KEY = "fedhet-worker"  # node config key: the worker's socket path
APP_DIR_KEY = "fedhet-app-dir"  # run-config key added for the worker: the App folder holding its plug-ins
PLUGIN_PREFIX = "fedhet_plugins_"  # app_checks.PLUGIN_PREFIX (this module imports only Flower)


def for_worker(context: Context) -> Context:
    """The context sent to the worker: when the App carries plug-in files (app_checks.copy_plugins), its run
    config names the App folder, which is on this process's sys.path (Flower puts it there) but not the worker's."""
    try:
        entries = json.loads(str(context.run_config.get("imports", "[]")))
    except json.JSONDecodeError:
        return context
    for entry in entries if isinstance(entries, list) else []:
        spec = importlib.util.find_spec(str(entry).split(".")[0]) if str(entry).startswith(PLUGIN_PREFIX) else None
        if spec is not None and spec.submodule_search_locations:
            app_dir = str(Path(next(iter(spec.submodule_search_locations))).parent)
            return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                           state=context.state, run_config={**context.run_config, APP_DIR_KEY: app_dir})
    return context


def forward(kind: str, content: RecordDict, context: Context) -> RecordDict:
    """Send one message to the node's worker; its reply content (`context.state` replaced by the worker's)."""
    address = str(context.node_config[WORKER_KEY])
    try:
        if not Path(address).exists():
            raise FileNotFoundError(2, "no such socket")
        conn = Client(address, family="AF_UNIX", authkey=read_key(address))
    except OSError as err:
        raise RuntimeError(f"no fedhet worker answers at {address} ({err}); start `fedhet flower worker --socket "
                           f"{address}` beside this SuperNode, or remove {WORKER_KEY} from its node config") from err
    with conn:
        conn.send_bytes(request_bytes(kind, content, for_worker(context)))
        try:
            reply = read_reply(conn.recv_bytes())
        except WireError as err:
            raise RuntimeError(f"the fedhet worker at {address} sent a malformed reply ({err})") from None
    if isinstance(reply, str):
        raise RuntimeError(f"the fedhet worker at {address} failed on a {kind} message: {reply}")
    payload, state = reply
    for key in list(context.state.keys()):  # in place: Flower saves this object after the app returns
        del context.state[key]
    for key, record in state.items():
        context.state[key] = record
    return payload


def answer(kind: str, msg: Message, context: Context) -> Message:
    """The reply to `msg`: from the worker when the node has one, else computed in this process."""
    if WORKER_KEY in context.node_config:
        return Message(forward(kind, msg.content, context), reply_to=msg)
    from fedhet.runtimes.flower import client
    from fedhet.runtimes.flower.app import FlowerSettings

    setup = FlowerSettings.from_run_config(dict(context.run_config)).client_setup()
    return client.handle(kind, msg, context, setup)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    return answer("train", msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return answer("evaluate", msg, context)


@client_app.query("partition_id")  # records.QUERY_ACTION (this module imports only Flower)
def query(msg: Message, context: Context) -> Message:
    return answer("query", msg, context)

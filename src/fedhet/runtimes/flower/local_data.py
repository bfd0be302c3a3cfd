"""Per-node data for real deployments: each SuperNode loads only its own client's data, the server none.

Turned on by the run config key `node-data = true` (`write_flower_app(..., node_data=True)`, or
`flwr run APP --run-config "node-data=true"`); without it the simulation / local deployment behaviour stays: every
process builds the whole federated dataset from `data.root`. With it:

- the experiment config names the clients: `data.domains = [site_a, site_b, ...]` in client-id order, with the
  `domain` partition and one client per domain (each site is one client; a label-skew split of pooled data has
  no per-site counterpart);
- each SuperNode's node config says where its data is and who it is: `data-root` (an absolute folder holding
  only this site's data, laid out as the dataset reads `data.root`: imagefolder
  `<data-root>/<client>/{train,test}/<class>/*.png`, csv `<data-root>/<client>.csv`) and `client-id` (the
  client's name in data.domains, or its position there; default: the node's `partition-id`). `num-partitions`,
  when given, must equal the number of clients. The node loads `data.domains = [its client]` from `data-root`
  only; the other clients' entries are `AbsentData`, which refuse any read;
- the server builds no client dataset: at start it asks every node its client id (fedhet's partition query)
  and its data's schema (dataset, class names, input shape, modality, vocabulary: never samples), checks that
  all nodes agree, and builds the model and algorithm from that. Methods receive no data on the server (the
  algorithm interface gives them `num_classes` and `num_clients` only); what reads client data on the server is
  refused here with what to do: `eval.pooled_test`, held-out clients (`novel.*`, adapted afterwards on one machine)
  and centralized methods (trained on the pooled data). A method with server-side data of its own (Fed-SFDA's
  `method_args.source`) loads it on the server as before, from an absolute path.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset

from fedhet.algorithms import ALGORITHMS
from fedhet.config import ExperimentConfig, load_config
from fedhet.data import ClientData, FederatedData, build_federated_data
from fedhet.engine.experiment import (
    Experiment,
    arrange,
    build_algorithm,
    limit_threads,
    make_model_fn,
    resolve_device,
)
from fedhet.errors import ConfigError, FedhetError, nearest
from fedhet.runtimes.flower.records import PARTITION_ID
from fedhet.yaml_input import JSONDict

if TYPE_CHECKING:
    from fedhet.runtimes.flower.transport import NodeLink

NODE_DATA = "node-data"  # run-config key: each node loads only its own data
DATA_ROOT = "data-root"  # node config: the folder holding only this site's data
CLIENT_ID = "client-id"  # node config: this node's client, by name or id
_CACHE: dict[str, tuple[Experiment, int]] = {}  # one node experiment per process (ClientApp, worker)
_LOCK = threading.Lock()


class AbsentData(Dataset):  # type: ignore[type-arg]
    """Another client's data, which this process does not hold: any read is an error."""

    def __init__(self, name: str, where: str) -> None:
        self.name, self.where = name, where

    def _refuse(self) -> FedhetError:
        return FedhetError(f"client '{self.name}'s data is not on {self.where}: with node-data each SuperNode "
                           "holds only its own client's data and the server none")

    def __len__(self) -> int:
        raise self._refuse()

    def __getitem__(self, index: int) -> Any:  # Any: Dataset's item type (it always raises)
        raise self._refuse()


def client_names(cfg: ExperimentConfig) -> list[str]:
    """The clients of a node-data run (data.domains, in client-id order); ConfigError for what cannot run
    without the clients' data on the server, saying what to change."""
    data = cfg.data
    if not data.domains:
        raise ConfigError("node-data: the config must list the clients (sites) in client-id order, e.g. "
                          "data.domains=\"[site_a, site_b]\"; each SuperNode's data-root holds one of them")
    if data.partition != "domain" or data.clients_per_domain != 1:
        raise ConfigError(f"node-data: each site is one client, so data.partition must be 'domain' with "
                          f"data.clients_per_domain=1 (got {data.partition}, {data.clients_per_domain})")
    if cfg.eval.pooled_test:
        raise ConfigError("node-data: eval.pooled_test evaluates the server's model on every client's test data, "
                          "which the server does not hold; set eval.pooled_test=false")
    if cfg.novel.active:
        raise ConfigError("node-data: held-out clients (novel.*) are adapted after training on one machine holding "
                          "their data; set novel.holdout=0 and novel.clients=[]")
    if ALGORITHMS.get(cfg.method).centralized:
        raise ConfigError(f"node-data: '{cfg.method}' trains one model on the pooled data of all clients, which "
                          "no machine holds; choose a federated method")
    if len(set(data.domains)) != len(data.domains):
        raise ConfigError(f"node-data: data.domains names a client twice: {data.domains}")
    return list(data.domains)


def schema_of(data: FederatedData) -> str:
    """What the server needs to know of a node's data to build the model: names and shapes, no samples."""
    return json.dumps({"dataset": data.dataset, "classes": list(data.classes), "input_shape": list(data.input_shape),
                       "modality": data.modality, "vocabulary": list(data.vocabulary)}, sort_keys=True)


def assemble(names: list[str], schema: str, own: dict[int, ClientData], where: str) -> FederatedData:
    """A FederatedData of all `names` whose clients are `own` (by id) or AbsentData placeholders."""
    s = json.loads(schema)
    clients = [own.get(cid) or ClientData(name=name, domain=name, train=AbsentData(name, where), val=None,
                                          test=AbsentData(name, where), train_eval=AbsentData(name, where))
               for cid, name in enumerate(names)]
    return FederatedData(dataset=s["dataset"], clients=clients, num_classes=len(s["classes"]),
                         classes=list(s["classes"]), input_shape=tuple(s["input_shape"]), modality=s["modality"],
                         partition="domain", vocabulary=list(s["vocabulary"]))


def experiment_of(cfg: ExperimentConfig, data: FederatedData) -> Experiment:
    """`engine.experiment.build_experiment` with the data given instead of loaded."""
    method = ALGORITHMS.get(cfg.method)
    if method.one_shot and cfg.rounds != 1:
        raise ConfigError(f"method '{cfg.method}' is one-shot: set rounds=1, got rounds={cfg.rounds}")
    if cfg.run.num_threads:
        limit_threads(cfg.run.num_threads)
    device = resolve_device(cfg.run.device)
    model_fn = make_model_fn(cfg, data)
    algorithm = build_algorithm(cfg, data, device, model_fn)
    return Experiment(cfg, data, device, algorithm, model_fn, arrange(algorithm, data))


def node_client(node_config: JSONDict, names: list[str]) -> int:
    """This node's client id from its node config (`client-id`: name or id, else `partition-id`)."""
    raw = node_config.get(CLIENT_ID, node_config.get(PARTITION_ID))
    if raw is None or raw == "":
        raise FedhetError("this SuperNode has no client-id: start it with --node-config "
                          f"'data-root=\"/path/to/site\" client-id=\"NAME\"' (NAME one of {', '.join(names)})")
    if "num-partitions" in node_config and int(node_config["num-partitions"]) != len(names):
        raise FedhetError(f"node config num-partitions={node_config['num-partitions']} but the experiment has "
                          f"{len(names)} clients ({', '.join(names)})")
    if isinstance(raw, str) and not raw.isdigit():
        if raw not in names:
            raise FedhetError(f"node config client-id '{raw}' is not a client of this experiment (data.domains: "
                              f"{', '.join(names)}){nearest(raw, names)}")
        return names.index(raw)
    cid = int(raw)
    if isinstance(raw, bool) or not 0 <= cid < len(names):
        raise FedhetError(f"node config client-id {raw!r} is not a client id: expected a name of "
                          f"{', '.join(names)} or an id 0..{len(names) - 1}")
    return cid


def node_experiment(config: JSONDict, node_config: JSONDict) -> tuple[Experiment, int]:
    """(the experiment as this node sees it, its client id): its own client's data from `data-root`, every
    other client an AbsentData placeholder. Built once per process."""
    root = str(node_config.get(DATA_ROOT, ""))
    if not root:
        raise FedhetError("this run reads each node's own data (run config node-data=true), but this SuperNode "
                          "has no data-root: start it with --node-config 'data-root=\"/path/to/site\" "
                          "client-id=\"NAME\"'")
    if not Path(root).is_absolute():
        raise FedhetError(f"node config data-root '{root}' is relative; give an absolute path (the ClientApp "
                          "process does not run in the SuperNode's folder)")
    key = json.dumps([config, root, node_config.get(CLIENT_ID), node_config.get(PARTITION_ID)], sort_keys=True,
                     default=str)
    with _LOCK:
        if key not in _CACHE:
            cfg = load_config(base=config)
            names = client_names(cfg)
            cid = node_client(node_config, names)
            local = build_federated_data(dataclasses.replace(cfg.data, root=root, domains=[names[cid]]), cfg.seed)
            own = dataclasses.replace(local.clients[0], name=names[cid])
            data = assemble(names, schema_of(local), {cid: own}, f"this SuperNode (client '{names[cid]}')")
            _CACHE.clear()
            _CACHE[key] = (experiment_of(cfg, data), cid)
        return _CACHE[key]


def agree(schemas: dict[int, str], names: list[str], failures: list[str]) -> str:
    """The one data schema all nodes reported; FedhetError naming a node that did not report or disagrees."""
    missing = [cid for cid in range(len(names)) if cid not in schemas]
    if missing:
        why = "; ".join(failures) or "it did not report its data (a ClientApp without node-data support?)"
        raise FedhetError(f"node-data: no SuperNode reported the data of client(s) "
                          f"{', '.join(names[c] for c in missing)}: {why}")
    first = json.loads(schemas[0])
    for cid in range(1, len(names)):
        other = json.loads(schemas[cid])
        for field in sorted(first):
            if other.get(field) != first[field]:
                raise FedhetError(f"node-data: the sites' data disagree on {field}: client '{names[0]}' has "
                                  f"{first[field]}, client '{names[cid]}' {other.get(field)}; every site must hold "
                                  "the same classes and feature columns, at the same image size")
    return schemas[0]


def server_experiment(cfg: ExperimentConfig, link: NodeLink, wait_for_nodes: float, ask: bool) -> Experiment:
    """The server's experiment of a node-data run, built without any client data: the nodes are mapped (each
    says its client id and data schema), their schemas must agree, every client is an AbsentData placeholder."""
    names = client_names(cfg)
    if not ask:
        raise ConfigError("node-data: the server learns each node's client and data from fedhet's partition query; "
                          "set partition-query=true")
    link.map_nodes(len(names), wait_for_nodes, ask=True)
    schema = agree(link.schemas, names, [f"node {node}: {why}" for node, why in link.query_failures.items()])
    return experiment_of(cfg, assemble(names, schema, {}, "the server"))

"""Per-node data (runtimes/flower/local_data.py): each SuperNode reads only its own site's folder, the server no
client data at all, and the run's numbers equal the in-process run on the same sites' data.

The nodes are in-process (tests/flower_testing.AppGrid), each with a node config `data-root` (a temporary folder
holding only its site) and `client-id`; every dataset load is recorded with the node that made it."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
pytest.importorskip("flwr")

from fedhet_testing import metric_rows  # noqa: E402
from flwr.app import Context, Message  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.data import federated  # noqa: E402
from fedhet.errors import ConfigError, FedhetError  # noqa: E402
from fedhet.launch.run import run_experiment  # noqa: E402
from fedhet.runtimes.flower import local_data  # noqa: E402
from fedhet.runtimes.flower.app import FlowerSettings, make_client_app, run_server  # noqa: E402
from tests.flower_testing import AppGrid  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_flower_home", "task_identity")
SITES = ("site_a", "site_b")
COMMON = ["method=fedbn", "rounds=2", "train.local_steps=1", "train.batch_size=4", "train.lr=0.1", "run.quiet=true",
          "run.device=cpu", "run.num_threads=1", "data.augment=false", f"data.domains=[{','.join(SITES)}]"]
KINDS = {
    "imagefolder": ["data.dataset=imagefolder", "data.image_size=8", "model.name=small_cnn", "model.args={width: 4}"],
    "csv": ["data.dataset=csv", "data.options.split_column=split", "model.name=mlp",
            "model.args={hidden: [8], norm: bn}"],
}


def write_site(root: Path, kind: str, site: str, seed: int) -> Path:
    """One site's data under `root` as the dataset reads data.root: imagefolder <site>/{train,test}/<class>/,
    csv <site>.csv with a split column."""
    rng = np.random.default_rng(seed)
    if kind == "imagefolder":
        for split, n in (("train", 4), ("test", 2)):
            for cls in ("cat", "dog"):
                for i in range(n):
                    path = root / site / split / cls / f"{i}.png"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    else:
        root.mkdir(parents=True, exist_ok=True)
        lines = ["age,bp,label,split"] + [
            f"{rng.normal():.4f},{rng.normal():.4f},{i % 2},{'test' if i >= 8 else 'train'}" for i in range(12)]
        (root / f"{site}.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def loads(monkeypatch) -> list[tuple[str | None, str, tuple[str, ...]]]:
    """Every dataset load as (node's site or None for the server, root, domains), wherever it comes from."""
    seen: list[tuple[str | None, str, tuple[str, ...]]] = []
    original = federated.load_domains

    def recorded(spec: Any, domains: Any, ctx: Any) -> Any:
        seen.append((getattr(NODE, "site", None), str(ctx.root), tuple(domains)))
        return original(spec, domains, ctx)

    monkeypatch.setattr(federated, "load_domains", recorded)
    return seen


NODE = threading.local()


def node(app: Any, site: str):  # noqa: ANN201 - a ClientApp stand-in for AppGrid
    def run(msg: Message, context: Context) -> Message:
        NODE.site = site
        try:
            return app(msg, context)
        finally:
            NODE.site = None
    return run


def flower_grid(settings: FlowerSettings, configs: list[tuple[str, dict[str, Any]]]) -> AppGrid:
    """One in-process node per (site, node config)."""
    grid = AppGrid([node(make_client_app(settings), site) for site, _ in configs])
    for (_, config), context in zip(configs, grid.contexts.values(), strict=True):
        context.node_config = config
    return grid


@pytest.mark.parametrize("kind", list(KINDS))
def test_nodes_read_only_their_site_and_the_run_equals_inprocess(tmp_path, loads, kind) -> None:
    for i, site in enumerate(SITES):
        write_site(tmp_path / "nodes" / site, kind, site, seed=i)
        write_site(tmp_path / "all", kind, site, seed=i)  # the same data in one folder: the in-process reference
    reference = run_experiment(load_config(None, COMMON + KINDS[kind] + [f"data.root={tmp_path / 'all'}"]),
                               tmp_path / "inprocess", progress=False)
    loads.clear()
    # the server's config names a root that does not exist: reading it would fail
    config = load_config(None, COMMON + KINDS[kind] + [f"data.root={tmp_path / 'all'}"]).to_dict()
    shutil.rmtree(tmp_path / "all")
    settings = FlowerSettings(config=config, run_dir=str(tmp_path / "flower"), node_data=True, progress=False,
                              wait_for_nodes=1.0)
    # nodes in the other order: node 0 holds site_b (by name), node 1 site_a (by id)
    grid = flower_grid(settings, [
        ("site_b", {"data-root": str(tmp_path / "nodes" / "site_b"), "client-id": "site_b", "partition-id": 0}),
        ("site_a", {"data-root": str(tmp_path / "nodes" / "site_a"), "client-id": 0, "partition-id": 1})])
    result = run_server(grid, settings)  # type: ignore[arg-type]
    assert result.final == reference.final
    assert metric_rows(tmp_path / "flower") == metric_rows(tmp_path / "inprocess")
    assert set(loads) == {(site, str(tmp_path / "nodes" / site), (site,)) for site in SITES}  # none by the server


def test_a_node_cannot_read_another_site_and_holds_no_other_data(tmp_path) -> None:
    write_site(tmp_path / "site_a", "imagefolder", "site_a", seed=0)
    config = load_config(None, COMMON + KINDS["imagefolder"]).to_dict()
    with pytest.raises(FedhetError, match="site_b"):
        local_data.node_experiment(config, {"data-root": str(tmp_path / "site_a"), "client-id": "site_b"})
    exp, cid = local_data.node_experiment(config, {"data-root": str(tmp_path / "site_a"), "client-id": "site_a"})
    assert cid == 0 and exp.data.clients[0].num_train == 8 and exp.data.classes == ["cat", "dog"]
    with pytest.raises(FedhetError, match="'site_b's data is not on this SuperNode"):
        exp.data.clients[1].train[0]


@pytest.mark.parametrize("node_config,message", [
    ({}, "has no data-root"),
    ({"data-root": "site_a", "client-id": "site_a"}, "is relative; give an absolute path"),
    ({"data-root": "/x", "client-id": "site_c"}, "'site_c' is not a client .*did you mean 'site_b'"),
    ({"data-root": "/x", "client-id": 2}, "client-id 2 is not a client id"),
    ({"data-root": "/x"}, "no client-id"),
    ({"data-root": "/x", "client-id": "site_a", "num-partitions": 3}, "num-partitions=3 but the experiment has 2"),
])
def test_node_config_errors_say_what_to_do(node_config, message) -> None:
    config = load_config(None, COMMON + KINDS["imagefolder"]).to_dict()
    with pytest.raises(FedhetError, match=message):
        local_data.node_experiment(config, node_config)


@pytest.mark.parametrize("extra,message", [
    (["data.domains=null"], "must list the clients"),
    (["data.partition=dirichlet"], "data.partition must be 'domain'"),
    (["eval.pooled_test=true"], "set eval.pooled_test=false"),
    (["method=all"], "pooled data of all clients"),
])
def test_what_needs_client_data_on_the_server_is_refused(extra, message) -> None:
    with pytest.raises(ConfigError, match=message):
        local_data.client_names(load_config(None, COMMON + KINDS["imagefolder"] + extra))


def test_the_server_refuses_disagreeing_or_silent_nodes(tmp_path, loads) -> None:
    write_site(tmp_path / "site_a", "imagefolder", "site_a", seed=0)
    write_site(tmp_path / "site_b", "imagefolder", "site_b", seed=1)
    shutil.rmtree(tmp_path / "site_b" / "site_b" / "train" / "dog")
    shutil.rmtree(tmp_path / "site_b" / "site_b" / "test" / "dog")
    settings = FlowerSettings(config=load_config(None, COMMON + KINDS["imagefolder"]).to_dict(),
                              run_dir=str(tmp_path / "run"), node_data=True, progress=False, wait_for_nodes=1.0)
    configs = [(s, {"data-root": str(tmp_path / s), "client-id": s}) for s in SITES]
    with pytest.raises(FedhetError, match=r"disagree on classes: client 'site_a' has \['cat', 'dog'\], client "
                                          r"'site_b' \['cat'\]"):
        run_server(flower_grid(settings, configs), settings)  # type: ignore[arg-type]
    configs[1] = ("site_b", {"data-root": str(tmp_path / "site_a"), "client-id": "site_b"})  # the wrong folder
    with pytest.raises(FedhetError, match="no SuperNode reported the data of client.* site_b: node 101: error reply"):
        run_server(flower_grid(settings, configs), FlowerSettings(**{**vars(settings), "run_dir": str(tmp_path / "r2"),
                                                                      "errors": [], "results": []}))
    assert all(site is not None for site, _, _ in loads)  # the server read nothing


def test_a_node_data_root_needs_a_node_data_run(tmp_path) -> None:
    from fedhet.runtimes.flower import client

    setup = client.ClientSetup(config=load_config(None, COMMON + KINDS["imagefolder"]).to_dict())
    context = Context(run_id=1, node_id=1, state=None, run_config={},  # type: ignore[arg-type]
                      node_config={"data-root": str(tmp_path), "client-id": "site_a"})
    with pytest.raises(FedhetError, match="node-data=true"):
        client.experiment_and_id(context, setup)


@pytest.mark.slow
def test_a_real_deployment_reads_each_site_on_its_own_node(tmp_path) -> None:
    """SuperLink + 2 SuperNodes on 127.0.0.1 (`flwr run`, each node with its fedhet worker), each SuperNode given
    only its own site's folder; the App's data.root does not exist, so the ServerApp could not read client data.
    The metric rows equal the in-process run's. About a minute."""
    from fedhet.runtimes.flower.app_folder import write_flower_app
    from fedhet.runtimes.flower.deploy import LocalFederation, flwr_run

    for i, site in enumerate(SITES):
        write_site(tmp_path / "nodes" / site, "csv", site, seed=i)
        write_site(tmp_path / "all", "csv", site, seed=i)
    cfg = load_config(None, COMMON + KINDS["csv"] + [f"data.root={tmp_path / 'all'}"])
    run_experiment(cfg, tmp_path / "inprocess", progress=False)
    shutil.rmtree(tmp_path / "all")
    config = cfg.to_dict()
    config["run"]["runtime"] = "flower"
    app = write_flower_app(tmp_path / "work" / "app", config, tmp_path / "runs", node_data=True)
    sites = [f"data-root='{tmp_path / 'nodes' / s}' client-id='{s}'" for s in reversed(SITES)]  # node 0: site_b
    with LocalFederation(2, tmp_path / "work", extra_node_config=sites, workers=True) as federation:
        flwr_run(app, federation, timeout=600)
    (run,) = (tmp_path / "runs").glob("run-*")
    assert metric_rows(run) == metric_rows(tmp_path / "inprocess")

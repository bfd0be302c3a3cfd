"""The generated Flower App runs elsewhere: it carries its plug-in files, refuses relative paths, names a bad
`--run-config` key before Flower hides it, gives each `flwr run` its own run folder and says in the ServerApp's
log why it refused a run (runtimes/flower/app_folder.py, app_checks.py, app.py)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import tomli

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.common.config import flatten_dict  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.engine.rundir import RunDirError  # noqa: E402
from fedhet.errors import ConfigError, FedhetError  # noqa: E402
from fedhet.runtimes.flower import app_checks, node_app  # noqa: E402
from fedhet.runtimes.flower.app import FlowerSettings, make_server_app, run_folder, run_server  # noqa: E402
from fedhet.runtimes.flower.app_folder import write_flower_app  # noqa: E402
from tests.runtimes.test_flower_local_data import COMMON, KINDS, SITES, flower_grid, write_site  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_flower_home")
PLUGIN = '''import os

from fedhet.models import build_model, list_models, register_model

with open(os.environ["FEDHET_TEST_PLUGIN_LOG"], "a") as log:  # which module ran this code
    log.write(__name__ + "\\n")


def tiny(num_classes, input_shape, pretrained=False, **args):
    return build_model("small_cnn", num_classes, input_shape, width=4)


if "{name}" not in list_models():  # this process imports the original first (to validate), then the App's copy
    register_model("{name}")(tiny)
'''


def run_config_of(app: Path) -> dict:
    return flatten_dict(tomli.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def csv_config(root: Path, *extra: str) -> dict:
    return load_config(None, COMMON + KINDS["csv"] + [f"data.root={root}", *extra]).to_dict()


def test_the_app_carries_its_plugin_files(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FEDHET_TEST_PLUGIN_LOG", str(tmp_path / "imported.txt"))
    name = f"plugin_net_{uuid.uuid4().hex[:8]}"
    plugin = tmp_path / "src" / "my-model.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN.format(name=name))
    config = load_config(None, ["data.dataset=offline_digits", f"model.name={name}", f"imports=[{plugin}]"]).to_dict()
    app = write_flower_app(tmp_path / "app", config, tmp_path / "runs")
    run_config = run_config_of(app)
    (package,) = app.glob("fedhet_plugins_*")
    assert json.loads(run_config["imports"]) == [f"{package.name}.my_model"]
    assert (package / "my_model.py").read_text() == plugin.read_text()
    plugin.unlink()  # the App's own copy is what the apps import, from the App's folder (as Flower loads it)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)
    assert node_app.APP_DIR_KEY not in node_app.for_worker(context).run_config  # App folder not on sys.path
    monkeypatch.syspath_prepend(str(app))
    assert FlowerSettings.from_run_config(run_config).config["model"]["name"] == name
    assert (tmp_path / "imported.txt").read_text().splitlines()[-1] == f"{package.name}.my_model"
    # a worker beside a SuperNode is told the App's folder by the lean ClientApp
    assert node_app.for_worker(context).run_config[node_app.APP_DIR_KEY] == str(app)


@pytest.mark.parametrize("extra,node_data,message", [
    (["data.root=sites/all"], False, r"data.root = 'sites/all' is a relative path.*absolute path.*node-data"),
    (["model.init_from=ckpt/backbone.pt"], False, r"model.init_from = 'ckpt/backbone.pt' is a relative path"),
    (["data.domains=null"], True, "must list the clients"),
])
def test_the_app_refuses_what_cannot_run_on_a_node(tmp_path, extra, node_data, message) -> None:
    config = csv_config(tmp_path, *extra)
    with pytest.raises(ConfigError, match=message):
        write_flower_app(tmp_path / "app", config, tmp_path / "runs", node_data=node_data)
    assert not (tmp_path / "app" / "pyproject.toml").exists()


def test_a_relative_data_root_is_fine_when_nodes_bring_their_data(tmp_path) -> None:
    config = csv_config(tmp_path, "data.root=sites/all")
    app = write_flower_app(tmp_path / "app", config, tmp_path / "r", node_data=True)
    assert run_config_of(app)["node-data"] is True


def test_a_bad_run_config_key_is_named_before_flower_hides_it(tmp_path, capsys) -> None:
    app = write_flower_app(tmp_path / "app", csv_config(tmp_path), tmp_path / "runs")
    with pytest.raises(ConfigError, match="'trian.lr' is not in the App's run config .*did you mean 'train.lr'"):
        app_checks.check_overrides(app, ["trian.lr=0.05"])
    with pytest.raises(ConfigError, match="train.lr must be > 0"):
        app_checks.check_overrides(app, ["train.lr=-1.0"])
    assert app_checks.check_overrides(app, ["train.lr=0.05 rounds=5"])["rounds"] == 5
    assert app_checks.main([str(app), "--run-config", "trian.lr=0.05"]) == 2
    assert "did you mean 'train.lr'" in capsys.readouterr().err


def test_the_serverapp_log_says_why_it_refused_a_run(capsys) -> None:
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config={"rounds": 2, "trian.lr": 1})
    with pytest.raises(ConfigError):  # Flower marks the run failed with this message as its details
        make_server_app()(None, context)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "[fedhet] ERROR: run 7 stopped: " in out and "unknown config key 'trian' (did you mean 'train'?)" in out


def test_each_flower_run_gets_its_own_folder_and_resume_continues_the_newest(tmp_path, task_identity) -> None:
    for site in SITES:
        write_site(tmp_path / site, "csv", site, seed=len(site))
    configs = [(s, {"data-root": str(tmp_path / s), "client-id": s}) for s in SITES]
    settings = FlowerSettings(config=csv_config(tmp_path), run_dir=str(tmp_path / "runs"), node_data=True,
                              per_run_dir=True, progress=False, wait_for_nodes=1.0,
                              client_state_dir=str(tmp_path / "states"))
    for run_id in (11, 12):  # the same App, run twice
        run_server(flower_grid(settings, configs), settings, run_id)  # type: ignore[arg-type]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run-11", "run-12"]
    assert all((tmp_path / "runs" / f"run-{i}" / "summary.json").is_file() for i in (11, 12))
    # the clients keep their states per run folder too: resuming run-11 never reads run-12's
    assert {p.relative_to(tmp_path / "states").as_posix() for p in (tmp_path / "states").rglob("round_2.pt")} == {
        f"run-{i}/client_{c}/round_2.pt" for i in (11, 12) for c in (0, 1)}
    resumed = FlowerSettings(**{**vars(settings), "resume": True})
    os.utime(tmp_path / "runs" / "run-11" / "checkpoints" / "latest.pt", (1e9, 1e9))  # run-12 is the newest
    assert run_folder(resumed, 13) == tmp_path / "runs" / "run-12"
    assert run_folder(FlowerSettings(**{**vars(resumed), "resume_from": "11"}), 13) == tmp_path / "runs" / "run-11"
    with pytest.raises(RunDirError, match="no run folder under .* holds a checkpoint"):
        run_folder(FlowerSettings(**{**vars(resumed), "run_dir": str(tmp_path / "none")}), 13)
    assert run_folder(FlowerSettings(**{**vars(settings), "per_run_dir": False}), 13) == tmp_path / "runs"
    with pytest.raises(FedhetError, match="no run directory"):
        run_folder(FlowerSettings(config={}), 1)


def test_deploy_reports_the_serverapps_error_line(tmp_path) -> None:
    from fedhet.runtimes.flower.deploy import serverapp_error

    (tmp_path / "flwr-run.log").write_text("INFO : Starting logstream\n[fedhet] ERROR: run 3 stopped: train.lr must "
                                           "be > 0\nERROR : ServerApp raised an exception\n")
    assert serverapp_error(tmp_path / "flwr-run.log") == "run 3 stopped: train.lr must be > 0"
    assert serverapp_error(tmp_path / "none.log") == ""


@pytest.mark.slow
def test_flwr_run_shows_why_fedhet_refused_the_run(tmp_path) -> None:
    """A real SuperLink + SuperNode: a value fedhet refuses fails the ServerApp, whose `[fedhet] ERROR` line
    `flwr run --stream` shows, yet `flwr run` exits 0 (flwr 1.42, docs/deployment.md); a key the App does not list
    is refused by the SuperLink with code 15 only. About a minute."""
    import subprocess

    from fedhet.runtimes.flower.deploy import CONNECTION, LocalFederation
    from fedhet.runtimes.flower.processes import executable

    app = write_flower_app(tmp_path / "app", csv_config(tmp_path), tmp_path / "runs")
    with LocalFederation(1, tmp_path / "work") as federation:
        def flwr_run(override: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([executable("flwr"), "run", str(app), CONNECTION, "--stream", "--run-config",
                                   override], env=federation.env, cwd=federation.workdir, capture_output=True,
                                  text=True, timeout=300)

        refused, unknown = flwr_run("train.lr=-1.0"), flwr_run("trian.lr=0.05")
    shown = refused.stdout + refused.stderr
    assert refused.returncode == 0, shown  # what flwr 1.42 does: the run failed, `flwr run` did not
    assert "[fedhet] ERROR: run " in shown and "train.lr must be > 0" in shown, shown[-3000:]
    assert unknown.returncode != 0 and "Invalid run configuration" in unknown.stdout + unknown.stderr
    assert "trian" not in unknown.stdout + unknown.stderr  # hence app_checks.check_overrides


def test_the_cli_writes_a_node_data_app_and_checks_a_run_config(tmp_path, capsys) -> None:
    from fedhet.cli import main

    for site in SITES:
        write_site(tmp_path / "sites", "csv", site, seed=0)
    args = [*COMMON, *KINDS["csv"], f"data.root={tmp_path / 'sites'}"]
    assert main(["flower", "app", *args, "--node-data", "--workdir", str(tmp_path / "app")]) == 0
    assert run_config_of(tmp_path / "app")["node-data"] is True
    assert main(["flower", "check", str(tmp_path / "app"), "--run-config", "train.lr=0.05 rounds=3"]) == 0
    assert "ok: fedbn on csv, 3 rounds" in capsys.readouterr().out
    assert main(["flower", "check", str(tmp_path / "app"), "--run-config", "trian.lr=0.05"]) != 0
    assert "did you mean 'train.lr'" in capsys.readouterr().err

"""Flower deployment over TLS: a self-signed CA and server certificate for 127.0.0.1, the SuperLink serving
HTTPS with them, SuperNodes and `flwr run` verifying it with the CA (no --insecure anywhere); SuperNode
authentication (registered key pairs) on top of it; the deployment's progress echo."""

from __future__ import annotations

import io
import json
import os
import socket
import ssl
import threading

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read when flwr is imported
pytest.importorskip("flwr")

from fedhet.config import load_config  # noqa: E402
from fedhet.runtimes.flower.tls import TlsFiles, make_self_signed  # noqa: E402

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "train.lr=0.1", "data.max_test_per_client=20", "run.quiet=true", "run.device=cpu",
        "run.num_threads=1"]


pytestmark = pytest.mark.usefixtures("private_flower_home")


def test_self_signed_certificates_verify_for_127_0_0_1(tmp_path) -> None:
    """The generated server certificate is accepted for 127.0.0.1 by a client trusting only the CA."""
    files = make_self_signed(tmp_path / "tls")
    assert TlsFiles.in_dir(tmp_path / "tls") == files
    assert oct(files.key.stat().st_mode & 0o777) == "0o600"
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files.cert, files.key)
    client_ctx = ssl.create_default_context(cafile=str(files.ca))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.getpeercert()["subjectAltName"][0] == ("IP Address", "127.0.0.1")
                tls.send(b"x")
        thread.join(timeout=10)
    with pytest.raises(Exception, match="lacks"):
        TlsFiles.in_dir(tmp_path)


@pytest.mark.slow
def test_deployment_over_tls(tmp_path) -> None:
    """SuperLink (HTTPS, self-signed certificate) + 1 SuperNode + `flwr run` with root-certificates: 1 round
    (≈70 s here)."""
    from fedhet.runtimes.flower.deploy import deploy_experiment

    make_self_signed(tmp_path / "tls")
    c = load_config(None, BASE + ["method=fedbn", "rounds=1", "data.domains=[clean]"])
    run_dir = deploy_experiment(c, tmp_path / "run", workdir=tmp_path / "work", timeout=600, tls_dir=tmp_path / "tls")
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 1
    logs = tmp_path / "work" / "logs"
    assert "running on https://127.0.0.1" in (logs / "superlink.log").read_text()
    config = (tmp_path / "work" / "flwr-home" / "config.toml").read_text()
    assert "root-certificates" in config and "insecure" not in config


def test_process_isolation_starts_a_superexec_beside_the_link_and_each_node(tmp_path, monkeypatch) -> None:
    """isolation "process": the SuperLink's SuperExec verifies it with the CA, each SuperNode's serves that node's
    Runtime API port --insecure (its own loopback); the commands only, no process is started."""
    from fedhet.runtimes.flower import federation as module

    started: dict[str, list[str]] = {}
    monkeypatch.setattr(module.LocalFederation, "_spawn", lambda self, name, args: started.setdefault(name, args))
    monkeypatch.setattr(module, "wait_for_port", lambda *_: None)
    tls = make_self_signed(tmp_path / "tls")
    federation = module.LocalFederation(2, tmp_path / "work", tls=tls, isolation="process").start()
    assert set(started) == {"superlink", "superexec-link", "supernode-0", "superexec-0", "supernode-1", "superexec-1"}
    assert started["superexec-link"][1:] == ["--root-certificates", str(tls.ca), "--runtime-api-address",
                                             federation.address]
    for i in (0, 1):
        node = started[f"supernode-{i}"]
        assert node[node.index("--superlink") + 1] == federation.address
        runtime_api = f"127.0.0.1:{node[node.index('--port') + 1]}"
        assert started[f"superexec-{i}"][1:] == ["--insecure", "--runtime-api-address", runtime_api]


def test_supernode_auth_needs_tls(tmp_path) -> None:
    from fedhet.errors import ConfigError
    from fedhet.runtimes.flower.federation import LocalFederation

    with pytest.raises(ConfigError, match="needs TLS"):
        LocalFederation(1, tmp_path, supernode_auth=True)


def test_supernode_with_an_unregistered_key_is_refused(tmp_path) -> None:
    """SuperLink with --enable-supernode-auth over TLS: the registered SuperNode is activated, one signing with
    a key that was never registered is refused and exits (≈10 s here)."""
    from fedhet.runtimes.flower.federation import LocalFederation
    from fedhet.runtimes.flower.node_auth import make_node_key

    tls = make_self_signed(tmp_path / "tls")
    with LocalFederation(1, tmp_path / "work", tls=tls, supernode_auth=True) as federation:
        private = federation.node_keys / "node0"
        assert oct(private.stat().st_mode & 0o777) == "0o600"
        assert (federation.node_keys / "node0.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
        rogue_key, _ = make_node_key(tmp_path / "rogue", "rogue")
        rogue = federation.start_node(1, auth_key=rogue_key)
        assert rogue.wait(timeout=120) != 0
        assert federation.node_process(0).poll() is None
        link_log = (federation.logs / "superlink.log").read_text(errors="replace")
    assert "Activated node_id=" in link_log
    assert "No SuperNode found with the given public key" in link_log
    assert "Failed to activate SuperNode" in (federation.logs / "supernode-1.log").read_text(errors="replace")


@pytest.mark.slow
def test_deployment_over_tls_with_supernode_auth(tmp_path) -> None:
    """TLS + SuperNode authentication: 2 registered SuperNodes complete a 1-round fedhet run (≈50 s here)."""
    from fedhet.runtimes.flower.deploy import deploy_experiment

    make_self_signed(tmp_path / "tls")
    c = load_config(None, BASE + ["method=fedavg", "rounds=1", "data.domains=[clean, inverted]"])
    run_dir = deploy_experiment(c, tmp_path / "run", workdir=tmp_path / "work", timeout=600,
                                tls_dir=tmp_path / "tls", supernode_auth=True)
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 1
    link_log = (tmp_path / "work" / "logs" / "superlink.log").read_text(errors="replace")
    assert "running on https://127.0.0.1" in link_log and link_log.count("Activated node_id=") == 2
    assert (tmp_path / "work" / "node-keys" / "node1.pub").is_file()


def test_progress_echo_prints_new_marked_lines_once(tmp_path) -> None:
    """`flwr run --stream`'s log is followed: complete new lines holding "[fedhet]" are echoed (colour codes and
    Flower's log prefix removed), other lines and a line still being written are not."""
    from fedhet.runtimes.flower.deploy import ProgressEcho

    log, out = tmp_path / "flwr-run.log", io.StringIO()
    echo = ProgressEcho(log, out)
    assert echo.poll() == []  # no log yet
    log.write_bytes(b"Loading project configuration...\n\x1b[92mINFO \x1b[0m:      [fedhet] round 1/3 0.8 s "
                    b"accuracy 0.41\n[fedhet] round 2/3")
    assert echo.poll() == ["[fedhet] round 1/3 0.8 s accuracy 0.41"]
    with open(log, "ab") as fh:
        fh.write(b" 0.7 s accuracy 0.55\nINFO :      aggregate_fit: received 4 results\n")
    assert echo.poll() == ["[fedhet] round 2/3 0.7 s accuracy 0.55"]
    assert echo.poll() == []
    assert out.getvalue() == "[fedhet] round 1/3 0.8 s accuracy 0.41\n[fedhet] round 2/3 0.7 s accuracy 0.55\n"

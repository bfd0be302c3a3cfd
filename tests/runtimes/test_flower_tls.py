"""Flower deployment over TLS: a self-signed CA and server certificate for 127.0.0.1, the SuperLink serving
HTTPS with them, SuperNodes and `flwr run` verifying it with the CA (no --insecure anywhere)."""

from __future__ import annotations

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

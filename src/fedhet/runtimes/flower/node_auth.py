"""Flower SuperNode authentication (flwr >= 1.20, `flower-superlink --enable-supernode-auth`): an EC key pair
per SuperNode, its public key registered with `flwr supernode register`, its private key given to
`flower-supernode --auth-supernode-private-key`. The SuperLink then refuses any SuperNode whose key was not
registered. Flower allows it over TLS only.

    DIR/node<i>       the SuperNode's private key (OpenSSH format, mode 0600)
    DIR/node<i>.pub   its public key (OpenSSH format), what `flwr supernode register` takes
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fedhet.errors import FedhetError


def make_node_key(folder: str | Path, name: str) -> tuple[Path, Path]:
    """Write a new P-384 key pair `folder/name` (private, 0600) and `folder/name.pub`; return both paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def register_node_keys(flwr: str, public_keys: list[Path], connection: str, env: dict[str, str], cwd: Path,
                       timeout: float = 120.0) -> None:
    """`flwr supernode register KEY CONNECTION` for every key (in parallel); fail clearly when one is refused."""
    procs = [(key, subprocess.Popen([flwr, "supernode", "register", str(key), connection], env=env, cwd=cwd,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)) for key in public_keys]
    failed = []
    for key, proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{key.name}: {out.decode(errors='replace').strip()[-500:]}")
    if failed:
        raise FedhetError("`flwr supernode register` failed for " + "; ".join(failed))

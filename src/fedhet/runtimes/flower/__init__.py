"""The Flower runtime: any fedhet algorithm as a Flower ServerApp + ClientApp pair (needs `fedhet[flower]`).

- `records`: fedhet `Message` <-> Flower `RecordDict` (arrays -> ArrayRecord, scalars -> ConfigRecord).
- `client`: the ClientApp side (one client per SuperNode, its state kept in `context.state`).
- `server`: `FlowerClients`, the client executor behind the shared `RoundLoop`, backed by Flower messages,
  with fault handling (lost / failed / rejected replies, a minimum share of valid replies, stop + resume).
- `validation`: the checks a client's reply must pass before it is aggregated.
- `app`: the ServerApp / ClientApp objects (`flwr run` uses the module-level `server_app` / `client_app`).
- `simulation`: `run_flower_simulation` (Flower's simulation engine, Ray backend).
- `deploy`: a SuperLink and K SuperNodes on this machine, driven by `flwr run` (`fedhet flower deploy`).
- `tls`: the certificate layout of `--tls-dir`, and self-signed certificates for 127.0.0.1.

Import the submodules; this package itself does not import Flower.
"""

from __future__ import annotations

from fedhet.errors import FedhetError
from fedhet.yaml_input import JSONDict


def require_flower() -> None:
    """Raise a clear error naming the extra when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:
        raise FedhetError("the Flower runtime needs the 'flower' extra: pip install 'fedhet[flower]' "
                          "(or pip install 'flwr[simulation]>=1.20')") from err


# ServerConfig fields that only steer fault handling on Flower: a resumed run may change them (e.g. a longer
# timeout or a lower minimum after a failure), so they are left out of the Flower checkpoints' fingerprint.
OPERATIONAL_SERVER_KEYS = ("min_fit_fraction", "min_evaluate_fraction", "reply_timeout")


def checkpoint_config(config: JSONDict) -> JSONDict:
    """The config whose fingerprint a Flower checkpoint carries: the operational server keys removed and a
    marker added, so an in-process run refuses a Flower checkpoint (it holds no client states) and vice versa."""
    out = {**config, "server": {k: v for k, v in config.get("server", {}).items() if k not in OPERATIONAL_SERVER_KEYS}}
    out["runtime-family"] = "flower"
    return out

"""The Flower runtime: any fedhet algorithm as a Flower ServerApp + ClientApp pair (needs `fedhet[flower]`).

- `records`: fedhet `Message` <-> Flower `RecordDict` (arrays -> ArrayRecord, scalars -> ConfigRecord).
- `client`: the ClientApp side (one client per SuperNode, its state kept in `context.state`).
- `server`: `FlowerClients`, the client executor behind the shared `RoundLoop`, backed by Flower messages.
- `app`: the ServerApp / ClientApp objects (`flwr run` uses the module-level `server_app` / `client_app`).
- `simulation`: `run_flower_simulation` (Flower's simulation engine, Ray backend).
- `deploy`: a SuperLink and K SuperNodes on this machine, driven by `flwr run` (`fedhet flower deploy`).

Import the submodules; this package itself does not import Flower.
"""

from __future__ import annotations

from fedhet.errors import FedhetError


def require_flower() -> None:
    """Raise a clear error naming the extra when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:
        raise FedhetError("the Flower runtime needs the 'flower' extra: pip install 'fedhet[flower]' "
                          "(or pip install 'flwr[simulation]>=1.20')") from err

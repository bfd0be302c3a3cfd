"""A client's real upload from a run's checkpoint, as the server sees it: the attacks on uploads start here.

`client_upload` broadcasts the checkpoint's global model for the round after the checkpoint's (its last round for
a finished run), runs that client's local round through the engine's own fit (`InProcessClients.fit_one`:
`engine.local.fit_client` on the client's (seed, round, client) stream), and returns what the client sends back,
noised and clipped by the client itself under `privacy.dp.mode: local` (`core.dp.privatize`, the same step the
run takes; under server-side DP the server sees the clean update). `server_copy` is the model the server can
build from a message: the arrays it received, and for the keys it never receives (FedBN's BatchNorm, FedRep's
head) the initial model's values, which is all it knows of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from fedhet.config import TrainConfig
from fedhet.core.dp import privatize
from fedhet.core.messages import Message, Reply
from fedhet.core.params import StateDict
from fedhet.core.protocols import SampleSet
from fedhet.data import ClientData
from fedhet.errors import FedhetError
from fedhet.privacy.rundir import AttackedRun
from fedhet.runtimes.inprocess import InProcessClients


@dataclass
class Upload:
    """One client's round as the server sees it: the broadcast message, the reply's message and the round."""

    sent: Message
    received: Message
    round: int


def attack_round(run: AttackedRun) -> int:
    """The round the attacked local training stands for: the one after the checkpoint's, or the last one."""
    return min(run.round + 1, run.exp.config.rounds)


def check_uploads_weights(run: AttackedRun) -> None:
    """A FedhetError unless the run's method uploads model weights each round."""
    alg = run.exp.algorithm
    if alg.one_shot or alg.centralized:
        what = "trains on the pooled data, so no client uploads anything" if alg.centralized else \
            ("is one-shot: its clients upload once, before the server's step (FedBiP: latents, FedD3: distilled "
             "images, DENSE: a model trained from the initial one), so a checkpoint holds no round to replay")
        raise FedhetError(f"method '{alg.name}' {what}; an attack on uploaded weights needs a method that sends "
                          "model weights each round (fedavg, fedbn, ditto, fraug, feddat, ...)")


def client_id(run: AttackedRun, name: str | None) -> int:
    """The id of the training client called `name` (None: the first), or a FedhetError listing the names."""
    pool = run.exp.arrangement.pool(len(run.exp.data.clients))
    names = {run.exp.data.clients[c].name: c for c in pool}
    if name is None:
        return pool[0]
    if name not in names:
        raise FedhetError(f"client '{name}' is not a training client of this run; choose one of "
                          f"{', '.join(names)}")
    return names[name]


def client_upload(run: AttackedRun, cid: int, data: ClientData | None = None, train: TrainConfig | None = None
                  ) -> Upload:
    """Client `cid`'s upload of one local round from the checkpoint's state (module docstring). `data`: the client
    data it trains on (default: its own); `train`: the local training settings (default: the run's)."""
    exp, rnd = run.exp, attack_round(run)
    alg = exp.algorithm
    if train is not None:
        from fedhet.algorithms.base import with_hparams

        alg = with_hparams(alg, train=train)
    sent = alg.broadcast(run.server, exp.round_info(rnd), cid)
    clients = InProcessClients(exp)
    received, _ = clients.fit_one(rnd, cid, alg, sent, run.states[cid], data=data)
    dp = exp.config.privacy.dp
    if dp.mode == "local":
        noised, _ = privatize(dp, run.server, [Reply(cid, received, 1)], exp.config.seed, rnd)
        received = noised[0].message
    return Upload(sent, received, rnd)


def uploaded_weights(run: AttackedRun, upload: Upload) -> list[str]:
    """The model weights the upload carries under their own names (sent and received back), or a FedhetError
    when there is none (a method that uploads data, or its update in its own form: SCAFFOLD's dy/...)."""
    model_keys = run.exp.algorithm.parts.init_state
    keys = [k for k in upload.received.arrays if k in upload.sent.arrays and k in model_keys]
    if not keys:
        sends = ", ".join(sorted(upload.received.arrays)[:4]) or "nothing"
        raise FedhetError(f"method '{run.exp.config.method}' uploads no weights of the model under their own names "
                          f"(it sends {sends}{', ...' if len(upload.received.arrays) > 4 else ''}), so there is no "
                          "update of the model to attack; attack a method that sends its model's weights (fedavg, "
                          "fedbn, ditto, fraug, ...)")
    return keys


def server_copy(run: AttackedRun, arrays: StateDict) -> nn.Module:
    """A new model holding those of `arrays` that are model weights, the initial model's values elsewhere."""
    parts = run.exp.algorithm.parts
    return parts.assemble(parts.new(), arrays, {})


def with_data(client: ClientData, train: SampleSet) -> ClientData:
    """The client with `train` as its training samples (with and without augmentation alike)."""
    return dataclasses.replace(client, train=train, train_eval=train)

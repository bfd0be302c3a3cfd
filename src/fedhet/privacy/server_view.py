"""`fedhet privacy RUN_DIR --attack membership --view server`: membership inference on what a client uploads.

The deployed-model view (rundir.py) attacks the model a client ends up with. The server sees something else: each
round, the global model it broadcast and the weights the client sends back. Here each training client runs one
real local round from the checkpoint's state through the engine (uploads.py: its own training split, the run's
local training), and the server builds two models from what it holds (uploads.server_copy: the arrays it has, the
initial model's values for the keys it never receives, e.g. FedBN's BatchNorm): the *uploaded* model (the
broadcast plus the client's update) and the *global* model it started from. Members: the client's training
split, every sample of which that round trains on (the run's local epochs; one epoch when the run counts local
steps instead, so that no member is left out); non-members: its test split.

Scores per sample: the usual four (scores.py) under the uploaded model, and `loss_change` = loss under the uploaded
model - loss under the global model, the loss difference calibrated by a reference model (Watson, Guo, Cormode &
Sablayrolles 2022, "On the importance of difficulty calibration in membership inference attacks", ICLR; here
the reference is the global model, which the server holds): a member's loss drops more in the round that trains on
it, so a lower `loss_change` looks like a member. Per client a report (membership.py), `avg` and `pooled`, as in
the deployed view. The entry goes to privacy.json under "server_<members>_vs_<nonmembers>".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from fedhet.errors import FedhetError
from fedhet.privacy.membership import average_reports, evaluate_membership, pooled_report, score_report
from fedhet.privacy.rundir import SPLITS, AttackedRun, attacked_run, client_split, write_privacy
from fedhet.privacy.scores import sample_scores
from fedhet.privacy.uploads import attack_round, check_uploads_weights, client_upload, server_copy, uploaded_weights
from fedhet.yaml_input import JSONDict

CALIBRATED = "loss_change"


def client_report(run: AttackedRun, cid: int, members: str, nonmembers: str
                  ) -> tuple[JSONDict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The server-view report of client `cid` and its members' and non-members' scores (loss_change included)."""
    exp = run.exp
    client = exp.data.clients[cid]
    member_set, nonmember_set = client_split(client, members), client_split(client, nonmembers)
    train = exp.config.train  # one pass over every member at least: the run's epochs, or one epoch
    upload = client_upload(run, cid, train=dataclasses.replace(train, local_steps=None))
    uploaded_weights(run, upload)  # an upload without them would score the broadcast twice
    uploaded = server_copy(run, {**upload.sent.arrays, **upload.received.arrays})
    batch = exp.config.train.batch_size
    report, m, u = evaluate_membership(uploaded, member_set, nonmember_set, exp.device, batch, client.classes)
    start = server_copy(run, upload.sent.arrays)
    for scores, data in ((m, member_set), (u, nonmember_set)):
        scores[CALIBRATED] = scores["loss"] - sample_scores(start, data, exp.device, batch, client.classes)["loss"]
    report[CALIBRATED] = score_report(m[CALIBRATED], u[CALIBRATED], lower_is_member=True)
    return report, m, u


def server_view(run: AttackedRun, members: str = "train", nonmembers: str = "test", progress: bool = False
                ) -> JSONDict:
    """Every training client's server-view report, their average and the pooled report (module docstring)."""
    check_uploads_weights(run)
    exp = run.exp
    pool = exp.arrangement.pool(len(exp.data.clients))
    for cid in pool:  # every split checked before any client trains
        client_split(exp.data.clients[cid], members), client_split(exp.data.clients[cid], nonmembers)
    clients, member_scores, nonmember_scores = {}, [], []
    for cid in tqdm(pool, desc="membership inference (server view)", unit="client", disable=not progress):
        clients[exp.data.clients[cid].name], m, u = client_report(run, cid, members, nonmembers)
        member_scores.append(m)
        nonmember_scores.append(u)
    avg = average_reports(list(clients.values()))
    avg[CALIBRATED] = {k: float(np.mean([r[CALIBRATED][k] for r in clients.values()]))
                       for k in clients[next(iter(clients))][CALIBRATED] if k != "threshold"}
    pooled = pooled_report(member_scores, nonmember_scores)
    pooled[CALIBRATED] = score_report(np.concatenate([s[CALIBRATED] for s in member_scores]),
                                      np.concatenate([s[CALIBRATED] for s in nonmember_scores]), True)
    return {"view": "server", "members": members, "nonmembers": nonmembers, "round": run.round,
            "attacked_round": attack_round(run), "clients": clients, "avg": avg, "pooled": pooled,
            "held_out": [exp.data.clients[c].name for c in exp.arrangement.novel]}


def evaluate_server_view(run_dir: str | Path, members: str = "train", nonmembers: str = "test",
                         progress: bool = True, write: bool = True) -> JSONDict:
    """The server-view membership inference of the run in `run_dir` (module docstring), merged into privacy.json
    with `write`. Bad input is one FedhetError before anything is written."""
    if members == nonmembers or {members, nonmembers} - set(SPLITS):
        raise FedhetError(f"--split-members {members} --split-nonmembers {nonmembers}: give two different splits "
                          f"among {', '.join(SPLITS)}")
    with attacked_run(run_dir) as run:
        result = server_view(run, members, nonmembers, progress and not run.exp.config.run.quiet)
        result.update(run.facts())
        if write:
            write_privacy(run.rundir.path, result, f"server_{members}_vs_{nonmembers}")
    return result

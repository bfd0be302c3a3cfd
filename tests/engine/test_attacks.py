"""Training-time attacks by hand on small tensors (engine/attacks.py): flipped labels, the stamped trigger, the
uploaded update, the attack success rate counted on honest clients' non-target images only, the attackers drawn,
and the refusals (config/attack.py and the checks against the federation)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from fedhet.config import ServerConfig, load_config
from fedhet.config.attack import AttackConfig, TriggerConfig
from fedhet.core.contract import ServerState
from fedhet.core.messages import Message, Reply
from fedhet.engine.attacks import (
    ASR,
    TRIGGERED,
    Attack,
    Triggered,
    attack_rows,
    attack_summary,
    attack_uploads,
    backdoor_batch,
    check_data,
    check_defense,
    choose_attackers,
    flip_labels,
    poison_of,
    stamp,
    upload_factor,
)
from fedhet.errors import ConfigError
from fedhet.report.final_table import attack_lines


def attack(kind: str, clients: tuple[int, ...] = (0,), names: tuple[str, ...] = ("a",), **cfg: object) -> Attack:
    config = AttackConfig(kind=kind, clients=list(clients), **cfg)  # type: ignore[arg-type]
    return Attack(config, clients, names, 10, upload_factor(config, replacement=4.0))


def test_label_flip_maps_y_to_c_minus_1_minus_y_or_the_permutation_for_attackers_only() -> None:
    y = torch.tensor([0, 1, 2, 9])
    assert flip_labels(y, 10).tolist() == [9, 8, 7, 0]
    assert flip_labels(torch.tensor([0, 1, 2]), 3, [1, 2, 0]).tolist() == [1, 2, 0]
    flip = poison_of(attack("label_flip"), 0)
    assert flip is not None
    x = torch.randn(4, 2)
    fx, fy = flip(x, y)
    assert fy.tolist() == [9, 8, 7, 0] and fx is x
    assert poison_of(attack("label_flip"), 1) is None  # an honest client
    assert poison_of(attack("sign_flip"), 0) is None  # an upload attack trains honestly


def test_the_trigger_patch_is_stamped_in_its_corner_on_a_copy() -> None:
    x = torch.zeros(2, 3, 5, 5)
    out = stamp(x, TriggerConfig(size=2, value=7.0, position="bottom_right"))
    assert (out[..., 3:, 3:] == 7).all() and out.sum() == 7 * 2 * 3 * 4
    assert x.abs().sum() == 0  # the input is left as it was
    top_left = stamp(x, TriggerConfig(size=1, value=-1.0, position="top_left"))
    assert (top_left[..., 0, 0] == -1).all() and top_left.sum() == -6


def test_a_backdoor_batch_stamps_and_relabels_ceil_p_b_images() -> None:
    cfg = AttackConfig(kind="backdoor", clients=[0], target=3, poison_fraction=0.3,
                       trigger=TriggerConfig(size=1, value=5.0, position="top_left"))
    x, y = torch.zeros(5, 1, 4, 4), torch.tensor([0, 1, 2, 4, 5])
    px, py = backdoor_batch(x, y, cfg)
    assert py.tolist() == [3, 3, 2, 4, 5]  # ceil(0.3 * 5) = 2
    assert px[:2, 0, 0, 0].tolist() == [5.0, 5.0] and px[2:].abs().sum() == 0
    assert y.tolist() == [0, 1, 2, 4, 5] and x.abs().sum() == 0


def reply(cid: int, w: list[float], counter: int = 3, personal: float = 1.0) -> Reply:
    arrays = {"w": torch.tensor(w), "n": torch.tensor(counter), "bn": torch.tensor([personal])}
    return Reply(cid, Message(arrays=arrays), 10)


@pytest.mark.parametrize(("kind", "factor", "expected"), [("sign_flip", 3.0, [1 - 3 * 2, 2 + 3 * 1]),
                                                          ("scale", 3.0, [1 + 3 * 2, 2 - 3 * 1])])
def test_the_uploaded_update_is_minus_k_or_k_times_the_update_on_the_shared_floats(kind: str, factor: float,
                                                                                     expected: list[float]) -> None:
    server = ServerState(model={"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(0)})  # "bn" is personal
    replies = [reply(0, [3.0, 1.0], personal=5.0), reply(1, [3.0, 1.0])]  # update d = (2, -1)
    out = attack_uploads(attack(kind, factor=factor), server, replies)
    assert out[0].message.arrays["w"].tolist() == expected
    assert out[0].message.arrays["n"].item() == 3 and out[0].message.arrays["bn"].item() == 5.0  # untouched
    assert out[1] is replies[1]  # the honest client's reply as it was sent
    assert replies[0].message.arrays["w"].tolist() == [3.0, 1.0]


def test_the_backdoor_boost_is_n_over_eta_when_null_and_no_rewrite_at_1() -> None:
    assert attack("backdoor", boost=None).upload_factor == 4.0
    assert attack("backdoor", boost=1.0).upload_factor is None
    assert attack("backdoor", boost=2.5).upload_factor == 2.5
    server = ServerState(model={"w": torch.tensor([1.0])})
    assert attack_uploads(attack("backdoor", boost=None), server, [reply(0, [2.0])])[0].message.arrays["w"].item() \
        == 5.0


def test_triggered_keeps_the_non_target_images_stamped_and_labelled_the_target() -> None:
    cfg = AttackConfig(kind="backdoor", clients=[0], target=0, trigger=TriggerConfig(size=1, value=9.0))
    base = TensorDataset(torch.zeros(4, 1, 3, 3), torch.tensor([0, 1, 0, 2]))
    triggered = Triggered(base, cfg)
    assert len(triggered) == 2  # the target's two images are left out
    x, y = triggered[1]
    assert y.item() == 0 and x[0, 2, 2] == 9.0 and x.sum() == 9.0


def test_attack_success_rate_is_counted_on_honest_clients_only() -> None:
    bd = attack("backdoor", clients=(0,), names=("a",))
    asked: list[tuple[list[int], str]] = []

    def evaluate(messages: dict[int, Message], split: str) -> dict[str, dict[str, float]]:
        asked.append((sorted(messages), split))
        return {"b": {"accuracy": 0.5}, "c": {"accuracy": 1.0}}

    rows = [{"client": "a", "accuracy": 0.9}, {"client": "b", "accuracy": 0.4}, {"client": "c", "accuracy": 0.8},
            {"client": "avg", "accuracy": 0.7}]
    out = attack_rows(bd, rows, {0: Message(), 1: Message(), 2: Message()}, evaluate)
    assert asked == [([1, 2], TRIGGERED)]  # the attacker's own model is not scored
    assert ASR not in out[0] and out[1][ASR] == 0.5 and out[2][ASR] == 1.0
    avg = out[3]
    assert avg[ASR] == 0.75 and avg["honest_accuracy"] == pytest.approx(0.6)
    assert avg["honest_worst_accuracy"] == 0.4 and avg["attacker_accuracy"] == 0.9
    flip = attack_rows(attack("sign_flip"), rows, {0: Message(), 1: Message(), 2: Message()}, evaluate)
    assert ASR not in flip[3] and len(asked) == 1  # no trigger, no triggered evaluation
    lines = attack_lines({"kind": "backdoor", "clients": ["a"], **{k: v for k, v in avg.items() if k != "client"}})
    assert "worst 40.00%" in lines[0] and "75.00%" in lines[1]


def test_a_client_without_a_success_rate_is_left_out_of_the_mean_and_the_summary_reads_the_last_test_round() -> None:
    bd = attack("backdoor", clients=(0,), names=("a",))
    rows = [{"client": "a", "accuracy": 0.9}, {"client": "b", "accuracy": 0.4}, {"client": "c", "accuracy": math.nan},
            {"client": "avg", "accuracy": 0.65}]
    scores = {"b": {"accuracy": math.nan}, "c": {"accuracy": 1.0}}  # b: no image of another class than the target
    avg = attack_rows(bd, rows, {0: Message(), 1: Message(), 2: Message()}, lambda m, s: scores)[3]
    assert avg[ASR] == 1.0 and avg["honest_accuracy"] == 0.4 and avg["honest_worst_accuracy"] == 0.4
    metrics = [{"round": 1, "client": "avg", "split": "test", ASR: 0.1}, {"round": 2, **avg, "split": "test"},
               {"round": 2, "client": "avg", "split": "val", ASR: 0.3}, {"round": 2, "client": "b", "split": "test"}]
    summary = attack_summary(bd, metrics)
    assert summary == {"kind": "backdoor", "clients": ["a"], "client_ids": [0], ASR: 1.0, "honest_accuracy": 0.4,
                       "honest_worst_accuracy": 0.4, "attacker_accuracy": 0.9}
    assert attack_summary(bd, metrics[:0]) == {"kind": "backdoor", "clients": ["a"], "client_ids": [0]}


def test_attackers_by_name_id_or_a_seeded_fraction() -> None:
    names = ["m", "s", "u", "v"]
    assert choose_attackers(AttackConfig(kind="scale", clients=["u", 0]), 0, names, [0, 1, 2, 3]) == [0, 2]
    drawn = choose_attackers(AttackConfig(kind="scale", fraction=0.5), 3, names, [0, 1, 2, 3])
    assert len(drawn) == 2 and drawn == choose_attackers(AttackConfig(kind="scale", fraction=0.5), 3, names,
                                                         [0, 1, 2, 3])
    seeds = {tuple(choose_attackers(AttackConfig(kind="scale", fraction=0.25), s, names, [0, 1, 2, 3]))
             for s in range(8)}
    assert len(seeds) > 1  # the seed draws them
    with pytest.raises(ConfigError, match=r"'w' is not a training client.*0 \(m\)"):
        choose_attackers(AttackConfig(kind="scale", clients=["w"]), 0, names, [0, 1, 2, 3])
    with pytest.raises(ConfigError, match="4 is not a training client"):
        choose_attackers(AttackConfig(kind="scale", clients=[4]), 0, names, [0, 1, 2, 3])
    with pytest.raises(ConfigError, match="none is honest"):
        choose_attackers(AttackConfig(kind="scale", fraction=0.9), 0, names[:2], [0, 1])


@pytest.mark.parametrize(("override", "match"), [
    ("attack.kind=sign_flp", "did you mean 'sign_flip'"),
    ("attack.clients=[] attack.fraction=0", r"must be in \(0, 1\)"),
    ("attack.clients=[] attack.fraction=1.0", r"must be in \(0, 1\)"),
    ("attack.fraction=0.25", "not both"),
    ("attack.clients=[]", "either attack.clients"),
    ("run.runtime=batched", "run.runtime=inprocess"),
    ("attack.kind=scale", "factor=1 uploads the honest update"),
    ("attack.trigger.position=middle", "attack.trigger.position"),
    ("attack.permutation=[0,0,1]", "permutation of 0..C-1"),
])
def test_bad_config_is_one_clear_error(override: str, match: str) -> None:
    base = ["attack.kind=backdoor", "attack.clients=[0]"]
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*base, *override.split()])


@pytest.mark.parametrize(("rule", "attackers", "n", "match"), [
    ("median", 2, 4, "not a minority"), ("geometric_median", 2, 4, "not a minority"),
    ("krum", 1, 4, "2f \\+ 2 < n"), ("multi_krum", 2, 6, "2f \\+ 2 < n"),
    ("trimmed_mean", 1, 4, "int\\(server.trim \\* n\\) = 0")])
def test_a_defense_that_needs_a_majority_refuses_too_many_attackers(rule: str, attackers: int, n: int,
                                                                     match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_defense(ServerConfig(aggregation=rule), attackers, n)
    check_defense(ServerConfig(aggregation="uniform"), attackers, n)  # the mean assumes nothing
    check_defense(ServerConfig(aggregation=rule, trim=0.25), 1, 5)  # within every rule's bound


def test_the_backdoor_needs_images_and_a_class_of_the_dataset() -> None:
    bd = AttackConfig(kind="backdoor", clients=[0], target=10)
    with pytest.raises(ConfigError, match="samples are features"):
        check_data(bd, "features", 10, (60,))
    with pytest.raises(ConfigError, match=r"attack.target=10 is not a class .*0..9"):
        check_data(bd, "image", 10, (3, 28, 28))
    with pytest.raises(ConfigError, match="larger than the images"):
        check_data(AttackConfig(kind="backdoor", clients=[0], trigger=TriggerConfig(size=9)), "image", 10, (1, 8, 8))
    with pytest.raises(ConfigError, match="has 3 entries"):
        check_data(AttackConfig(kind="label_flip", clients=[0], permutation=[2, 1, 0]), "image", 10, (1, 8, 8))
    check_data(AttackConfig(kind="backdoor", clients=[0], target=9), "image", 10, (3, 28, 28))

"""`fedhet privacy` on an unfinished run says that it attacks the latest checkpoint, not the deployed model."""

from __future__ import annotations

from fedhet.privacy.command import format_result


def _result(finished: bool) -> dict[str, object]:
    score = {"gap": 0.0, "attack_accuracy": 0.5, "auc": 0.5}
    report = {"num_members": 2, "num_nonmembers": 2, "loss": score, "entropy": score, "modified_entropy": score}
    return {"clients": {"c0": report}, "avg": report, "pooled": report, "table4": {"entropy": 0.1, "loss": 0.2},
            "finished": finished, "round": 3, "rounds": 10}


def test_an_unfinished_run_is_said_first() -> None:
    lines = format_result(_result(False))
    assert lines[0].startswith("NOTE: this run is not finished") and "after round 3 of 10" in lines[0]
    assert not any("NOTE" in line for line in format_result(_result(True)))

"""The per-client table `fedhet run` prints: a summary when quiet or with many clients; clients without test data
shown as "—" and left out of the means."""

from __future__ import annotations

import math

from fedhet.report.final_table import NO_TEST_DATA, SUMMARISE_ABOVE, final_table

NAN = math.nan


def metrics(acc: float) -> dict[str, float]:
    return {"accuracy": acc, "balanced_accuracy": acc, "loss": 1.0 - acc if not math.isnan(acc) else NAN}


def test_a_few_clients_get_one_row_each_and_one_without_test_data_is_a_dash() -> None:
    final = {"a": metrics(0.5), "b": metrics(NAN), "c": metrics(0.7), "avg": metrics(0.6)}
    lines = final_table(final)
    assert len(lines) == 5 and lines[1].startswith("a ") and "50.00%" in lines[1]
    assert lines[2] == f"{'b':<16} {NO_TEST_DATA}" and "nan" not in "\n".join(lines)
    assert lines[4].startswith("avg ") and "60.00%" in lines[4] and "(1 client without test data left out)" in lines[4]


def test_quiet_prints_a_summary_without_the_empty_clients_in_its_mean() -> None:
    final = {"a": metrics(0.5), "b": metrics(NAN), "c": metrics(0.7), "d": metrics(0.9), "e": metrics(0.3),
             "avg": metrics(0.6)}
    lines = final_table(final, quiet=True)
    assert lines[0] == "4 clients: accuracy mean 60.00%, min 30.00%, max 90.00% (1 client without test data left out)"
    assert lines[1].startswith("worst: e 30.00%, a 50.00%, c 70.00%")
    assert not any(line.startswith(("a ", "b ", "d ")) for line in lines) and lines[-1].startswith("avg ")


def test_many_clients_are_summarised_even_when_not_quiet() -> None:
    final = {f"client{i:04d}": metrics(i / 1000) for i in range(1000)}
    final["empty"], final["avg"], final["pooled"] = metrics(NAN), metrics(0.5), metrics(0.55)
    lines = final_table(final)
    assert len(lines) == 5 and lines[0].startswith("1000 clients: accuracy mean 49.95%, min 0.00%, max 99.90%")
    assert "worst: client0000 0.00%, client0001 0.10%, client0002 0.20%" in lines[1]
    assert [line.split()[0] for line in lines[3:]] == ["avg", "pooled"]
    assert len(final_table({f"c{i}": metrics(0.5) for i in range(SUMMARISE_ABOVE)})) == SUMMARISE_ABOVE + 1


def test_no_client_with_test_data_and_no_rows() -> None:
    assert final_table({"a": metrics(NAN), "b": metrics(NAN)}, quiet=True)[0] == "2 clients, none with test data"
    assert final_table({}) == []


def test_report_cells_of_a_client_without_test_data_are_a_dash_not_nan() -> None:
    from fedhet.report.table import Cell, format_cell

    assert format_cell(Cell(math.nan, math.nan, 1), percent=True) == "–"
    assert format_cell(Cell(0.8523, 0.012, 3), percent=True) == "85.23 ± 1.20"

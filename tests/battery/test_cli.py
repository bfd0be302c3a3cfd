"""Bad command lines: lists, numbers, flags, misplaced overrides, Ctrl-C, unexpected errors and -v."""

from __future__ import annotations

import pytest

from battery.harness import assert_one_clear_error, run_cli, run_cli_subprocess

SWEEP_LISTS = {  # name: (flag, value, words)
    "seeds_not_int": ("--seeds", "0,x", ("'x' is not an integer", "--seeds 0,1,2")),
    "seeds_float": ("--seeds", "0,1.5", ("'1.5' is not an integer",)),
    "seeds_double_comma": ("--seeds", "0,,1", ("empty item", "--seeds 0,1,2")),
    "seeds_trailing_comma": ("--seeds", "0,1,", ("empty item",)),
    "seeds_empty": ("--seeds", "", ("--seeds is empty", "leave the flag out")),
    "seeds_repeated": ("--seeds", "0,1,0", ("names 0 more than once",)),
    "seeds_negative": ("--seeds", "-1", ("seed must be >= 0",)),
    "methods_empty": ("--methods", "", ("--methods is empty", "leave the flag out")),
    "methods_only_commas": ("--methods", ",", ("--methods is empty",)),
    "methods_double_comma": ("--methods", "fedavg,,fedbn", ("empty item", "--methods fedavg,fedbn")),
    "methods_repeated": ("--methods", "fedavg,fedavg", ("names fedavg more than once",)),
    "methods_typo": ("--methods", "fedavg,fedbnn", ("fedbnn", "did you mean 'fedbn'")),
    "methods_unknown": ("--methods", "fedavg,typo", ("unknown method (or sweep variant) 'typo'", "valid:")),
    "datasets_empty": ("--datasets", "", ("--datasets is empty",)),
    "datasets_double_comma": ("--datasets", "offline_digits,,pacs", ("empty item",)),
    "datasets_typo": ("--datasets", "offline_digits,pcas", ("pcas", "did you mean 'pacs'")),
}


@pytest.mark.parametrize("name", list(SWEEP_LISTS))
def test_bad_sweep_list_trains_nothing(battery, name: str) -> None:
    """The whole plan is checked first: a bad entry anywhere means no run is trained, no folder written."""
    flag, value, words = SWEEP_LISTS[name]
    cfg = battery.tiny_config(extra="sweep: {methods: [fedavg], seeds: [0]}\n")
    battery.finished_run()
    battery.fails(["sweep", str(cfg), "-q", flag, value], *words, code=2)
    assert not (battery.root / "runs").exists()


def test_bad_method_args_of_a_later_run_trains_nothing(battery) -> None:
    cfg = battery.tiny_config(extra="sweep:\n  methods: [fedavg, fedprox]\n"
                                    "  overrides: {fedprox: {method_args: {muu: 0.1}}}\n")
    battery.fails(["sweep", str(cfg), "-q"], "sweep run fedprox", "did you mean 'mu'")
    assert not (battery.root / "runs").exists()


def test_report_dir_that_is_a_file_fails_before_training(battery) -> None:
    cfg = battery.tiny_config(extra="sweep: {methods: [fedavg]}\n")
    target = battery.write("taken.md", "my notes\n")
    battery.fails(["sweep", str(cfg), "-q", "--report-dir", str(target)], "--report-dir", "existing file", "folder")
    assert not (battery.root / "runs").exists()


@pytest.mark.parametrize("value, words", [("0", ("--stop-after must be", ">= 1", "got 0")),
                                          ("-3", ("got -3", "leave it out")),
                                          ("x", ("--stop-after", "invalid int value: 'x'", "--help"))])
def test_bad_stop_after(battery, value: str, words: tuple[str, ...]) -> None:
    battery.finished_run()
    battery.fails(["run", "--quiet", "--stop-after", value, *battery.tiny], *words, code=2)
    assert not (battery.root / "runs").exists()


USAGE = {  # name: (argv, words)
    "no_command": ([], ("required: command", "fedhet --help")),
    "unknown_command": (["runn"], ("invalid choice: 'runn'", "fedhet --help")),
    "unknown_flag": (["run", "--bogus"], ("unknown option '--bogus'", "fedhet run --help")),
    "misspelt_flag_after_config": (["run", "c.yaml", "--quiet", "--resme"], ("'--resme'", "did you mean '--resume'")),
    "second_config_file": (["run", "c.yaml", "other.yaml"], ("'other.yaml'", "key=value")),
    "stray_word_after_flag": (["run", "c.yaml", "--quiet", "other.yaml"], ("'other.yaml'", "key=value")),
    "sweep_without_config": (["sweep"], ("required: config",)),
    "data_without_action": (["data"], ("required: action",)),
    "data_bad_action": (["data", "shw"], ("invalid choice: 'shw'",)),
    "report_without_runs": (["report"], ("required: run_dirs",)),
    "methods_extra_word": (["methods", "fedavg"], ("unexpected argument 'fedavg'",)),
    "flag_missing_value": (["run", "--run-dir"], ("--run-dir", "expected one argument")),
}


@pytest.mark.parametrize("name", list(USAGE))
def test_usage_error_is_one_line(battery, name: str) -> None:
    argv, words = USAGE[name]
    battery.finished_run()
    battery.fails(argv, *words, code=2)


def test_overrides_after_flags_are_accepted(battery) -> None:
    cfg = battery.tiny_config()
    result = battery.succeeds(["run", str(cfg), "--quiet", "seed=3", "run.checkpoint_every=1"])
    assert "seed3" in result.out


def test_overrides_between_flags_without_config(battery) -> None:
    result = battery.succeeds(["run", "--quiet", battery.tiny[0], "--stop-after", "1", *battery.tiny[1:],
                               "name=between"])
    assert "between" in result.out


def test_ctrl_c_during_start_up_is_one_line(battery, monkeypatch) -> None:
    import fedhet.config

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fedhet.config, "load_config", interrupted)
    battery.finished_run()
    battery.fails(["run", "--quiet", *battery.tiny], "interrupted (Ctrl-C)", "run the command again", "--resume",
                  code=130)


def test_real_sigint_during_start_up_is_one_line(battery) -> None:
    """A real SIGINT (not a raised KeyboardInterrupt) while the data are loaded, in a separate process, as a
    user's Ctrl-C in a terminal. The prelude restores Python's own SIGINT handler: a test run started in the
    background (`cmd &` in a script) hands its children SIGINT ignored, and Python then keeps it ignored."""
    prelude = ("import signal, fedhet.engine.experiment as m\n"
               "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "def hook(*a, **k):\n    signal.raise_signal(signal.SIGINT)\n"
               "m.build_federated_data = hook\n")
    run = battery.finished_run()
    result = run_cli_subprocess(["run", "--quiet", *battery.tiny], prelude=prelude, cwd=battery.root)
    assert_one_clear_error(result, "interrupted", code=130)
    battery.check_unchanged()
    assert run.is_dir()


def test_unexpected_exception_is_one_line_naming_it(battery, monkeypatch) -> None:
    import fedhet.config

    def broken(*args, **kwargs):
        raise ValueError("something odd\nsecond line")

    monkeypatch.setattr(fedhet.config, "load_config", broken)
    line = battery.fails(["run", "--quiet", "rounds=1"], "unexpected ValueError: something odd", "run with -v",
                         code=1)
    assert "second line" not in line


def test_os_error_is_one_line_naming_the_file(battery, monkeypatch) -> None:
    import fedhet.config

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/some/where")

    monkeypatch.setattr(fedhet.config, "load_config", denied)
    battery.fails(["run", "--quiet", "rounds=1"], "Permission denied", "'/some/where'", "permissions", code=1)


@pytest.mark.parametrize("argv", [["-v", "run", "bad.yaml"], ["run", "bad.yaml", "-v"], ["run", "--debug", "bad.yaml"]])
def test_verbose_shows_the_traceback(battery, argv: list[str]) -> None:
    battery.write("bad.yaml", b"\xff")
    result = run_cli(argv)
    assert result.code == 2
    assert "Traceback" in result.err and result.err_lines[-1].startswith("error: config file 'bad.yaml'")

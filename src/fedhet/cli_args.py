"""Command-line argument helpers for `fedhet.cli`: one-line usage errors, comma lists, overrides after flags."""

from __future__ import annotations

import argparse
import typing

from fedhet.errors import ConfigError, UsageError, nearest

DEBUG_FLAGS = ("-v", "--verbose", "--debug")


def config_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The optional CONFIG positional may be omitted: a first positional with '=' is an override. Neither a
    config nor an override is a UsageError: a bare command would silently train fedhet's 50-round defaults."""
    if args.config is not None and "=" in args.config:
        return None, [args.config, *args.overrides]
    if args.config is None and not args.overrides:
        prog = f"fedhet {args.command}" + (f" {args.action}" if getattr(args, "action", None) else "")
        raise UsageError(f"{prog} needs a config file, e.g. `{prog} configs/quickstart.yaml` (`fedhet configs` "
                         "lists the examples shipped with fedhet), or key=value overrides of the built-in defaults "
                         f"(`{prog} method=fedbn`)")
    return args.config, list(args.overrides)


def check_repeated_overrides(overrides: list[str]) -> None:
    """A key given twice on the command line (`train.lr=0.1 train.lr=0.2`) is an error, not "the last wins"."""
    given: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" in item and key in given:
            raise ConfigError(f"override '{key}' is given twice ({given[key]}, then {item}); give it once")
        given[key] = item


def check_stop_after(stop_after: int | None) -> None:
    if stop_after is not None and stop_after < 1:
        raise UsageError(f"--stop-after must be a round number >= 1 (the last round to run before stopping with a "
                         f"checkpoint), got {stop_after}; leave it out to run every round")


def csv_list(text: str | None, flag: str, kind: type[str] | type[int] = str
             ) -> list[typing.Any] | None:  # Any: items of `kind`, str or int
    """A comma-separated flag value as a list (None when the flag is absent); empty or repeated items and items
    that are not of `kind` are a UsageError."""
    if text is None:
        return None
    example = {"--seeds": "0,1,2", "--methods": "fedavg,fedbn", "--datasets": "digits,pacs"}.get(flag, "a,b")
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise UsageError(f"{flag} is empty; give comma-separated values, e.g. {flag} {example}, or leave the flag "
                         "out to use the config's sweep list")
    if not all(items):
        raise UsageError(f"{flag} '{text}' has an empty item (two commas, or a comma at an end); "
                         f"give comma-separated values, e.g. {flag} {example}")
    dupes = sorted({t for t in items if items.count(t) > 1})
    if dupes:
        raise UsageError(f"{flag} '{text}' names {', '.join(dupes)} more than once; give each once")
    if kind is int:
        return [_integer(t, text, flag, example) for t in items]
    return items


def _integer(item: str, text: str, flag: str, example: str) -> int:
    try:
        return int(item)
    except ValueError:
        raise UsageError(f"{flag} '{text}': '{item}' is not an integer; give comma-separated integers, "
                         f"e.g. {flag} {example}") from None


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one-line UsageErrors (main prints them), not usage + exit."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def place_extras(args: argparse.Namespace, extras: list[str], flags: typing.Iterable[str] = ()) -> None:
    """Arguments argparse left over because they came after a flag: `key=value` overrides join the overrides
    (report: paths join the run dirs); an unknown flag (`flags`: the valid ones) or a stray word is a UsageError."""
    prog = f"fedhet {args.command}"
    for item in extras:
        if item.startswith("-") and len(item) > 1:
            raise UsageError(f"{prog}: unknown option '{item}'{nearest(item, flags)} (see {prog} --help)")
        if hasattr(args, "overrides"):
            if "=" not in item:
                raise UsageError(f"{prog}: unexpected argument '{item}': after the config file only key=value "
                                 f"overrides may follow (e.g. train.lr=0.05); see {prog} --help")
            args.overrides.append(item)
        elif hasattr(args, "run_dirs"):
            args.run_dirs.append(item)
        else:
            raise UsageError(f"{prog}: unexpected argument '{item}' (see {prog} --help)")

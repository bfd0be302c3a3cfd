"""`fedhet configs [--copy DIR]`: list the example configs shipped with fedhet (`fedhet.config.examples`), or copy
them into a folder. Only argparse is imported here, so `fedhet --help` stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet.errors import ConfigError

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[Any]  # Any: argparse's own parameter


def add_configs_parser(sub: Subparsers) -> None:
    """Add `fedhet configs [--copy DIR]` to the `fedhet` parser."""
    configs = sub.add_parser("configs", help="list the example configs shipped with fedhet, or copy them out: "
                                             "fedhet configs [--copy DIR]")
    configs.add_argument("--copy", metavar="DIR", default=None, help="copy every example config into DIR")
    configs.set_defaults(func=cmd_configs)


def cmd_configs(args: argparse.Namespace) -> int:
    """List the shipped examples (`fedhet run NAME` finds them from any folder), or copy them to --copy DIR."""
    from fedhet.config.examples import EXAMPLES_DIR, copy_examples, list_examples

    if args.copy is not None:
        written = copy_examples(args.copy)
        print(f"copied {len(written)} example configs to {args.copy} (e.g. fedhet run "
              f"{Path(args.copy) / 'quickstart.yaml'})")
        return 0
    names = list_examples()
    if not names:
        raise ConfigError(f"no example configs found in {EXAMPLES_DIR}; this fedhet installation lacks them")
    print(f"example configs shipped with fedhet ({EXAMPLES_DIR}); run one from any folder with "
          "`fedhet run NAME` (e.g. fedhet run quickstart), copy them out with `fedhet configs --copy DIR`:")
    for name in names:
        print(f"  {name}")
    return 0

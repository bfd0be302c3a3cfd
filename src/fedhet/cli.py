"""The `fedhet` command: run | sweep | report | data | pretrain | ldm | methods | flower.

Bad input never reaches the user as a traceback: every FedhetError is one line "error: ..." on stderr and exit
code 2 (or the error's `exit_code`), Ctrl-C is one line and exit code 130, any other exception is one line
naming it and exit code 1; `-v` / `--debug` (before or after the subcommand) prints the traceback too.
`key=value` overrides may stand anywhere after the subcommand, also after flags.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import traceback

from fedhet.cli_args import DEBUG_FLAGS
from fedhet.cli_parser import build_parser, parse_args
from fedhet.errors import FedhetError

__all__ = ["build_parser", "main", "parse_args"]

log = logging.getLogger("fedhet")
# commands whose first own output comes after torch is imported and the data is built (seconds): a first line on
# a terminal (not in pipes and logs, where bad input stays one line "error: ...")
SLOW_START = ("run", "sweep", "tune", "pretrain", "flower", "adapt", "export")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _fail(message: str, verbose: bool, code: int) -> int:
    """Print the traceback (with -v) and one line "error: ..." to stderr; return the exit code. A path's repr
    inside the message (`PosixPath('runs/x')`, from a library's exception text) is shown as the path."""
    if verbose:
        traceback.print_exc()
    message = re.sub(r"(?:Posix|Windows)?Path\(('[^']*'|\"[^\"]*\")\)", r"\1", message)
    print(f"error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """The console entry point: 0 on success, else one line on stderr and a non-zero exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = any(a in DEBUG_FLAGS for a in argv)
    hint = "" if verbose else " (run with -v for the traceback)"
    try:
        args = parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        if args.command in SLOW_START and not getattr(args, "quiet", False) and sys.stderr.isatty():
            print(f"fedhet {args.command}: starting (importing torch, checking the config, building the data) ...",
                  file=sys.stderr, flush=True)
        return int(args.func(args))
    except KeyboardInterrupt:
        return _fail("interrupted (Ctrl-C); run the command again to start over (a run that wrote a checkpoint "
                     "continues with --resume)", verbose, 130)
    except BrokenPipeError:  # `fedhet methods | head`: the reader left; say nothing more
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except FedhetError as err:
        return _fail(str(err), verbose, err.exit_code)
    except OSError as err:
        where = f" '{err.filename}'" if err.filename else ""
        return _fail(f"{err.strerror or _first_line(str(err))}{where}: check the path, its permissions and the free "
                     f"space{hint}", verbose, 1)
    except Exception as err:  # noqa: BLE001 (the last line of defence: one line, not a traceback)
        return _fail(f"unexpected {type(err).__name__}: {_first_line(str(err))} - this input is not checked "
                     f"yet or fedhet has a bug; please report it{hint}", verbose, 1)


if __name__ == "__main__":
    sys.exit(main())

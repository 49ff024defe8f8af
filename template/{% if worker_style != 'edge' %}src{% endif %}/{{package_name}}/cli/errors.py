# Command-line machinery: you should not need to edit this file (handlers live in handlers/).
"""How the command line fails: one `error: ...` line on stderr that says what to do, and an
exit status: 1 when the command could not be done (the database unreachable, the queue's
schema missing, no such job), 2 for bad usage (a bad argument or setting, or a value the
database refused). With LOG_LEVEL=DEBUG the traceback is printed too."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from ..queue import QueueApiError, QueueUnavailable, Refused, SchemaMissing
from ..worker.logs import describe_exception

FAILED = 1
USAGE = 2


def error(message: str) -> None:
    """Print `error: message` on stderr, as one line."""
    print("error: " + " ".join(message.split()), file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a bad argument said in one line (not usage, then the error)."""

    def error(self, message: str) -> NoReturn:
        error(f"{message} (see `{self.prog} --help`)")
        sys.exit(USAGE)


def run_reporting(command: Callable[[], int], *, debug: bool = False) -> int:
    """Run `command`, and its exit status; each failure becomes one error line."""
    try:
        return command()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        if isinstance(exc, Refused):
            error(f"the database refused it: {exc}")
            return USAGE
        if isinstance(exc, QueueUnavailable | SchemaMissing | QueueApiError):
            error(str(exc))
        else:
            hint = "" if debug else " (LOG_LEVEL=DEBUG prints the traceback)"
            error(f"{describe_exception(exc)}{hint}")
        return FAILED

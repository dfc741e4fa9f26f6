"""Argument checks shared by the commands: PIDs, a terminal for the live view, output folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...probes import OutputError, UsageError, check_out_dir

PID_MAX = 2**31 - 1  # pid_t; larger numbers are no PID at all
PID_MAX_FILE = "/proc/sys/kernel/pid_max"  # the largest PID this kernel hands out, plus one


def pid_arg(text: str) -> int:
    """argparse ``type`` for a PID: a positive whole number (``-1``, ``0`` and ``abc`` are refused),
    no larger than this kernel's PIDs go."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a PID is a positive whole number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a PID is a positive whole number, not {text}")
    largest = largest_pid()
    if value > largest:
        raise argparse.ArgumentTypeError(f"{text} is too large for a PID: no process can have it "
                                         f"(PIDs here go up to {largest})")
    return value


def largest_pid() -> int:
    """The largest PID this kernel gives (``kernel.pid_max`` less one; pid_t's limit where unreadable)."""
    try:
        with open(PID_MAX_FILE) as handle:
            return min(PID_MAX, int(handle.read().strip()) - 1)
    except (OSError, ValueError):
        return PID_MAX


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def require_terminal(command: str, instead: str) -> None:
    """The live view draws on a terminal; redirected to a file it would write escape codes.

    ``command`` is the subcommand (``attach``): the CLI already puts "trainwatch:" in front."""
    if not stdout_is_terminal():
        raise UsageError(f"{command} shows a live screen and needs a terminal, but stdout is not one "
                         "(redirected to a file or a pipe)", instead)


def writable_dir(path: Path, option: str = "--out", action: str = "write evidence into") -> Path:
    """``path`` as an absolute directory that exists (created if needed) and can be written; a
    path that cannot be is refused with its reason before anything is made."""
    path = check_out_dir(path, option, action)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {path}: {exc.strerror or exc}", f"pass a writable {option} DIR") from None
    return path


def _number(text: str, kind: type, what: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, not {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):  # nan, inf
        raise argparse.ArgumentTypeError(f"{what}, not {text}")
    return value


def positive_seconds(text: str) -> float:
    """argparse ``type`` for a duration in seconds greater than 0."""
    value = _number(text, float, "seconds")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"seconds greater than 0, not {text}")
    return value


def seconds_or_zero(text: str) -> float:
    """argparse ``type`` for a duration in seconds, 0 or more."""
    value = _number(text, float, "seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"seconds, 0 or more, not {text}")
    return value


def count_between(low: int, high: int):
    """argparse ``type`` for a whole number from ``low`` to ``high``."""
    def count(text: str) -> int:
        value = _number(text, int, "a whole number")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"a whole number from {low} to {high}, not {text}")
        return value
    count.__name__ = "count"  # argparse names the type in its message
    return count


# The one --window: seconds the first sample watches for progress, one default per command.
WINDOW_DEFAULTS = {"snapshot": 3.0, "attach": 2.0, "dump": 2.0, "watch": 1.0, "run": 1.0}


def add_window(parser: argparse.ArgumentParser, command: str, hidden: bool = False) -> None:
    """``--window S`` with ``command``'s default (0: one sample, no progress watched)."""
    default = WINDOW_DEFAULTS[command]
    parser.add_argument("--window", type=seconds_or_zero, default=default, metavar="S",
                        help=argparse.SUPPRESS if hidden else
                        f"seconds to watch for progress before the verdict (0: one sample; default: {default:g})")


def add_stuck_after(parser: argparse.ArgumentParser) -> None:
    """``--stuck-after S``: a fixed threshold instead of each rank's own rhythm."""
    parser.add_argument("--stuck-after", type=positive_seconds, default=None, metavar="S",
                        help="call a rank stuck after S seconds without progress (default: each rank's own "
                             "rhythm: the window, 2x its longest recent quiet stretch, or 3 step periods)")


def add_ras(parser: argparse.ArgumentParser) -> None:
    """``--ras auto|always|never``: whether NCCL RAS is asked (sets ``TRAINWATCH_RAS`` for this run)."""
    parser.add_argument("--ras", choices=("auto", "always", "never"), default=None,
                        help="ask the job's NCCL RAS service: auto (default) skips NCCL versions where a query is "
                             "known to crash the job; always asks anyway; never does not ask (env TRAINWATCH_RAS)")

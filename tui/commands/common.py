"""Argument checks shared by the commands: PIDs, a terminal for the live view, output folders."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ...probes import OutputError, UsageError

PID_MAX = 2**31 - 1  # pid_t; larger numbers are no PID at all


def pid_arg(text: str) -> int:
    """argparse ``type`` for a PID: a positive whole number (``-1``, ``0`` and ``abc`` are refused)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a PID is a positive whole number, not {text!r}") from None
    if not 0 < value <= PID_MAX:
        raise argparse.ArgumentTypeError(f"a PID is a positive whole number, not {text}")
    return value


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def require_terminal(command: str, instead: str) -> None:
    """The live view draws on a terminal; redirected to a file it would write escape codes."""
    if not stdout_is_terminal():
        raise UsageError(f"{command} shows a live screen and needs a terminal, but stdout is not one "
                         "(redirected to a file or a pipe)", instead)


def writable_dir(path: Path, option: str = "--out") -> Path:
    """``path`` as an absolute directory that exists (created if needed) and can be written."""
    path = path.expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {path}: {exc.strerror or exc}", f"pass a writable {option} DIR") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write into {path}", f"pass a writable {option} DIR")
    return path


def positive_seconds(text: str) -> float:
    """argparse ``type`` for a duration in seconds greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"seconds greater than 0, not {text}")
    return value


def add_stuck_after(parser: argparse.ArgumentParser) -> None:
    """``--stuck-after S``: a fixed threshold instead of each rank's own rhythm."""
    parser.add_argument("--stuck-after", type=positive_seconds, default=None, metavar="S",
                        help="call a rank stuck after S seconds without progress (default: each rank's own "
                             "rhythm: the window, 2x its longest recent quiet stretch, or 3 step periods)")

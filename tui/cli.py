"""The ``trainwatch`` command line: parses arguments and hands off to one command module."""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from ..probes import TrainwatchError
from .commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainwatch",
        description="See which rank of a distributed training job is stuck where, and why.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"trainwatch.tui.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TrainwatchError as exc:
        print(f"trainwatch: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("trainwatch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES):
            print(f"trainwatch: cannot write: {exc.strerror}: {exc.filename or ''}", file=sys.stderr)
            return 8
        raise


if __name__ == "__main__":
    sys.exit(main())

"""The ``trainwatch`` command line: parses arguments and hands off to one command module."""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import os
import sys
from typing import NoReturn

from ..probes import TrainwatchError
from . import hangup
from .commands import COMMANDS


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error said in one line and where to read more, by the parser of the
    command it concerns (``trainwatch snapshot: …`` then ``try 'trainwatch snapshot --help'``);
    the full usage is what ``--help`` is for."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\ntry '{self.prog} --help'\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` the one command about to run: importing every
    command module costs start-up time that a one-shot `snapshot` should not pay."""
    parser = Parser(
        prog="trainwatch",
        description="See which rank of a distributed training job is stuck where, and why.",
    )
    parser.add_argument("--version", action=VersionAction, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"trainwatch.tui.commands.{name}").register(sub)
    return parser


class VersionAction(argparse.Action):
    """``--version``: the package metadata is read only when asked (reading it costs a start-up)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        sys.stdout.write(f"trainwatch {version()}\n")
        parser.exit()


def version() -> str:
    """The installed package's version (its metadata), or ``unknown`` when run from a bare tree."""
    import importlib.metadata

    try:
        return importlib.metadata.version("trainwatch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def command_list(parser: argparse.ArgumentParser) -> str:
    """Usage, then one line per command: what ``trainwatch`` alone prints."""
    sub = _subparsers(parser)
    width = max(len(choice.dest) for choice in sub._choices_actions)
    lines = [parser.format_usage().rstrip(), "", "commands:"]
    lines += [f"  {choice.dest:<{width}}  {choice.help}" for choice in sub._choices_actions]
    lines += ["", "`trainwatch COMMAND --help` for a command's options; `trainwatch --version`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    if not argv:
        sys.stderr.write(command_list(parser))
        return 2
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the command's own parser: its --help is the one that helps
            command = _subparsers(parser).choices.get(args.command, parser)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command in PID_OR_K8S and args.pid is None and not getattr(args, "k8s", None):
            _subparsers(parser).choices[args.command].error("the following arguments are required: pid "
                                                            "(or --k8s SELECTOR: a job's pods, from any machine)")
    except SystemExit as exc:  # argparse's own exit: a usage error (2), or --help/--version (0)
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "ras", None):
        os.environ["TRAINWATCH_RAS"] = args.ras  # read by the NCCL RAS source, here and in agents started from here
    if args.command not in OWN_SIGNALS:
        hangup.install()
    try:
        return int(args.func(args) or 0)
    except TrainwatchError as exc:
        print(f"trainwatch: {exc}", file=sys.stderr)
        return exc.exit_code
    except hangup.Hangup:  # the terminal is gone: nobody to tell; what we started was stopped on the way out
        return hangup.EXIT_HANGUP
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


# Commands whose PID may be left out only for --k8s (the job is in its pods, none of it here).
PID_OR_K8S = frozenset({"attach", "watch"})
# Commands that handle SIGHUP themselves: `run` passes it on to the job it started, as a launcher
# does; an agent or relay stops on it (their ssh or srun went away).
OWN_SIGNALS = frozenset({"run", "agent", "relay"})
# One-shot commands that write only to stdout/stderr: once their answer is out, the process ends
# without the interpreter's teardown (module and garbage collection: ~20 ms of a `snapshot`).
QUICK_EXIT = frozenset({"snapshot"})
# Their start-up creates some 200,000 objects, nearly none in cycles: the collector's default
# threshold (700) walks them a few hundred times, ~10 ms of a `snapshot`. It still runs, rarely.
QUICK_GC_THRESHOLD = 50_000


def entry() -> None:
    """The ``trainwatch`` program: :func:`main`, then exit with its status."""
    argv = sys.argv[1:]
    if argv and argv[0] in QUICK_EXIT:
        gc.set_threshold(QUICK_GC_THRESHOLD, *gc.get_threshold()[1:])
    code = main(argv)
    if argv and argv[0] in QUICK_EXIT:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            code = 141
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()

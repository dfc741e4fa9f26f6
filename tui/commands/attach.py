"""`trainwatch attach PID`: the live monitor on a running job (never signals the job)."""

from __future__ import annotations

import argparse

from trainwatch.probes.errors import TrainwatchError
from trainwatch.tui.commands.snapshot import add_remote, wrap_remote


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("attach", help="live view of a running job: which rank is stuck where, and why")
    parser.add_argument("pid", type=int, help="launcher (torchrun, ...), a rank, or any ancestor of the job")
    parser.add_argument("--interval", type=float, default=2.0, metavar="S",
                        help="seconds between samples (default: 2; + and - change it live)")
    parser.add_argument("--window", type=float, default=2.0, metavar="S",
                        help="seconds the first sample watches for progress (default: 2)")
    add_remote(parser)
    parser.set_defaults(func=run)


def check_interval(value: float) -> float:
    if not value > 0:
        raise TrainwatchError(f"--interval must be more than 0 seconds (got {value:g})")
    return value


def run(args: argparse.Namespace) -> int:
    from trainwatch.probes.live import open_source

    interval = check_interval(args.interval)
    source = open_source(args.pid, window=max(0.0, args.window))  # bad PIDs fail here, before the screen
    try:
        feed = wrap_remote(args, source, wait_s=interval)  # a slow node never delays a refresh
        from trainwatch.tui.app import TrainwatchApp
        TrainwatchApp(feed, interval=interval, title=f"trainwatch {args.pid}").run()
    finally:
        source.close()
    return 0

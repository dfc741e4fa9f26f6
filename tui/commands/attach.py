"""`trainwatch attach PID`: the live monitor on a running job (never signals the job)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_ras, add_stuck_after, add_window, pid_arg, positive_seconds, require_terminal, writable_dir
from .snapshot import add_remote, wrap_remote


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("attach", help="live view of a running job: which rank is stuck where, and why")
    parser.add_argument("pid", type=pid_arg, help="launcher (torchrun, ...), a rank, or any ancestor of the job")
    parser.add_argument("--interval", type=positive_seconds, default=2.0, metavar="S",
                        help="seconds between samples (default: 2; + and - change it live)")
    add_window(parser, "attach")
    add_stuck_after(parser)
    add_ras(parser)
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where `d` writes evidence bundles (default: the current directory)")
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...probes import open_source

    require_terminal("attach", "use `trainwatch snapshot PID` for one verdict, "
                                          "or `trainwatch watch PID` for a log of events")
    interval = args.interval
    out = writable_dir(args.out or Path.cwd())
    # Bad PIDs fail here, before the screen.
    source = open_source(args.pid, window=args.window, stuck_after=args.stuck_after)
    try:
        source = wrap_remote(args, source, wait_s=interval, stream_interval=interval)  # one agent per node
        from ..app import TrainwatchApp
        app = TrainwatchApp(source, interval=interval, title=f"trainwatch {args.pid}", dump_dir=out)
        app.run()
    finally:
        source.close()  # the multi-node source also ends its ssh/srun/kubectl calls and closes the local one
    for path in app.dumps:
        print(f"trainwatch: evidence bundle written to {path}")
    return 0

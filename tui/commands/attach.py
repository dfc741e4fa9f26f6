"""`trainwatch attach PID`: the live monitor on a running job (never signals the job)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...probes import UsageError
from .common import add_ras, add_stuck_after, add_window, pid_arg, positive_seconds, require_terminal, writable_dir
from .snapshot import add_remote, wrap_remote


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("attach", help="live view of a running job: which rank is stuck where, and why")
    parser.add_argument("pid", type=pid_arg, nargs="?",
                        help="launcher (torchrun, ...), a rank, or any ancestor of the job (none with --k8s: its pods)")
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
    from ..remote_args import pods_only, pods_source

    interval = args.interval
    out = writable_dir(args.out or Path.cwd())
    if args.pid is None and not pods_only(args):
        raise UsageError("give a PID (or --k8s SELECTOR from any machine with kubectl)",
                         "e.g. `trainwatch attach $(pgrep -f torchrun | head -1)`")
    # Bad PIDs (and pods Kubernetes will not list) fail here, before the screen.
    if pods_only(args):
        source = pods_source(args, wait_s=interval, stream_interval=interval)
    else:
        source = open_source(args.pid, window=args.window, stuck_after=args.stuck_after)
    try:
        if not pods_only(args):
            source = wrap_remote(args, source, wait_s=interval, stream_interval=interval)  # one agent per node
        from ..app import TrainwatchApp
        title = f"trainwatch {args.pid}" if args.pid is not None else f"trainwatch --k8s {args.k8s}"
        app = TrainwatchApp(source, interval=interval, title=title, dump_dir=out)
        app.run()
    finally:
        source.close()  # the multi-node source also ends its ssh/srun/kubectl calls and closes the local one
    for path in app.dumps:
        print(f"trainwatch: evidence bundle written to {path}")
    return 0

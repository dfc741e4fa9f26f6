"""`trainwatch watch PID`: headless watching for batch jobs; bundles evidence when things go wrong."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...probes import OutputError, UsageError, Watcher, open_source
from .common import add_stuck_after, pid_arg
from .snapshot import add_remote, wrap_remote

EPILOG = """\
One line per event on stdout. Exit status:
  0   the job ended and no problem was seen
  10  a hang, straggler, mismatch or rendezvous problem was seen (and bundled)
  11  a rank crashed (crash records under OUT/crashes, and a 'crashed' bundle)
  1-8 trainwatch itself could not watch (2 bad arguments, 3 no such PID, 4 not a job,
      5 permissions, ...: see `Exit status` in the README)
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "watch", help="watch a job headless and write evidence bundles on hangs and crashes",
        description="Watch a running job without a screen (batch jobs, SLURM scripts).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pid", type=pid_arg, help="PID of the launcher, a rank, or `trainwatch run`")
    parser.add_argument("--out", type=Path, default=None,
                        help="where bundles and crash records go (default: <run dir>/watch or ./trainwatch-watch-PID)")
    parser.add_argument("--dump-on", default="hang,crash", help="comma list of: hang, crash (default: both)")
    parser.add_argument("--hang-after", type=float, default=300.0,
                        help="seconds a problem verdict must persist before a bundle is written (default 300)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between full samples (default 5)")
    parser.add_argument("--window", type=float, default=1.0, help=argparse.SUPPRESS)
    add_stuck_after(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    dump_on = frozenset(part.strip() for part in args.dump_on.split(",") if part.strip())
    unknown = dump_on - {"hang", "crash"}
    if unknown:
        raise UsageError(f"unknown --dump-on value: {', '.join(sorted(unknown))}", "use hang, crash or both")
    if args.interval <= 0 or args.hang_after < 0:
        raise UsageError("--interval must be positive and --hang-after not negative")
    local = open_source(args.pid, args.window, catch_crashes=False, stuck_after=args.stuck_after)  # the watcher runs its own catcher
    job = local.job  # found from any PID, `trainwatch run`'s own included
    run_dir = Path(job.run_dir) if job.run_dir else None
    source = local
    try:
        source = wrap_remote(args, local, wait_s=args.interval)
        out = args.out or (run_dir / "watch" if run_dir else Path.cwd() / f"trainwatch-watch-{args.pid}")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc.strerror or exc}", "pass a writable --out DIR") from None
        print(f"watching pid {args.pid}; evidence goes to {out}", flush=True)
        return Watcher(job.root_pid, out, dump_on=dump_on, hang_after=args.hang_after,
                               interval=args.interval, window=args.window,
                               emit=lambda line: print(line, flush=True), source=source, run_dir=run_dir).run()
    finally:
        source.close()

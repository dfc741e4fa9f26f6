"""`trainwatch watch PID`: headless watching for batch jobs; bundles evidence when things go wrong."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainwatch.tui.commands.snapshot import add_remote, wrap_remote

import psutil

from trainwatch.probes import rundir, watcher
from trainwatch.probes.errors import NoSuchProcess, OutputError, TrainwatchError

EPILOG = """\
One line per event on stdout. Exit status:
  0   the job ended and no problem was seen
  10  a hang, straggler, mismatch or rendezvous problem was seen (and bundled)
  11  a rank crashed (crash records under OUT/crashes, and a 'crashed' bundle)
  3-8 trainwatch itself could not watch (no such PID, not a job, permissions, ...)
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "watch", help="watch a job headless and write evidence bundles on hangs and crashes",
        description="Watch a running job without a screen (batch jobs, SLURM scripts).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pid", type=int, help="PID of the launcher, a rank, or `trainwatch run`")
    parser.add_argument("--out", type=Path, default=None,
                        help="where bundles and crash records go (default: <run dir>/watch or ./trainwatch-watch-PID)")
    parser.add_argument("--dump-on", default="hang,crash", help="comma list of: hang, crash (default: both)")
    parser.add_argument("--hang-after", type=float, default=300.0,
                        help="seconds a problem verdict must persist before a bundle is written (default 300)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between full samples (default 5)")
    parser.add_argument("--window", type=float, default=1.0, help=argparse.SUPPRESS)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    dump_on = frozenset(part.strip() for part in args.dump_on.split(",") if part.strip())
    unknown = dump_on - {"hang", "crash"}
    if unknown:
        raise TrainwatchError(f"unknown --dump-on value: {', '.join(sorted(unknown))}", "use hang, crash or both")
    if args.interval <= 0 or args.hang_after < 0:
        raise TrainwatchError("--interval must be positive and --hang-after not negative")
    if not psutil.pid_exists(args.pid):
        raise NoSuchProcess(f"no process with PID {args.pid}", "check the PID with `ps -ef | grep python`")
    run_dir = watcher.find_run_dir(args.pid)
    pid = _job_pid(args.pid, run_dir)
    source = watcher.open_live_source(pid, args.window)
    if source is not None:
        source = wrap_remote(args, source, wait_s=args.interval)
    if source is None:
        print("trainwatch: live sampling is not available in this install; watching for crashes only",
              file=sys.stderr)
    out = args.out or (run_dir / "watch" if run_dir else Path.cwd() / f"trainwatch-watch-{args.pid}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {exc.strerror or exc}", "pass a writable --out DIR") from None

    def emit(line: str) -> None:
        print(line, flush=True)

    emit(f"watching pid {args.pid}; evidence goes to {out}")
    return watcher.Watcher(pid, out, dump_on=dump_on, hang_after=args.hang_after,
                           interval=args.interval, window=args.window, emit=emit, source=source,
                           run_dir=run_dir).run()


def _job_pid(pid: int, run_dir: Path | None) -> int:
    """Given `trainwatch run`'s own PID, sample the command it started instead."""
    record = rundir.read_json(rundir.run_json(run_dir)) if run_dir else None
    if record and record.get("trainwatch_pid") == pid and isinstance(record.get("pid"), int):
        return record["pid"]
    return pid

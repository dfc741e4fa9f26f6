"""`trainwatch watch PID`: headless watching for batch jobs; bundles evidence when things go wrong."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...probes import PROBLEM_VERDICTS, VERDICTS, OutputError, UsageError, check_out_dir
from .common import add_ras, add_stuck_after, add_window, pid_arg, positive_seconds
from .event_command import EventCommand, print_json
from .snapshot import add_remote, wrap_remote

if TYPE_CHECKING:
    from ...probes import WatchEvent

STARTED_POLL_S = 0.5  # how often a `trainwatch run` whose job has not started is looked at again

EPILOG = """\
One line per event on stdout (--json: one JSON object per line). Exit status:
  0   the job ended and no problem was seen
  10  a hang, straggler, mismatch or rendezvous problem was seen (and bundled)
  11  a rank crashed (crash records under OUT/crashes, and a 'crashed' bundle)
  1-8 trainwatch itself could not watch (2 bad arguments, 3 no such PID, 4 not a job,
      5 permissions, ...: see `Exit status` in docs/cli.md)

--on-event CMD runs through /bin/sh on each problem that persisted --hang-after and on
the first crash, with TRAINWATCH_EVENT (problem|crashed), TRAINWATCH_VERDICT,
TRAINWATCH_CULPRITS (e.g. 2,3), TRAINWATCH_SUMMARY, TRAINWATCH_BUNDLE (may be empty),
TRAINWATCH_PID and TRAINWATCH_HOST set. It is stopped after --on-event-timeout.
"""

DUMP_ON_WORDS = tuple(kind for kind in VERDICTS if kind in PROBLEM_VERDICTS)


def dump_on_kinds(text: str) -> frozenset[str]:
    """argparse ``type`` for --dump-on: verdict kinds (snapshot.py's words), or ``all``/``none``."""
    words = {part.strip() for part in text.split(",") if part.strip()}
    if words == {"all"}:
        return frozenset(PROBLEM_VERDICTS)
    if words == {"none"}:
        return frozenset()
    unknown = words - set(DUMP_ON_WORDS)
    if unknown or not words:
        raise argparse.ArgumentTypeError(f"unknown value: {', '.join(sorted(unknown)) or repr(text)} "
                                         f"(use all, none, or a comma list of: {', '.join(DUMP_ON_WORDS)})")
    return frozenset(words)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "watch", help="watch a job headless and write evidence bundles on hangs and crashes",
        description="Watch a running job without a screen (batch jobs, SLURM scripts).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pid", type=pid_arg, nargs="?",
                        help="PID of the launcher, a rank, or `trainwatch run` (none with --k8s: its pods)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where bundles and crash records go (default: <run dir>/watch or ./trainwatch-watch-PID)")
    parser.add_argument("--dump-on", type=dump_on_kinds, default=frozenset(PROBLEM_VERDICTS), metavar="KINDS",
                        help=f"verdicts that get a bundle: all (default), none, or a comma list of "
                             f"{', '.join(DUMP_ON_WORDS)}")
    parser.add_argument("--hang-after", type=positive_seconds, default=300.0, metavar="S",
                        help="seconds a problem verdict must persist before a bundle is written (default 300)")
    parser.add_argument("--interval", type=positive_seconds, default=5.0, metavar="S",
                        help="seconds between full samples (default 5)")
    add_window(parser, "watch", hidden=True)
    add_stuck_after(parser)
    add_ras(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per event on stdout (log shippers)")
    parser.add_argument("--on-event", metavar="CMD",
                        help="shell command run on each problem and crash (details in TRAINWATCH_* variables)")
    parser.add_argument("--on-event-timeout", type=positive_seconds, default=30.0, metavar="S",
                        help="stop the --on-event command after S seconds (default 30)")
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: building the parser must stay cheap (and must not bind the source opener)
    from ...probes import open_source
    from ..remote_args import pods_only, pods_source

    if args.out is not None:  # before the job is even looked at: a bad --out fails at once, saying why
        check_out_dir(args.out, action="write evidence into")
    if pods_only(args):  # a login box: the job is in its pods, each read by its agent
        name = args.k8s.replace("/", "-").replace("=", "-")
        return _watch(args, pods_source(args, stream_interval=args.interval), None,
                      f"watching the pods of --k8s {args.k8s}", Path.cwd() / f"trainwatch-watch-{name}")
    if args.pid is None:
        raise UsageError("give a PID (or --k8s SELECTOR from any machine with kubectl)",
                         "e.g. `trainwatch watch $(pgrep -f torchrun | head -1)`")
    local = _open_once_started(args, open_source)
    job = local.job  # found from any PID, `trainwatch run`'s own included
    run_dir = Path(job.run_dir) if job.run_dir else None
    try:
        source = wrap_remote(args, local, stream_interval=args.interval)  # one agent per node
    except BaseException:
        local.close()
        raise
    return _watch(args, source, job.root_pid, f"watching pid {args.pid}",
                  run_dir / "watch" if run_dir else Path.cwd() / f"trainwatch-watch-{args.pid}", run_dir)


def _open_once_started(args: argparse.Namespace, open_source):
    """The job's source; a `trainwatch run` whose job has not started yet is waited for (as long
    as it lives: its end is then the error), not judged as a job of its own."""
    from ...probes import JobNotStarted

    said = False
    while True:
        try:  # the watcher runs its own crash catcher
            return open_source(args.pid, args.window, catch_crashes=False, stuck_after=args.stuck_after)
        except JobNotStarted as exc:
            if not said:
                print(f"trainwatch: {exc.message}; waiting for it", file=sys.stderr, flush=True)
                said = True
            time.sleep(STARTED_POLL_S)


def _watch(args: argparse.Namespace, source, pid: int | None, watching: str, default_out: Path,
           run_dir: Path | None = None) -> int:
    """Watch ``source`` (closed at the end) until the job ends; ``pid``: the job's root here (None:
    no rank of it here, its nodes' agents say everything)."""
    from ...probes import Watcher, WatchEvent

    host = socket.gethostname()
    hook = EventCommand(args.on_event, pid or 0, args.on_event_timeout, host) if args.on_event else None
    out = args.out or default_out
    made: Path | None = None
    try:
        made = _first_missing(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc.strerror or exc}", "pass a writable --out DIR") from None

        def on_event(event: WatchEvent) -> None:
            if args.json:
                print_json(event, pid or 0, host)
            if hook is not None:
                hook.fire(event)

        if args.json:
            print_json(WatchEvent("watching", f"{watching}; evidence goes to {out}"), pid or 0, host)
        else:
            print(f"{watching}; evidence goes to {out}", flush=True)
        emit = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
        return Watcher(pid, out, dump_on=args.dump_on, hang_after=args.hang_after, interval=args.interval,
                       window=args.window, emit=emit, source=source, run_dir=run_dir, on_event=on_event).run()
    finally:
        source.close()
        if hook is not None:
            hook.close()
        if made is not None:
            _remove_if_empty(made, out)


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (what mkdir will create)."""
    path = path.absolute()
    missing = None
    while not path.exists():
        missing = path
        if path.parent == path:
            break
        path = path.parent
    return missing


def _remove_if_empty(top: Path, out: Path | None) -> None:
    """Take back the folders watch created when nothing was written into them."""
    if out is None:
        return
    path = out.absolute()
    while True:
        try:
            path.rmdir()  # only succeeds when empty
        except OSError:
            return  # not empty: it holds evidence and stays
        if path == top or path.parent == path:
            return
        path = path.parent

"""`trainwatch dump PID`: write a redacted evidence bundle about the job and print its path."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from ...probes import PARTIAL_EXIT, UsageError, check_out_dir
from .common import add_ras, add_window, pid_arg
from .snapshot import add_remote, resolve_pid, wrap_remote


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("dump", help="write an evidence bundle (stacks, Flight Recorder, /proc, logs)")
    parser.add_argument("pid", type=pid_arg, nargs="?", help="launcher, rank, or any ancestor of the job")
    parser.add_argument("--match", metavar="ADDR:PORT", help="find the local job by MASTER_ADDR:MASTER_PORT")
    parser.add_argument("--match-job-id", metavar="ID", help="find the local job by TORCHELASTIC_RUN_ID/SLURM_JOB_ID")
    parser.add_argument("--out", type=Path, default=None, help="folder to write the bundle in (default: this one)")
    parser.add_argument("--tar", action="store_true", help="write one .tar.gz instead of a directory")
    parser.add_argument("--no-redact", action="store_true",
                        help="write environment values and secrets as they are (do not share the result)")
    parser.add_argument("--no-native", action="store_true", help="skip native (C/C++) stacks: faster")
    parser.add_argument("--signal", metavar="SIG",
                        help="send SIG (e.g. SIGUSR1) for faulthandler traces when the rank catches it; "
                             "only if you know the job registered faulthandler on it")
    add_window(parser, "dump")
    add_ras(parser)
    parser.add_argument("--reason", help="one line saying why this was dumped (goes into summary.md)")
    add_remote(parser)
    parser.set_defaults(func=run)


def parse_signal(name: str | None) -> int | None:
    if name is None:
        return None
    text = name.upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        raise UsageError(f"unknown signal {name!r}", "use a name like SIGUSR1 or a number") from None


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds write_bundle, which removes its partial directory


def run(args: argparse.Namespace) -> int:
    from ...probes import write_bundle
    from ...probes import open_source

    fault_signal = parse_signal(args.signal)
    out = check_out_dir(args.out or Path.cwd())  # before any sampling: a bad --out fails at once, saying why
    if args.no_redact:
        print("trainwatch: --no-redact: environment values, tokens and passwords are written UNMASKED; "
              "do not share this bundle", file=sys.stderr)
    signal.signal(signal.SIGTERM, _terminate)
    from ..remote_args import pods_only, pods_source

    if pods_only(args):  # a login box: the job is in its pods, each writes its own bundle
        pid, source = None, pods_source(args)
    else:
        pid = resolve_pid(args)
        source = open_source(pid, window=args.window)
    try:
        if pid is not None:
            source = wrap_remote(args, source)
        snapshot = source.poll()
        path = write_bundle(pid, snapshot, out, tar=args.tar, redact=not args.no_redact,
                            reason=args.reason, native=not args.no_native, fault_signal=fault_signal)
        if not args.tar:
            for note in source.collect_bundles(path):  # other nodes' bundles land in <bundle>/hosts/<node>/
                print(f"trainwatch: {note}", file=sys.stderr)
    finally:
        source.close()
    print(path)
    return PARTIAL_EXIT if any(h.error for h in snapshot.hosts) else 0

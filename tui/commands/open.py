"""`trainwatch open PATH…`: an evidence bundle, or whatever a dead job left, in the same screens, read-only."""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from .common import require_terminal

HELP = """\
PATH is a bundle written by `trainwatch dump` (a directory or .tar.gz), or what a dead job left:
folders and files of Flight Recorder dumps (NCCL's nccl_trace_rank_N pickles, JSON dumps), the
job's logs (launcher output, slurm-*.out, --log-dir files), torchelastic error files, or a
`trainwatch run` directory. Those are judged like a live job: the kind, the culprit rank, the
collective, the evidence, and what is missing.
"""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("open", help="open a bundle, or judge what a dead job left (dumps, logs, run dir)",
                            description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", type=Path, nargs="+", metavar="PATH", help="a bundle, or a dead job's files")
    parser.add_argument("--summary", action="store_true", help="print summary.md instead of opening the UI")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON instead of opening the UI")
    parser.set_defaults(func=run)


def is_bundle(paths: list[Path]) -> bool:
    """One bundle: a directory with bundle.json, or an archive (tar)."""
    if len(paths) != 1:
        return False
    path = paths[0]
    if path.is_dir():
        return (path / "bundle.json").is_file()
    try:
        return path.is_file() and tarfile.is_tarfile(path)
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    if is_bundle(args.paths):
        from ...probes import BundleSource

        source = BundleSource(args.paths[0])
    else:
        from ...probes import PostMortemSource

        source = PostMortemSource(args.paths)
    try:
        if args.json:
            sys.stdout.write(source.poll().to_json() + "\n")
            return 0
        if args.summary:
            sys.stdout.write(source.summary())
            return 0
        require_terminal("open", "use `trainwatch open PATH --summary` (or --json) to print it")
        from ..app import TrainwatchApp

        name = args.paths[0].name if len(args.paths) == 1 else f"{len(args.paths)} paths"
        TrainwatchApp(source, live=False, title=f"trainwatch: {name}").run()
        return 0
    finally:
        source.close()

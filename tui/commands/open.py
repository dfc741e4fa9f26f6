"""`trainwatch open BUNDLE`: look at an evidence bundle in the same screens, read-only."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import require_terminal


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("open", help="open an evidence bundle (directory or .tar.gz) read-only")
    parser.add_argument("bundle", type=Path, help="a bundle written by `trainwatch dump`")
    parser.add_argument("--summary", action="store_true", help="print summary.md instead of opening the UI")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...probes import BundleSource

    source = BundleSource(args.bundle)
    try:
        if args.summary:
            sys.stdout.write(source.summary())
            return 0
        require_terminal("open", "use `trainwatch open BUNDLE --summary` to print summary.md")
        from ..app import TrainwatchApp

        TrainwatchApp(source, live=False, title=f"trainwatch: {args.bundle.name}").run()
        return 0
    finally:
        source.close()

"""`trainwatch open` (not built yet)."""

from __future__ import annotations

import argparse

from trainwatch.probes.errors import TrainwatchError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("open", help="(not available yet)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise TrainwatchError("'trainwatch open' is not available in this version")

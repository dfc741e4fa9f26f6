"""`trainwatch agent --match ADDR:PORT`: the node agent a viewer starts on each other node (hidden).

It keeps sampling this node's ranks of the job and writes one compact JSON line per poll to stdout
(the node wire format, probes/remote/wire.py) until stdin closes or its parent goes away.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any

from .common import add_ras, add_stuck_after, positive_seconds
from .snapshot import COLLECTIVE_WAIT_S, resolve_pid


def register(sub: argparse._SubParsersAction) -> None:
    # No help=: argparse then leaves the command out of `trainwatch --help` (it is not for people).
    parser = sub.add_parser("agent", description="Node agent started by a trainwatch viewer on another node.")
    parser.add_argument("pid", type=int, nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--match", metavar="ADDR:PORT", help="find the local job by MASTER_ADDR:MASTER_PORT")
    parser.add_argument("--match-job-id", metavar="ID", help="find the local job by TORCHELASTIC_RUN_ID/SLURM_JOB_ID")
    parser.add_argument("--match-any", action="store_true",
                        help="the one training job on this node, whatever its PIDs (a pod of a --k8s job)")
    parser.add_argument("--window", type=float, default=2.0, help="seconds the first poll watches for progress")
    parser.add_argument("--samples", type=int, default=3, help="stack samples per rank within the first window")
    add_stuck_after(parser)
    add_ras(parser)
    parser.add_argument("--interval", type=positive_seconds, default=2.0, help="seconds between lines")
    parser.add_argument("--once", action="store_true", help="one line, then exit (its status: the probe's)")
    parser.set_defaults(func=run)


def _bundle(source: Any, snapshot: Any, out_dir: Path) -> Path:
    """This node's bundle, as ``trainwatch dump`` writes it, in one .tar.gz for the viewer
    (``source``: the agent's LocalSource; ``snapshot``: its last poll)."""
    from ...probes import write_bundle

    return write_bundle(snapshot.job.pid, snapshot, out_dir, tar=True, familiar=source.remembered_places())


def run(args: argparse.Namespace) -> int:
    from ...probes import LocalSource, run_agent

    def open_source(answer_now: threading.Event) -> LocalSource:
        return LocalSource(resolve_pid(args), window=args.window, samples=args.samples, stuck_after=args.stuck_after,
                           collective_wait=COLLECTIVE_WAIT_S if args.once else 0.0, answer_now=answer_now)

    code = run_agent(open_source, args.interval, once=args.once, write_bundle=_bundle)
    if args.once:
        return code
    # The stdin reader may still block in read(): leave now rather than wait at interpreter shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

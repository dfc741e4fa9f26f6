"""`trainwatch snapshot PID`: one snapshot of the job, as a table or as JSON."""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ...probes import PARTIAL_EXIT, NotAJob, UsageError
from .common import add_ras, add_stuck_after, add_window, count_between, pid_arg

if TYPE_CHECKING:
    from ...probes import LocalSource

COLLECTIVE_WAIT_S = 2.0  # the ranks' Flight Recorder, fetched while the window is sampled


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("snapshot", help="sample every rank once over a window and print the verdict")
    parser.add_argument("pid", type=pid_arg, nargs="?", help="launcher, rank, or any ancestor of the job")
    add_window(parser, "snapshot")
    add_stuck_after(parser)
    add_ras(parser)
    parser.add_argument("--samples", type=count_between(1, 100), default=3,
                        help="stack samples per rank within the window (1-100; default: 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON document (the public snapshot schema)")
    parser.add_argument("--wide", action="store_true",
                        help="print every column of the table, however wide (default: fit the terminal, "
                             "keeping rank, state, phase, op and where)")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--match", metavar="ADDR:PORT", help="find the local job by MASTER_ADDR:MASTER_PORT")
    parser.add_argument("--match-job-id", metavar="ID", help="find the local job by TORCHELASTIC_RUN_ID/SLURM_JOB_ID")
    add_remote(parser)
    parser.set_defaults(func=run)


def wants_remote(args: argparse.Namespace) -> bool:
    from ..remote_args import wants_remote as wanted
    return wanted(args)


def add_remote(parser: argparse.ArgumentParser) -> None:
    from ..remote_args import add_remote_arguments
    add_remote_arguments(parser)


def resolve_pid(args: argparse.Namespace) -> int:
    """The PID to start from: given, or found by --match / --match-job-id (or the --slurm job's id)."""
    if args.pid is not None:
        return args.pid
    if getattr(args, "slurm", None) and not (args.match or args.match_job_id):
        from ..remote_args import slurm_job_here
        if args.slurm == "auto":  # no PID to read SLURM_JOB_ID from: this shell's job, or this node's
            args.slurm = slurm_job_here(args.remote_timeout)
        args.match_job_id = args.slurm  # ranks here, if any, and on every node: by SLURM_JOB_ID
    if getattr(args, "match", None) or getattr(args, "match_job_id", None):
        from ...probes import find_job_matching
        return find_job_matching(master=args.match, job_id=args.match_job_id).root_pid
    if getattr(args, "match_any", False):  # an agent in a pod: the one job there, whatever its PIDs
        from ...probes import find_only_job
        return find_only_job().root_pid
    raise UsageError("give a PID (or --match ADDR:PORT / --match-job-id ID, or --k8s SELECTOR from any machine "
                     "with kubectl)", "e.g. `trainwatch snapshot $(pgrep -f torchrun | head -1)`")


def run(args: argparse.Namespace) -> int:
    from ...probes import LocalSource, find_pyspy
    from ..remote_args import pods_only

    try:
        if pods_only(args):
            raise NotAJob("no PID: the job is in its pods")
        pid = resolve_pid(args)
    except NotAJob:
        if not ((args.match_job_id or pods_only(args)) and wants_remote(args)):
            raise
        snapshot = _other_nodes_only(args)  # a login node: the job runs only on the nodes named
    else:
        find_pyspy()  # fail early and clearly: without py-spy there is nothing to show
        source = LocalSource(pid, window=args.window, samples=args.samples, collective_wait=COLLECTIVE_WAIT_S,
                             stuck_after=args.stuck_after)
        try:
            native = _all_ranks(source) if args.native else frozenset()
            source = wrap_remote(args, source)
            snapshot = source.poll(native_for=native)
        finally:
            source.close()  # a multi-node source ends its remote calls and closes the local one
    if args.json:
        sys.stdout.write(snapshot.to_json() + "\n")
    else:
        from rich.console import Console

        from ..render import render_table, wide_width
        console = Console()
        if args.wide:  # every column, uncut: the terminal wraps what it cannot show
            console = Console(width=max(console.width, wide_width(snapshot)))
        console.print(render_table(snapshot, wide=args.wide))
    partial = any(h.error for h in snapshot.hosts)
    return PARTIAL_EXIT if partial else 0


def _other_nodes_only(args: argparse.Namespace):
    """No rank of the job here: ask the named nodes (or the --k8s job's pods) for the job, and merge."""
    from ..remote_args import wrap_source
    job = SimpleNamespace(master_addr=None, master_port=None, job_id=args.match_job_id, world_size=None,
                          ranks=(), launcher=None)
    source = wrap_source(args, None, job, window=args.window)
    if source is None:
        raise NotAJob(f"no job with id {args.match_job_id} here, and no other node to ask")
    try:
        return source.poll(native_for=frozenset())
    finally:
        source.close()


def _all_ranks(source: LocalSource) -> frozenset[int]:
    return frozenset(r.rank for r in source.job.ranks if r.rank is not None)


def wrap_remote(args: argparse.Namespace, source: LocalSource, **kwargs):
    """The local source, or a multi-node source when --hosts/--slurm/--k8s name other nodes."""
    from ..remote_args import wrap_source
    return wrap_source(args, source, source.job, **kwargs)

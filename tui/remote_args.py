"""Command-line options for jobs that span nodes, and the source that reads all of them.

``add_remote_arguments(parser)`` adds the options to snapshot/attach/dump/watch;
``wrap_source(args, local_source, job)`` returns the local source unchanged when no other node
was named, else a :class:`MultiNodeSource` over this node and the others.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
from typing import Any

from ..probes.errors import PARTIAL_EXIT, TrainwatchError
from .commands.common import count_between, positive_seconds
from ..probes.remote.hostlist import parse_hosts, read_hostfile, slurm_hostnames, slurm_job_nodelist, unique
from ..probes.remote.multinode import MultiNodeSource
from ..probes.remote.remote import (
    DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S, KubeRemote, Remote, SlurmRemote, SshRemote,
    kubectl_get_pods_argv, match_args, parse_pods,
)

__all__ = ["PARTIAL_EXIT", "add_remote_arguments", "wants_remote", "remotes_from_args", "wrap_source",
           "detect_slurm"]


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "other nodes", "read the job's ranks on other nodes too (each node runs `trainwatch snapshot --json`)")
    group.add_argument("--hosts", action="append", default=[], metavar="LIST",
                       help="other nodes, comma-separated; SLURM ranges work: node[01-04,07]")
    group.add_argument("--hostfile", metavar="FILE",
                       help="file of nodes: one per line, DeepSpeed/MPI 'host slots=N' and 'host:N' accepted")
    group.add_argument("--slurm", metavar="JOBID",
                       help="reach the nodes of this SLURM job with srun --overlap ('auto': the ranks' SLURM_JOB_ID)")
    group.add_argument("--k8s", metavar="SELECTOR",
                       help="reach the pods matching this label selector with kubectl exec")
    group.add_argument("--k8s-namespace", metavar="NS", help="namespace of the --k8s pods")
    group.add_argument("--k8s-container", metavar="NAME", help="container to exec into in each pod")
    group.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                       help="extra ssh option, e.g. Port=2222 (passed as -o OPT) or '-F ~/.ssh/cluster'; repeatable")
    group.add_argument("--remote-trainwatch", default="trainwatch", metavar="CMD",
                       help="command that runs trainwatch on the other nodes (default: trainwatch)")
    group.add_argument("--remote-timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S, metavar="S",
                       help=f"give up on a node after this many seconds (default: {DEFAULT_TIMEOUT_S:g})")
    group.add_argument("--remote-parallel", type=count_between(1, 1024), default=DEFAULT_PARALLEL, metavar="N",
                       help=f"ask at most this many nodes at once (default: {DEFAULT_PARALLEL})")


def wants_remote(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "hosts", None) or getattr(args, "hostfile", None)
                or getattr(args, "slurm", None) or getattr(args, "k8s", None))


def ssh_options(values: list[str]) -> tuple[str, ...]:
    """``Port=22`` -> ``-o Port=22``; values starting with '-' are passed as given (split like a shell)."""
    out: list[str] = []
    for value in values:
        out += shlex.split(value) if value.lstrip().startswith("-") else ["-o", value]
    return tuple(out)


def _this_node() -> set[str]:
    name = socket.gethostname()
    names = {name, name.split(".")[0], "localhost"}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names


def detect_slurm(job: Any) -> str | None:
    """SLURM_JOB_ID from the ranks' environment (JobProcesses), if the job runs under SLURM."""
    for rank in getattr(job, "ranks", ()) or ():
        job_id = (getattr(rank, "env", None) or {}).get("SLURM_JOB_ID")
        if job_id:
            return job_id
    return None


def _slurm_remotes(args: argparse.Namespace, job: Any) -> list[Remote]:
    job_id = detect_slurm(job) if args.slurm == "auto" else args.slurm
    if not job_id:
        raise TrainwatchError("--slurm auto: the job's ranks have no SLURM_JOB_ID", remedy="pass --slurm JOBID")
    if not shutil.which("srun"):
        raise TrainwatchError("--slurm needs srun, which is not installed here",
                              remedy="run trainwatch on a node of the SLURM cluster, or use --hosts (ssh)")
    local = _this_node()
    nodes = slurm_hostnames(slurm_job_nodelist(job_id, timeout=args.remote_timeout))
    return [SlurmRemote(name=n, job_id=job_id) for n in nodes if n not in local]


def list_pods(selector: str, namespace: str | None, timeout: float) -> list[str]:
    """Running pods matching ``selector`` (kubectl get pods -o json)."""
    try:
        done = subprocess.run(kubectl_get_pods_argv(selector, namespace), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise TrainwatchError("--k8s needs kubectl, which is not installed here") from exc
    except subprocess.TimeoutExpired as exc:
        raise TrainwatchError(f"kubectl get pods did not answer in {timeout:g}s") from exc
    if done.returncode != 0:
        raise TrainwatchError(f"kubectl get pods -l {selector}: {done.stderr.strip() or 'failed'}")
    try:
        pods = parse_pods(done.stdout)
    except ValueError as exc:
        raise TrainwatchError(str(exc)) from exc
    return [p.name for p in pods if p.phase == "Running"]


def _k8s_remotes(args: argparse.Namespace) -> list[Remote]:
    pods = list_pods(args.k8s, args.k8s_namespace, args.remote_timeout)
    if not pods:
        raise TrainwatchError(f"no running pod matches -l {args.k8s}")
    me = os.environ.get("HOSTNAME") or socket.gethostname()  # a pod's hostname is its name
    return [KubeRemote(name=p, namespace=args.k8s_namespace, container=args.k8s_container)
            for p in pods if p != me]


def remotes_from_args(args: argparse.Namespace, job: Any) -> list[Remote]:
    """The other nodes named on the command line, without this node."""
    remotes: list[Remote] = []
    hosts = parse_hosts(args.hosts or [])
    if args.hostfile:
        hosts = unique([*hosts, *read_hostfile(args.hostfile)])
    local = _this_node()
    options = ssh_options(args.ssh_option or [])
    remotes += [SshRemote(name=h, options=options, connect_timeout=max(1, int(min(args.remote_timeout, 10))))
                for h in hosts if h not in local]
    if args.slurm:
        remotes += _slurm_remotes(args, job)
    if args.k8s:
        remotes += _k8s_remotes(args)
    return remotes


def wrap_source(args: argparse.Namespace, local_source: Any, job: Any, *, wait_s: float | None = None,
                window: float | None = None) -> Any:
    """``local_source`` alone, or a MultiNodeSource over this node and the nodes named in ``args``.

    ``job`` is the local JobProcesses (or Job). ``wait_s``: how long one poll waits for slow
    nodes (live views pass their refresh interval; one-shot commands leave it at the timeout).
    Each node samples over ``window`` (default: ``args.window``) with ``args.samples`` samples.
    """
    if not wants_remote(args):
        return local_source
    remotes = remotes_from_args(args, job)
    if not remotes:
        return local_source
    try:
        match = match_args(job)
    except ValueError as exc:
        raise TrainwatchError(str(exc), remedy="other nodes find the job by MASTER_ADDR:MASTER_PORT") from exc
    if window is None:
        window = getattr(args, "window", None)
    samples = getattr(args, "samples", None)
    return MultiNodeSource(local_source, remotes, match=match, trainwatch=args.remote_trainwatch,
                           timeout=args.remote_timeout, wait_s=wait_s, parallel=args.remote_parallel,
                           window=window, world_size=getattr(job, "world_size", None),
                           extra_args=["--samples", str(samples)] if samples is not None else [])

"""Command-line options for jobs that span nodes, and the source that reads all of them.

``add_remote_arguments(parser)`` adds the options to snapshot/attach/dump/watch;
``wrap_source(args, local_source, job)`` returns the local source unchanged when no other node
was named, else a ``StreamSource`` over this node and the others (one node agent each).
"""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any

# Only what building the parser needs is imported here: the remote machinery loads when a command uses it.
from ..probes import DEFAULT_TIMEOUT_S, PARTIAL_EXIT, RELAY_FROM, NodeSpec
from .commands.common import count_between, positive_seconds

if TYPE_CHECKING:
    from ..probes import Remote

__all__ = ["PARTIAL_EXIT", "add_remote_arguments", "wants_remote", "remotes_from_args", "wrap_source",
           "detect_slurm", "slurm_job_here", "pods_only", "pods_source"]


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "other nodes", "read the job's ranks on other nodes too (each node runs a trainwatch node agent)")
    group.add_argument("--hosts", action="append", default=[], metavar="LIST",
                       help="other nodes, comma-separated; SLURM ranges work: node[01-04,07]")
    group.add_argument("--hostfile", metavar="FILE",
                       help="file of nodes: one per line, DeepSpeed/MPI 'host slots=N' and 'host:N' accepted")
    group.add_argument("--slurm", metavar="JOBID",
                       help="reach the nodes of this SLURM job with srun --overlap ('auto': the ranks' SLURM_JOB_ID)")
    group.add_argument("--ray", choices=["auto"],
                       help="reach the other nodes of a Ray Train run over ssh ('auto': the nodes its "
                            "controller's log places ranks on; run on the driver's node)")
    group.add_argument("--k8s", metavar="SELECTOR",
                       help="reach the pods matching this label selector with kubectl exec (or name the job: "
                            "pytorchjob/NAME, jobset/NAME, trainjob/NAME, job/NAME); without a PID, from any "
                            "machine with kubectl")
    group.add_argument("--k8s-namespace", metavar="NS", help="namespace of the --k8s pods")
    group.add_argument("--k8s-container", metavar="NAME", help="container to exec into in each pod")
    group.add_argument("--ssh-option", action="append", default=[], metavar="OPT",
                       help="extra ssh option, e.g. Port=2222 (passed as -o OPT) or '-F ~/.ssh/cluster'; repeatable")
    group.add_argument("--remote-trainwatch", default="trainwatch", metavar="CMD",
                       help="command that runs trainwatch on the other nodes (default: trainwatch)")
    group.add_argument("--remote-timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S, metavar="S",
                       help=f"give up on a node after this many seconds (default: {DEFAULT_TIMEOUT_S:g})")
    group.add_argument("--remote-parallel", type=count_between(1, 1024), default=None, metavar="N",
                       help="start at most this many node agents at once (default: 128)")
    group.add_argument("--remote-relays-from", type=count_between(0, 1 << 20), default=RELAY_FROM, metavar="N",
                       help=f"from this many ssh hosts on, reach them through relays: about sqrt(N) of the hosts "
                            f"each start the agents of their share over ssh (nodes must reach each other by "
                            f"ssh, as for pdsh or mpirun); 0: never (default: {RELAY_FROM})")


def wants_remote(args: argparse.Namespace) -> bool:
    return node_spec(args).named


def pods_only(args: argparse.Namespace) -> bool:
    """``--k8s`` and no PID (nor --match): the job is wherever its pods run, none of it here (a
    login box with kubectl): every pod is read through its agent."""
    return (getattr(args, "pid", None) is None and bool(getattr(args, "k8s", None))
            and not getattr(args, "match", None) and not getattr(args, "match_job_id", None))


def pods_source(args: argparse.Namespace, *, wait_s: float | None = None, window: float | None = None,
                stream_interval: float | None = None) -> Any:
    """The source over a ``--k8s`` job's pods alone (see :func:`pods_only`)."""
    from types import SimpleNamespace

    job = SimpleNamespace(master_addr=None, master_port=None, job_id=None, world_size=None, ranks=(), launcher=None)
    return wrap_source(args, None, job, wait_s=wait_s, window=window, stream_interval=stream_interval)


def ssh_options(values: list[str]) -> tuple[str, ...]:
    """``Port=22`` -> ``-o Port=22``; values starting with '-' are passed as given (split like a shell)."""
    out: list[str] = []
    for value in values:
        out += shlex.split(value) if value.lstrip().startswith("-") else ["-o", value]
    return tuple(out)


def detect_slurm(job: Any) -> str | None:
    """The SLURM job id a job runs under, if any (see ``trainwatch.probes.detect_slurm``)."""
    from ..probes import detect_slurm as detect
    return detect(job)


def slurm_job_here(timeout: float) -> str:
    """This shell's or this node's SLURM job (see ``trainwatch.probes.slurm_job_here``)."""
    from ..probes import slurm_job_here as here
    return here(timeout)


def node_spec(args: argparse.Namespace) -> NodeSpec:
    """The other nodes named by the options of :func:`add_remote_arguments`."""
    return NodeSpec(hosts=tuple(getattr(args, "hosts", None) or ()), hostfile=getattr(args, "hostfile", None),
                    slurm=getattr(args, "slurm", None), k8s=getattr(args, "k8s", None),
                    ray=getattr(args, "ray", None),
                    k8s_namespace=getattr(args, "k8s_namespace", None),
                    k8s_container=getattr(args, "k8s_container", None),
                    ssh_options=ssh_options(getattr(args, "ssh_option", None) or []),
                    timeout=getattr(args, "remote_timeout", DEFAULT_TIMEOUT_S),
                    parallel=getattr(args, "remote_parallel", None),
                    trainwatch=getattr(args, "remote_trainwatch", "trainwatch"),
                    relay_from=getattr(args, "remote_relays_from", RELAY_FROM))


def remotes_from_args(args: argparse.Namespace, job: Any) -> list[Remote]:
    """The other nodes named on the command line, without this node."""
    from ..probes import other_nodes
    return other_nodes(node_spec(args), job)


def wrap_source(args: argparse.Namespace, local_source: Any, job: Any, *, wait_s: float | None = None,
                window: float | None = None, stream_interval: float | None = None) -> Any:
    """``local_source`` alone, or a source over this node and the nodes named in ``args``
    (see ``open_nodes``). Each node samples over ``window`` (default: ``args.window``), with this
    node's ``--samples`` and ``--stuck-after``. ``stream_interval`` (live views: attach, watch):
    one streaming agent per node, started once, writing a line every that many seconds."""
    if not wants_remote(args):
        return local_source
    from ..probes import open_nodes
    if window is None:
        window = getattr(args, "window", None)
    return open_nodes(local_source, node_spec(args), job, wait_s=wait_s, window=window,
                      samples=getattr(args, "samples", None), stuck_after=getattr(args, "stuck_after", None),
                      stream_interval=stream_interval)

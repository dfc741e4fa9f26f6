"""Starting node agents: the agent's command line (how it finds the same job on its node), and
the launches that start it: one ``srun`` step for every node of a SLURM job, one ssh per host or,
from ``RELAY_FROM`` hosts on, a tree: one ssh per relay, each relay reaching its share of the hosts
(relay.py); one ``kubectl exec -i`` per pod."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .node_spec import RELAY_FROM
from .reach import Remote, SlurmRemote, SshRemote, slurm_step_argv
from ..record import Record


def match_args(job: Any) -> list[str]:
    """How the probe on another node finds the same job: master address, else job id.

    ``job`` is a JobProcesses or a Job (both carry master_addr/master_port/job_id).
    """
    addr, port = getattr(job, "master_addr", None), getattr(job, "master_port", None)
    if addr and port:
        return ["--match", f"{addr}:{port}"]
    job_id = getattr(job, "job_id", None)
    if job_id and job_id != "none":  # torchrun's default rdzv id identifies nothing
        return ["--match-job-id", str(job_id)]
    raise ValueError("the job has neither MASTER_ADDR:MASTER_PORT nor a job id to find it on other nodes")


def agent_args(match: list[str], window: float | None, interval: float, extra: Sequence[str] = ()) -> list[str]:
    """Arguments of ``trainwatch agent`` on every node."""
    args = ["agent", *match, "--interval", f"{interval:g}"]
    if window is not None:
        args += ["--window", f"{window:g}"]
    return args + list(extra)


@dataclass(repr=False)
class Launch(Record):
    """One command that runs agents: one node (ssh, kubectl) or many (one srun step, labelled)."""

    argv: list[str]
    names: list[str]  # the nodes, in task order for a labelled launch
    remote: Remote  # for naming failures
    labelled: bool = False
    relayed: bool = False  # a relay's: its first node relays to the others


def relay_args(relay: SshRemote, others: Sequence[SshRemote], trainwatch: str, args: list[str],
               timeout: float) -> list[str]:
    """``trainwatch relay`` on ``relay``: its own agent, and one over ssh on each of ``others`` (with
    the user's ssh options)."""
    out = ["relay", "--self", relay.name, "--remote-trainwatch", trainwatch, "--timeout", f"{timeout:g}"]
    if others:
        out += ["--connect-timeout", str(others[0].connect_timeout), "--ssh", others[0].ssh]
        out += [f"--ssh-arg={option}" for option in others[0].options]
    for node in others:
        out += ["--node", f"{node.name}={node.destination}" if node.destination else node.name]
    return [*out, "--", *args]


def relay_groups(remotes: Sequence[SshRemote]) -> list[list[SshRemote]]:
    """About sqrt(n) groups of about sqrt(n) hosts, in the order given (neighbours share a relay)."""
    size = max(2, math.ceil(math.sqrt(len(remotes))))
    return [list(remotes[i:i + size]) for i in range(0, len(remotes), size)]


def plan_launches(remotes: Sequence[Remote], trainwatch: str, args: list[str], *, relay_from: int = RELAY_FROM,
                  timeout: float = 30.0) -> list[Launch]:
    """SLURM nodes of one job share one step; ssh hosts, from ``relay_from`` of them on (0: never),
    are reached through relays; every other node gets its own agent."""
    launches: list[Launch] = []
    slurm: dict[tuple[str, str], list[SlurmRemote]] = {}
    ssh = [r for r in remotes if isinstance(r, SshRemote)]
    relayed = relay_from > 0 and len(ssh) >= relay_from
    for remote in remotes:
        if isinstance(remote, SlurmRemote):
            slurm.setdefault((remote.job_id, remote.srun), []).append(remote)
        elif not (relayed and isinstance(remote, SshRemote)):
            launches.append(direct_launch(remote, trainwatch, args))
    if relayed:
        for group in relay_groups(ssh):
            relay, others = group[0], group[1:]
            argv = relay.stream_argv(trainwatch, relay_args(relay, others, trainwatch, args, timeout))
            launches.append(Launch(argv, [n.name for n in group], relay, labelled=True, relayed=True))
    for (job_id, srun), nodes in slurm.items():
        names = [n.name for n in nodes]
        launches.append(Launch(slurm_step_argv(job_id, names, trainwatch, args, srun), names, nodes[0], labelled=True))
    return launches


def direct_launch(remote: Remote, trainwatch: str, args: list[str]) -> Launch:
    """One agent on one node."""
    stream = getattr(remote, "stream_argv", None) or remote.argv
    return Launch(stream(trainwatch, args), [remote.name], remote)


def popen_agent(launch: Launch) -> subprocess.Popen:
    """Start a launch in its own session, so close() can kill its whole group."""
    return subprocess.Popen(launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, bufsize=0)

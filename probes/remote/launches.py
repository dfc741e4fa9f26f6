"""Starting node agents: the agent's command line (how it finds the same job on its node), and
the launches that start it: one ``srun`` step for every node of a SLURM job, one ssh per host
(sharing a connection the bundle fetch can ride), one ``kubectl exec -i`` per pod."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .reach import Remote, SlurmRemote, SshRemote, slurm_step_argv


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


@dataclass
class Launch:
    """One command that runs agents: one node (ssh, kubectl) or many (one srun step, labelled)."""

    argv: list[str]
    names: list[str]  # the nodes, in task order for a labelled launch
    remote: Remote  # for naming failures
    labelled: bool = False


def plan_launches(remotes: Sequence[Remote], trainwatch: str, args: list[str]) -> list[Launch]:
    """SLURM nodes of one job share one step; every other node gets its own agent."""
    launches: list[Launch] = []
    slurm: dict[tuple[str, str], list[SlurmRemote]] = {}
    for remote in remotes:
        if isinstance(remote, SlurmRemote):
            slurm.setdefault((remote.job_id, remote.srun), []).append(remote)
        else:
            stream = getattr(remote, "stream_argv", None) or remote.argv
            launches.append(Launch(stream(trainwatch, args), [remote.name], remote))
    for (job_id, srun), nodes in slurm.items():
        names = [n.name for n in nodes]
        launches.append(Launch(slurm_step_argv(job_id, names, trainwatch, args, srun), names, nodes[0], labelled=True))
    return launches


def ssh_reuse_options(remote: SshRemote, control_dir: Path, timeout: float = 5.0) -> tuple[str, ...]:
    """Connection sharing for ``remote`` (later one-shot calls, dumps, ride the agent's connection),
    unless the user's own ssh config or options already say anything about it."""
    joined = " ".join(remote.options).lower()
    if "control" in joined:
        return ()
    try:
        mine = _ssh_g([remote.ssh, *remote.options, "-G", remote.destination or remote.name], timeout)
        bare = _ssh_g([remote.ssh, "-F", "/dev/null", "-G", remote.destination or remote.name], timeout)
    except (OSError, subprocess.SubprocessError):
        return ()
    keys = ("controlmaster", "controlpath", "controlpersist")
    if mine is None or bare is None or any(mine.get(k) != bare.get(k) for k in keys):
        return ()  # the user chose (or we cannot tell): leave it alone
    return ("-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C", "-o", "ControlPersist=no")


def _ssh_g(argv: list[str], timeout: float) -> dict[str, str] | None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          check=False)
    if done.returncode != 0:
        return None
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def popen_agent(launch: Launch) -> subprocess.Popen:
    """Start a launch in its own session, so close() can kill its whole group."""
    return subprocess.Popen(launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, bufsize=0)

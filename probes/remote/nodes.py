"""Which other nodes to ask, and how to reach them: ssh hosts, a SLURM job's nodes (srun), the
pods of a Kubernetes selector (kubectl), the nodes Ray placed a Ray Train run on (ssh). Every call
to srun or kubectl here is bounded."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Any

from ..errors import TrainwatchError
from ..snapshot import RAY_ACTORS, RAY_TRAIN
from .hostlist import (
    parse_hosts, read_hostfile, slurm_hostnames, slurm_job_nodelist, slurm_running_jobs, unique,
)
from .streams import STREAM_START_PARALLEL, StreamSource
from .node_spec import NodeSpec
from .reach import KubeRemote, Remote, SlurmRemote, SshRemote, kubectl_get_pods_argv, parse_pods
from .launches import match_args


def this_node() -> set[str]:
    name = socket.gethostname()
    names = {name, name.split(".")[0], "localhost"}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass  # no resolver: the short names still match
    return names


def detect_slurm(job: Any) -> str | None:
    """SLURM_JOB_ID from the ranks' environment (JobProcesses), if the job runs under SLURM."""
    for rank in getattr(job, "ranks", ()) or ():
        job_id = (getattr(rank, "env", None) or {}).get("SLURM_JOB_ID")
        if job_id:
            return job_id
    return None


def slurm_job_here(timeout: float) -> str:
    """``--slurm auto`` without a PID: SLURM_JOB_ID of this shell, else the one job running on this node."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if job_id:
        return job_id
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    jobs = slurm_running_jobs(node, timeout=timeout)
    if len(jobs) == 1:
        return jobs[0]
    found = f"jobs {', '.join(jobs)} run" if jobs else "no SLURM job runs"
    raise TrainwatchError(f"--slurm auto: no SLURM_JOB_ID here and {found} on node {node}",
                          remedy="pass --slurm JOBID (squeue lists them)")


def _slurm_node_names(job: Any) -> set[str]:
    """The names SLURM knows this node by, from the local ranks' SLURMD_NODENAME (may differ from the hostname)."""
    return {name for rank in getattr(job, "ranks", ()) or ()
            if (name := (getattr(rank, "env", None) or {}).get("SLURMD_NODENAME"))}


def _slurm_remotes(spec: NodeSpec, job: Any) -> list[Remote]:
    job_id = detect_slurm(job) if spec.slurm == "auto" else spec.slurm
    if not job_id:
        raise TrainwatchError("--slurm auto: the job's ranks have no SLURM_JOB_ID", remedy="pass --slurm JOBID")
    if not shutil.which("srun"):
        raise TrainwatchError("--slurm needs srun, which is not installed here",
                              remedy="run trainwatch on a node of the SLURM cluster, or use --hosts (ssh)")
    local = this_node() | _slurm_node_names(job)
    nodes = slurm_hostnames(slurm_job_nodelist(job_id, timeout=spec.timeout))
    return [SlurmRemote(name=n, job_id=job_id) for n in nodes if n not in local]


def _ray_remotes(spec: NodeSpec, job: Any) -> list[Remote]:
    """``--ray auto``: the other nodes of a Ray Train run, from its worker group as the controller
    logged it on this (the driver's) node; of a worker group of plain Ray actors, the nodes whose
    ranks are connected to the store served here; reached over ssh by the address Ray knows them by."""
    launcher = getattr(job, "launcher", None)
    if launcher not in (RAY_TRAIN, RAY_ACTORS):
        raise TrainwatchError("--ray auto: this is not a Ray Train job or a worker group of Ray actors",
                              remedy="point trainwatch at the driver or a RayTrainWorker, or name nodes with --hosts")
    peers = tuple(getattr(job, "peer_nodes", ()) or ())
    local = len(getattr(job, "ranks", ()) or ())
    rdzv = getattr(job, "rendezvous", None)
    if launcher == RAY_ACTORS and not peers and rdzv is not None and not rdzv.served_here:
        raise TrainwatchError(
            "--ray auto: the worker group's store is served on another node, which alone sees every node's ranks",
            remedy=f"run trainwatch on the node at {rdzv.store} (rank 0's), or name the nodes with --hosts")
    if not peers and (getattr(job, "world_size", None) or 0) > local:
        raise TrainwatchError(
            "--ray auto: this node does not hold the run's controller log, which names the other nodes",
            remedy="run trainwatch on the driver's node, or name the nodes with --hosts")
    return [SshRemote(name=ip, options=spec.ssh_options, connect_timeout=max(1, int(min(spec.timeout, 10))))
            for ip in peers]


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


def _k8s_remotes(spec: NodeSpec) -> list[Remote]:
    assert spec.k8s is not None
    pods = list_pods(spec.k8s, spec.k8s_namespace, spec.timeout)
    if not pods:
        raise TrainwatchError(f"no running pod matches -l {spec.k8s}")
    me = os.environ.get("HOSTNAME") or socket.gethostname()  # a pod's hostname is its name
    return [KubeRemote(name=p, namespace=spec.k8s_namespace, container=spec.k8s_container)
            for p in pods if p != me]


def other_nodes(spec: NodeSpec, job: Any) -> list[Remote]:
    """The nodes named in ``spec``, without this node."""
    remotes: list[Remote] = []
    hosts = parse_hosts(list(spec.hosts))
    if spec.hostfile:
        hosts = unique([*hosts, *read_hostfile(spec.hostfile)])
    local = this_node()
    remotes += [SshRemote(name=h, options=spec.ssh_options, connect_timeout=max(1, int(min(spec.timeout, 10))))
                for h in hosts if h not in local]
    if spec.slurm:
        remotes += _slurm_remotes(spec, job)
    if spec.k8s:
        remotes += _k8s_remotes(spec)
    if spec.ray:
        named = {r.name for r in remotes}
        remotes += [r for r in _ray_remotes(spec, job) if r.name not in named]
    return remotes


def open_nodes(local_source: Any, spec: NodeSpec, job: Any, *, wait_s: float | None = None,
               window: float | None = None, samples: int | None = None, stuck_after: float | None = None,
               stream_interval: float | None = None) -> Any:
    """``local_source`` alone, or a source over this node and the other nodes in ``spec``.

    ``job`` is the local JobProcesses (or Job). ``wait_s``: how long one poll waits for slow
    nodes (live views pass their refresh interval; one-shot commands leave it at the timeout).
    Each node samples over ``window`` with ``samples`` samples and ``stuck_after`` (every
    judgement option reaches every node). Either way one agent per node (the compact wire):
    ``stream_interval`` (live views) keeps them, a line every that many seconds; without it
    (one-shot commands) they are asked for every thread and stopped when the source closes."""
    if not spec.named:
        return local_source
    remotes = other_nodes(spec, job)
    if not remotes:
        return local_source
    try:
        match = match_args(job)
    except ValueError as exc:
        raise TrainwatchError(str(exc), remedy="other nodes find the job by MASTER_ADDR:MASTER_PORT") from exc
    extra = (["--samples", str(samples)] if samples is not None else []) + (
        ["--stuck-after", f"{stuck_after:g}"] if stuck_after is not None else [])
    if stream_interval is None:
        # One-shot (snapshot, dump): agents too, asked for every thread, so every engine speaks the compact
        # wire and SLURM makes one step for all nodes; each agent writes its line and the source closes it.
        return StreamSource(local_source, remotes, match=match, trainwatch=spec.trainwatch, timeout=spec.timeout,
                            interval=max(1.0, window or 1.0), parallel=spec.parallel or STREAM_START_PARALLEL,
                            window=window, world_size=getattr(job, "world_size", None), extra_args=extra,
                            once=True, relay_from=spec.relay_from)
    return StreamSource(local_source, remotes, match=match, trainwatch=spec.trainwatch,
                        timeout=spec.timeout, interval=stream_interval,
                        parallel=spec.parallel or STREAM_START_PARALLEL,
                        window=window, world_size=getattr(job, "world_size", None), extra_args=extra,
                        relay_from=spec.relay_from,
                        # the first poll waits for the agents' first lines: a start and one window
                        wait_s=(window or 0.0) + max(wait_s, 5.0) if wait_s is not None else None)

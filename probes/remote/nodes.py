"""Which other nodes to ask, and how to reach them: ssh hosts, a SLURM job's nodes (srun), the
pods of a Kubernetes selector (kubectl), the nodes Ray placed a Ray Train run on (ssh). Every call
to srun or kubectl here is bounded."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from ..errors import AccessDenied, NotAJob, TrainwatchError
from ..read.processes import namespaces
from ..record import Record
from ..snapshot import RAY_ACTORS, RAY_TRAIN, Job
from .hostlist import (
    parse_hosts, read_hostfile, slurm_hostnames, slurm_job_nodelist, slurm_running_jobs, unique,
)
from .streams import STREAM_START_PARALLEL, StreamSource
from .node_spec import NodeSpec
from .pods import Pod, forbidden, parse_pods, selector_for
from .reach import KubeRemote, Remote, SlurmRemote, SshRemote, kubectl_get_pods_argv
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


def list_pods(selector: str, namespace: str | None, timeout: float, container: str | None = None) -> list[Pod]:
    """Every pod matching ``selector``, whatever its phase (``kubectl get pods -o json``), with the
    ranks each runs. Raises AccessDenied when Kubernetes refuses (the verb it lacks and the Role
    rule that grants it), TrainwatchError for anything else."""
    where = f" -n {namespace}" if namespace else ""
    try:
        done = subprocess.run(kubectl_get_pods_argv(selector, namespace), capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise TrainwatchError("--k8s needs kubectl, which is not installed here",
                              "install kubectl where you run trainwatch, with a kubeconfig for the cluster") from exc
    except subprocess.TimeoutExpired as exc:
        raise TrainwatchError(f"kubectl get pods -l {selector}{where} did not answer in {timeout:g}s") from exc
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
        denied = forbidden(done.stderr)
        if denied:
            raise AccessDenied(f"kubectl get pods -l {selector}{where}: {denied}")
        raise TrainwatchError(f"kubectl get pods -l {selector}{where}: {said}")
    try:
        return parse_pods(done.stdout, container)
    except ValueError as exc:
        raise TrainwatchError(str(exc)) from exc


def pod_remotes(pods: list[Pod], spec: NodeSpec) -> list[KubeRemote]:
    """The pods that run their job now, each reached with ``kubectl exec``; the pod trainwatch runs
    in is left out where it can be told (its pod UID in its cgroup, its name as host name); else
    its agent's answer is known as this node's by what it is (``merge.one_view_per_node``)."""
    me = os.environ.get("HOSTNAME") or socket.gethostname()
    uid = namespaces.own_pod_uid()
    return [KubeRemote(name=p.name, namespace=spec.k8s_namespace, container=p.container)
            for p in pods if p.running and p.name != me and not (uid and p.uid == uid)]


@dataclass(repr=False)
class KubeJob(Record):
    """A ``--k8s`` job's pods as listed (``error``: why they could not be), and how to list them again."""

    spec: NodeSpec
    pods: list[Pod]
    error: str | None = None

    @property
    def selector(self) -> str:
        assert self.spec.k8s is not None
        return selector_for(self.spec.k8s)

    def relist(self) -> list[Pod]:
        return list_pods(self.selector, self.spec.k8s_namespace, self.spec.timeout, self.spec.k8s_container)

    def remote(self, pod: Pod) -> KubeRemote | None:
        """The pod as a node to read, when it runs its job now and is not this one."""
        found = pod_remotes([pod], self.spec)
        return found[0] if found else None

    def bare_job(self) -> Job:
        """The job's record before any pod answered (every pod Pending, say)."""
        where = f" -n {self.spec.k8s_namespace}" if self.spec.k8s_namespace else ""
        worlds = [p.world_size for p in self.pods if p.world_size]
        return Job(launcher="kubernetes", pid=0, host=f"pods -l {self.selector}{where}",
                   world_size=max(worlds) if worlds else None, nnodes=len(self.pods) or None)


def kube_job(spec: NodeSpec, required: bool) -> KubeJob:
    """The pods of ``spec.k8s``. ``required`` (no rank of the job here to show instead): a listing
    Kubernetes refuses, or one that finds no pod, ends the command; else it is said and the local
    ranks are judged with the others unread."""
    job = KubeJob(spec, [])
    try:
        job.pods = job.relist()
    except TrainwatchError as exc:
        if required:
            raise
        job.error = f"pods not listed: {exc.message}"
        return job
    if not job.pods and required:
        where = f" in namespace {spec.k8s_namespace}" if spec.k8s_namespace else ""
        raise NotAJob(f"no pod matches -l {job.selector}{where}",
                      "check the selector with `kubectl get pods -l ...` (or name the job: --k8s pytorchjob/NAME)")
    return job


def other_nodes(spec: NodeSpec, job: Any, kube: KubeJob | None = None) -> list[Remote]:
    """The nodes named in ``spec``, without this node (``kube``: the --k8s pods, already listed)."""
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
        pods = kube.pods if kube is not None else kube_job(spec, required=True).pods
        remotes += [r for r in (KubeJob(spec, pods).remote(p) for p in pods) if r is not None]
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
    kube = kube_job(spec, required=local_source is None) if spec.k8s else None
    remotes = other_nodes(spec, job, kube)
    if not remotes and not (kube is not None and (kube.pods or kube.error)):
        return local_source
    if kube is not None and not (spec.hosts or spec.hostfile or spec.slurm or spec.ray):
        match = ["--match-any"]  # a pod holds one job: its agent finds it whatever its PIDs (a launcher alone, too)
    else:
        try:
            match = match_args(job)
        except ValueError as exc:
            raise TrainwatchError(str(exc), remedy="other nodes find the job by MASTER_ADDR:MASTER_PORT") from exc
    extra = (["--samples", str(samples)] if samples is not None else []) + (
        ["--stuck-after", f"{stuck_after:g}"] if stuck_after is not None else [])
    world = getattr(job, "world_size", None)
    pods = dict(pods=kube.pods, job=kube.bare_job(), unreached=({f"pods -l {kube.selector}": kube.error}
                                                                if kube.error else {}),
                relist=kube.relist, pod_remote=kube.remote) if kube is not None else {}
    if stream_interval is None:
        # One-shot (snapshot, dump): agents too, asked for every thread, so every engine speaks the compact
        # wire and SLURM makes one step for all nodes; each agent writes its line and the source closes it.
        return StreamSource(local_source, remotes, match=match, trainwatch=spec.trainwatch, timeout=spec.timeout,
                            interval=max(1.0, window or 1.0), parallel=spec.parallel or STREAM_START_PARALLEL,
                            window=window, world_size=world, extra_args=extra,
                            once=True, relay_from=spec.relay_from, **pods)
    return StreamSource(local_source, remotes, match=match, trainwatch=spec.trainwatch,
                        timeout=spec.timeout, interval=stream_interval,
                        parallel=spec.parallel or STREAM_START_PARALLEL,
                        window=window, world_size=world, extra_args=extra,
                        relay_from=spec.relay_from,
                        # the first poll waits for the agents' first lines: a start and one window
                        wait_s=(window or 0.0) + max(wait_s, 5.0) if wait_s is not None else None, **pods)

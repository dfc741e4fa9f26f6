"""How other nodes are reached: one ``Remote`` per node (ssh host, SLURM node, Kubernetes
pod), each building the command line that runs trainwatch there; SLURM's one step for many
nodes, and the pods a selector names."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

from ..record import Record


class Remote(Protocol):
    """One other node (or pod) and how to run a command there."""

    name: str  # how the user knows the node: host, SLURM node, pod

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        """Local command line that runs ``trainwatch args...`` on the node."""


@dataclass(frozen=True, repr=False)
class SshRemote(Record):
    """A node reached with OpenSSH; the user's ssh config and agent apply (no ``-F`` by default)."""

    name: str
    destination: str = ""  # user@host, host, or ssh://user@host:port; defaults to name
    options: tuple[str, ...] = ()  # extra ssh arguments, e.g. ("-o", "Port=2222")
    connect_timeout: int = 10
    ssh: str = "ssh"

    def _base(self) -> list[str]:
        return [self.ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                *self.options, "--", self.destination or self.name]

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        # ssh hands one string to the remote shell: trainwatch may be "env PATH=... trainwatch".
        return [*self._base(), f"{trainwatch} {shlex.join(args)}"]

    def stream_argv(self, trainwatch: str, args: list[str]) -> list[str]:
        """A long-running command whose stdin stays connected (ssh forwards it by default)."""
        return self.argv(trainwatch, args)


@dataclass(frozen=True, repr=False)
class SlurmRemote(Record):
    """A node of a SLURM allocation, reached with a step that overlaps the running job."""

    name: str  # node name
    job_id: str
    srun: str = "srun"

    def _base(self) -> list[str]:
        return [self.srun, "--overlap", f"--jobid={self.job_id}", f"--nodelist={self.name}",
                "-N1", "-n1", "--quiet"]

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        return [*self._base(), *shlex.split(trainwatch), *args]


def slurm_step_argv(job_id: str, nodes: list[str], trainwatch: str, args: list[str], srun: str = "srun") -> list[str]:
    """One step over ``nodes`` of job ``job_id``, one task per node, each output line labelled with
    its task number (``3: ...``); stdin is broadcast to every task (srun's default, said explicitly).
    ``--overlap`` shares the job's resources instead of waiting for them; a task that exits never
    ends the others (``--kill-on-bad-exit=0``)."""
    return [srun, "--overlap", f"--jobid={job_id}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--label", "--input=all",
            "--kill-on-bad-exit=0", "--quiet", *shlex.split(trainwatch), *args]


@dataclass(frozen=True, repr=False)
class KubeRemote(Record):
    """A pod reached with ``kubectl exec``."""

    name: str  # pod name
    namespace: str | None = None
    container: str | None = None
    kubectl: str = "kubectl"

    def _base(self) -> list[str]:
        cmd = [self.kubectl, "exec"]
        if self.namespace:
            cmd += ["-n", self.namespace]
        if self.container:
            cmd += ["-c", self.container]
        return [*cmd, self.name, "--"]

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        return [*self._base(), *shlex.split(trainwatch), *args]

    def stream_argv(self, trainwatch: str, args: list[str]) -> list[str]:
        """``kubectl exec -i``: the agent's stdin stays open while the viewer runs (EOF stops it)."""
        base = self._base()
        return [base[0], base[1], "-i", *base[2:], *shlex.split(trainwatch), *args]


def kubectl_get_pods_argv(selector: str, namespace: str | None = None, kubectl: str = "kubectl") -> list[str]:
    cmd = [kubectl, "get", "pods", "-l", selector, "-o", "json"]
    return cmd + (["-n", namespace] if namespace else [])

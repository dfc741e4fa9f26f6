"""The other nodes a person named, and the defaults for reaching them: small, so the command line
builds them without loading the remote machinery."""

from __future__ import annotations

from dataclasses import dataclass

from ..record import Record

DEFAULT_TIMEOUT_S = 30.0  # give up on a node after this long
RESTART_MIN_S, RESTART_MAX_S = 2.0, 30.0  # an agent that stopped starts again after this back-off, doubling
RELAY_FROM = 64  # ssh hosts from which agents are reached through relays (about sqrt(hosts) of them)


@dataclass(frozen=True, repr=False)
class NodeSpec(Record):
    """The other nodes as named by a person: ``hosts`` (SLURM ranges allowed), a ``hostfile``,
    a SLURM job (``slurm``: its id, or ``auto``), pods matching a ``k8s`` selector, the nodes Ray
    placed the run's workers on (``ray``: ``auto``, reached over ssh)."""

    hosts: tuple[str, ...] = ()
    hostfile: str | None = None
    slurm: str | None = None
    k8s: str | None = None
    ray: str | None = None
    k8s_namespace: str | None = None
    k8s_container: str | None = None
    ssh_options: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S
    parallel: int | None = None  # agents started at once; None: STREAM_START_PARALLEL
    trainwatch: str = "trainwatch"  # the command that runs trainwatch on the other nodes
    relay_from: int = RELAY_FROM  # ssh hosts from which relays reach them (0: never)

    @property
    def named(self) -> bool:
        return bool(self.hosts or self.hostfile or self.slurm or self.k8s or self.ray)

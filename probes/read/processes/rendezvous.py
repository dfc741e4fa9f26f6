"""A job found through its rendezvous (I/O only): the TCPStore its ranks meet at, the processes
connected to it, and the sockets between them, wherever they sit in the process tree.

What makes processes one job is the store they rendezvous through. torch's ``TCPStore`` master
serves the store and connects a client of its own to it (``TCPStore``'s constructor connects
``client_`` after starting the server, in the launcher's agent or in rank 0): so the store is a
listening socket whose own process is also connected to it, in a process with torch loaded. Every
rank keeps its client connection to the store open for the job's life; the store's other
connections come from the other nodes' ranks and agents (the node that serves it sees them all).
Besides, the ranks' gloo pairs (NCCL's bootstrap ring) connect the ranks to each other, and a Ray
driver holds a connection to each of its actors (it submits their tasks over gRPC): from a driver,
the store is the one its peers are connected to.

Read from ``/proc/PID/net/tcp{,6}`` joined with the socket fds of the processes that may be part
of a job (Python processes, Ray's workers, launchers), bounded; nothing is asked of the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import procfs, sockets
from ..stacks.pyspy import PySpyRun, wait_any
from ...errors import TrainwatchError
from ...frames import RANK_NAMES, WORLD_NAMES, rank_names
from ...record import Record

# Processes whose sockets are read: a job's processes are Python (Ray names its workers
# ``ray::<Actor>``; a launcher installed as a script keeps its own name).
CANDIDATE_NAMES = ("python", "ray::", "torchrun", "accelerate", "deepspeed", "pt_")
MAX_CANDIDATES = 512  # bounded on a crowded node: past this, the rest go unread (and the notes say so)
LOOPBACK = frozenset({"127.0.0.1", "::1"})
STORE_READER_TAG = "trainwatch-store-reader"  # the last argument of trainwatch's own TCPStore reader
LOCALS_TIMEOUT = 3.0  # one py-spy --locals per rank found through its store, all at once


@dataclass(frozen=True, repr=False)
class Store(Record):
    """One TCPStore on this node, as its sockets show it."""

    port: int
    host: int  # the PID that serves it (a launcher's agent, or a rank)
    address: tuple[str, int]  # as a client dials it
    clients: tuple[int, ...]  # local PIDs connected to it, its host included
    remote_clients: tuple[str, ...] = ()  # the addresses of clients on other nodes, one per connection
    reached_at: tuple[str, int] | None = None  # the address other nodes' clients dialled, where any did

    @property
    def text(self) -> str:
        host, port = self.reached_at or self.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, repr=False)
class Scan(Record):
    """The stores on this node and who talks to whom, from one bounded read."""

    stores: tuple[Store, ...] = ()
    peers: dict[int, frozenset[int]] = field(default_factory=dict)  # PID -> local PIDs it has a TCP connection with
    # PID -> the local addresses a process dialled (remote ends of its client connections)
    dialled: dict[int, frozenset[tuple[str, int]]] = field(default_factory=dict)
    listening: frozenset[int] = frozenset()  # the ports something listens on here
    local_ips: frozenset[str] = frozenset()  # this node's addresses, as its sockets show them
    notes: tuple[str, ...] = ()

    def nothing_at(self, address: tuple[str, int]) -> bool:
        """Whether ``address`` is this node's and nothing listens there (a store not started yet)."""
        return address[0] in self.local_ips and address[1] not in self.listening

    def store_for(self, pid: int) -> tuple[Store | None, tuple[Store, ...]]:
        """The store ``pid``'s job meets at, and other stores its peers use (another worker group of
        the same driver, said in the notes): the one it is a client of, or serves, or, for a process
        that is neither (a Ray driver), the one most of its peers are clients of."""
        own = [s for s in self.stores if pid in s.clients or s.host == pid]
        if own:
            ranked = sorted(own, key=lambda s: (-len(s.clients), s.port))
            return ranked[0], tuple(ranked[1:])
        peers = self.peers.get(pid, frozenset())
        shared = [(len(peers & set(s.clients)), s) for s in self.stores if peers & set(s.clients)]
        ranked = [s for _, s in sorted(shared, key=lambda item: (-item[0], item[1].port))]
        return (ranked[0] if ranked else None), tuple(ranked[1:])

    def store_at(self, address: tuple[str, int]) -> Store | None:
        """The store served here at ``address`` (its port, on any of this node's addresses)."""
        if address[0] not in self.local_ips and address[0] not in ("0.0.0.0", "::"):
            return None
        return next((s for s in self.stores if s.port == address[1]), None)

    def clients_of(self, address: tuple[str, int]) -> tuple[int, ...]:
        """Local PIDs connected to ``address`` (a store served on another node: this node's ranks)."""
        return tuple(sorted(pid for pid, dialled in self.dialled.items() if address in dialled))


def candidates(start: int, parents: dict[int, int]) -> tuple[list[int], bool]:
    """PIDs whose sockets are read: ``start`` and the processes of its network namespace named like
    a job's (Python, Ray workers, launchers), at most ``MAX_CANDIDATES``; and whether some were left out."""
    namespace = sockets.net_namespace(start)
    found = [start]
    for pid in sorted(parents):
        if pid == start:
            continue
        comm = (procfs.read_text(f"/proc/{pid}/comm") or "").strip()
        if not comm.startswith(CANDIDATE_NAMES):
            continue
        if namespace is not None and sockets.net_namespace(pid) not in (namespace, None):
            continue  # another network namespace: its sockets are not in this table
        if len(found) >= MAX_CANDIDATES:
            return found, True
        found.append(pid)
    return found, False


def scan(start: int) -> Scan:
    """The stores and connections among the job-like processes of ``start``'s node."""
    table = sockets.tcp_table(start)
    tree = procfs.parent_map()
    parents = {child: parent for parent, children in tree.items() for child in children}
    pids, cut = candidates(start, parents)
    holders: dict[int, list[int]] = {}
    denied = []
    for pid in pids:
        inodes = sockets.socket_inodes(pid)
        if inodes is None:
            denied.append(pid)
        elif inodes:
            holders[pid] = [i for i in inodes if i in table]
    owner = sockets.owners(holders, parents)
    notes = []
    if denied:
        notes.append(f"the sockets of PIDs {', '.join(map(str, denied[:8]))}{' …' if len(denied) > 8 else ''} "
                     "could not be read (another user's processes): ranks among them are not found by their store")
    if cut:
        notes.append(f"only the first {MAX_CANDIDATES} Python processes' sockets were read")
    return _read_table(table, owner, notes)


def _has_torch(pid: int) -> bool:
    return procfs.maps_mention(pid, b"libtorch", b"/torch/_C")


def _read_table(table: dict[int, sockets.TcpSocket], owner: dict[int, int], notes: list[str],
                is_torch: Callable[[int], bool] = _has_torch) -> Scan:
    local_ips = {s.local[0] for s in table.values()} | LOOPBACK
    listening = {s.local[1]: s for s in table.values() if s.listening}
    clients: dict[int, set[int]] = {}
    dialled_at: dict[int, tuple[str, int]] = {}  # listening port -> an address a local client dialled
    remote: dict[int, list[str]] = {}
    reached: dict[int, tuple[str, int]] = {}  # listening port -> the address other nodes dialled
    dialled: dict[int, set[tuple[str, int]]] = {}
    ends = {(s.local, s.remote): s for s in table.values() if s.established}
    peers: dict[int, set[int]] = {}
    for s in ends.values():
        pid = owner.get(s.inode)
        outgoing = s.remote[1] in listening and s.remote[0] in local_ips and s.local[1] != s.remote[1]
        if outgoing and pid is not None:
            clients.setdefault(s.remote[1], set()).add(pid)
            dialled_at.setdefault(s.remote[1], s.remote)
        if pid is not None and s.local[1] not in listening:
            dialled.setdefault(pid, set()).add(s.remote)  # a client end: what it dialled (here or elsewhere)
        if s.local[1] in listening and s.remote[0] not in local_ips:
            remote.setdefault(s.local[1], []).append(s.remote[0])
            reached.setdefault(s.local[1], s.local)
        other = owner.get(ends[(s.remote, s.local)].inode) if (s.remote, s.local) in ends else None
        if pid is not None and other is not None and other != pid:
            peers.setdefault(pid, set()).add(other)
    stores = []
    for port, sock in sorted(listening.items()):
        host = owner.get(sock.inode)
        if host is None or host not in clients.get(port, ()):
            continue  # no process of its own connected to it: not a TCPStore's server
        if not is_torch(host):
            continue  # a self-connected server that is not torch's
        stores.append(Store(port=port, host=host, address=dialled_at[port], clients=tuple(sorted(clients[port])),
                            remote_clients=tuple(sorted(remote.get(port, ()))), reached_at=reached.get(port)))
    return Scan(stores=tuple(stores), peers={p: frozenset(s) for p, s in peers.items()},
                dialled={p: frozenset(s) for p, s in dialled.items()}, listening=frozenset(listening),
                local_ips=frozenset(local_ips), notes=tuple(notes))


def is_own_client(pid: int) -> bool:
    """trainwatch's own TCPStore reader (``collectives/nccl_state.py``), itself a client of the store."""
    args = (procfs.read_text(f"/proc/{pid}/cmdline") or "").rstrip("\0").split("\0")
    return args[-1] == STORE_READER_TAG


def numbers_from_locals(pids: list[int]) -> tuple[dict[int, tuple[int | None, int | None]], list[str]]:
    """PID -> (global rank, world size) as its main thread's locals say them (``frames.rank_names``:
    ``global_rank``/``world_rank``/``rank`` and ``world_size`` in the user's frames and
    torch.distributed's, the innermost first; only non-negative integers; every other local is
    dropped as py-spy's output is read); and why a PID could not be read. One bounded py-spy each,
    all at once."""
    runs = [PySpyRun(pid, timeout=LOCALS_TIMEOUT, locals=True, wanted=rank_names) for pid in pids]
    pending = list(runs)
    while pending:
        wait_any(pending)
        pending = [run for run in pending if not run.ended]
    found: dict[int, tuple[int | None, int | None]] = {}
    failed = []
    for run in runs:
        try:
            _, ints = run.result()
        except TrainwatchError as exc:
            failed.append(f"PID {run.pid}: {exc}")
            continue
        frames = [ints[i] for i in sorted(ints or {})]
        rank = next((f[name] for f in frames for name in RANK_NAMES if f.get(name, -1) >= 0), None)
        world = next((f[name] for f in frames for name in WORLD_NAMES if f.get(name, 0) > 0), None)
        found[run.pid] = (rank, world)
    return found, failed

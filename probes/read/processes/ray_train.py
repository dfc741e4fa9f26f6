"""Ray Train's ranks, from Ray's own records (I/O only).

Ray runs each rank of a ``TorchTrainer`` as a ``RayTrainWorker`` actor: a process named
``ray::RayTrainWorker`` under the node's raylet, not under the driver. Its ``RANK``,
``WORLD_SIZE`` and ``MASTER_ADDR`` are set in ``os.environ`` at run time, so ``/proc/PID/environ``
holds only ``RAY_*`` variables. Ray Train writes what each worker is, though: its structured
system log, ``<session>/logs/train/ray-train-sys-worker-<worker id>.log``, one JSON object per
line with ``process`` (the PID), ``world_rank``, ``local_rank``, ``node_rank``, ``job_id`` and
``run_name``, and rank 0's "Setting up process group for: env:// [rank=0, world_size=3]". The
logs directory is on the raylet's command line (``--log_dir=``).

Where the other ranks run: Ray Train's controller (an actor Ray places on the driver's node) logs
the whole worker group when it starts it, in ``ray-train-sys-controller-<id>.log``: "Started training
worker group of size N:" then one line per worker, ``- (ip=10.0.0.2, pid=201) world_rank=3,
local_rank=1, node_rank=1``. On the driver's node that names every node that holds a rank.

From any PID a user has (the driver, a worker, a worker's DataLoader worker, the raylet) this finds
the raylet, the live ``RayTrainWorker`` processes under it, and each one's rank. No Ray API is
called: nothing here needs ``ray`` importable, a dashboard or the state API.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from . import procfacts, procfs
from .proc import Proc, ProcessError, all_processes
from ...record import Record

WORKER_NAME = "ray::RayTrainWorker"
MAX_LOG_LINES = 200  # a worker's rank is on its first lines; bounded for week-long logs
_WORLD = re.compile(r"\[rank=(\d+), world_size=(\d+)\]")
_GROUP_STARTED = "Started training worker group of size"
_PLACED = re.compile(r"^- \(ip=([^,\s]+), pid=(\d+)\) world_rank=(\d+), local_rank=(\d+), node_rank=(\d+)",
                     re.MULTILINE)
_LOG_DIR, _SESSION_DIR, _NODE_IP = "--log_dir=", "--session_dir=", "--node_ip_address="


@dataclass(frozen=True, repr=False)
class RayRank(Record):
    """One Ray Train worker as Ray Train's own log records it."""

    pid: int
    rank: int
    local_rank: int | None = None
    node_rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    run_name: str | None = None


@dataclass(frozen=True, repr=False)
class RayPlacement(Record):
    """One worker of the run's worker group as the controller logged it: on which node, which rank."""

    ip: str
    pid: int  # as the worker's own node sees it
    rank: int
    local_rank: int
    node_rank: int


@dataclass(frozen=True, repr=False)
class RayTrainJob(Record):
    """The workers of one Ray Train run on this node."""

    raylet: Proc
    driver: Proc | None
    workers: tuple[Proc, ...]
    ranks: dict[int, RayRank]  # pid -> its record (workers whose record was found)
    logs_dir: Path | None
    node_ip: str | None = None  # this node's address in the Ray cluster (the raylet's)
    group: tuple[RayPlacement, ...] = ()  # the whole worker group, where this node holds the controller's log

    @property
    def run_name(self) -> str | None:
        return next((r.run_name for r in self.ranks.values() if r.run_name), None)

    def elsewhere(self) -> dict[str, tuple[int, ...]]:
        """Node address -> the ranks Ray placed there, for the nodes other than this one."""
        out: dict[str, list[int]] = {}
        for placed in self.group:
            if placed.ip != self.node_ip:
                out.setdefault(placed.ip, []).append(placed.rank)
        return {ip: tuple(sorted(ranks)) for ip, ranks in out.items()}


def _cmdline(proc: Proc) -> list[str]:
    try:
        return proc.cmdline()
    except ProcessError:
        return []


def is_worker_title(cmdline: list[str]) -> bool:
    """A Ray worker process (an actor, or a pooled worker for tasks): Ray titles it ``ray::<name>``."""
    return bool(cmdline) and cmdline[0].startswith("ray::")


def is_worker(proc: Proc) -> bool:
    cmd = _cmdline(proc)
    return bool(cmd) and cmd[0].startswith(WORKER_NAME)


def _is_raylet(proc: Proc) -> bool:
    cmd = _cmdline(proc)
    return bool(cmd) and Path(cmd[0]).name == "raylet"


def _loads_ray(proc: Proc) -> bool:
    """A Python process that has Ray's core library loaded (a driver, or a worker)."""
    return procfs.maps_mention(proc.pid, b"_raylet.so")


def find(start: Proc) -> RayTrainJob | None:
    """The Ray Train run ``start`` belongs to, or None when it is no Ray Train process."""
    chain = [start, *_safe_parents(start)]
    worker = next((p for p in chain if is_worker(p)), None)
    raylet = _raylet_of(worker) if worker is not None else None
    driver = None
    if raylet is None:
        raylet = next((p for p in chain if _is_raylet(p)), None)
    if raylet is None and _loads_ray(start):  # the driver: its local cluster's raylet is beneath it
        driver = start
        raylet = next((p for p in _safe_children(start) if _is_raylet(p)), None) or _only_raylet()
    if raylet is None:
        return None
    logs = logs_dir(raylet)
    records = read_ranks(logs) if logs else {}
    workers = [p for p in _safe_children(raylet, recursive=False) if is_worker(p)]
    if not workers:
        return None
    own = records.get(worker.pid) if worker is not None else None
    if own is not None:  # one run: the start worker's
        workers = [p for p in workers if (r := records.get(p.pid)) is None or r.run_name == own.run_name]
    elif driver is not None:
        job_id = _driver_job_id(driver, logs)
        if job_id:
            workers = [p for p in workers if (r := records.get(p.pid)) is None or r.job_id == job_id]
    if driver is None:
        driver = _driver_above(raylet)
    ranks = {p.pid: records[p.pid] for p in workers if p.pid in records}
    run = next((r.run_name for r in ranks.values() if r.run_name), None)
    return RayTrainJob(raylet=raylet, driver=driver, workers=tuple(sorted(workers, key=lambda p: p.pid)),
                       ranks=ranks, logs_dir=logs, node_ip=node_ip(raylet),
                       group=read_worker_group(logs, run) if logs and run else ())


def find_run(run_name: str) -> RayTrainJob | None:
    """The workers on this node of the Ray Train run named ``run_name`` (how a node agent finds the
    run a viewer on another node asks for: Ray's ranks have no MASTER_ADDR in their environment)."""
    for raylet in (p for p in all_processes() if _is_raylet(p)):
        logs = logs_dir(raylet)
        if logs is None:
            continue
        records = read_ranks(logs)
        for worker in _safe_children(raylet, recursive=False):
            record = records.get(worker.pid)
            if record is not None and record.run_name == run_name and is_worker(worker):
                return find(worker)
    return None


def node_ip(raylet: Proc) -> str | None:
    """This node's address in the Ray cluster, from the raylet's ``--node_ip_address``."""
    return next((a[len(_NODE_IP):] for a in _cmdline(raylet) if a.startswith(_NODE_IP)), None)


def read_worker_group(logs: Path, run_name: str) -> tuple[RayPlacement, ...]:
    """The last worker group the run's controller started, as its system log lists it; empty when
    the controller's log is not on this node (it runs on the driver's node)."""
    group: tuple[RayPlacement, ...] = ()
    for path in sorted((logs / "train").glob("ray-train-sys-controller-*.log")):
        try:
            with open(path, errors="replace") as handle:  # line by line: a restart may be logged far in
                lines = [line for line in handle if _GROUP_STARTED in line]
        except OSError:
            continue  # rotated away: the other controller logs still say
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut by rotation
            if isinstance(entry, dict) and entry.get("run_name") == run_name:
                group = tuple(RayPlacement(ip=m.group(1), pid=int(m.group(2)), rank=int(m.group(3)),
                                           local_rank=int(m.group(4)), node_rank=int(m.group(5)))
                              for m in _PLACED.finditer(str(entry.get("message", ""))))
    return group


def logs_dir(raylet: Proc) -> Path | None:
    """``<session>/logs`` from the raylet's command line (``--log_dir``, else ``--session_dir``)."""
    args = _cmdline(raylet)
    for arg in args:
        if arg.startswith(_LOG_DIR):
            return Path(arg[len(_LOG_DIR):])
    for arg in args:
        if arg.startswith(_SESSION_DIR):
            return Path(arg[len(_SESSION_DIR):]) / "logs"
    return None


def read_ranks(logs: Path) -> dict[int, RayRank]:
    """PID -> rank of every worker Ray Train's system logs describe."""
    found: dict[int, RayRank] = {}
    for path in sorted((logs / "train").glob("ray-train-sys-worker-*.log")):
        record = _read_worker_log(path)
        if record is not None:
            found[record.pid] = record
    return found


def _read_worker_log(path: Path) -> RayRank | None:
    pid = rank = None
    fields: dict = {}
    world = None
    try:
        with open(path, errors="replace") as handle:
            for n, line in enumerate(handle):
                if n >= MAX_LOG_LINES:
                    break
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut by rotation
                if not isinstance(entry, dict) or not isinstance(entry.get("world_rank"), int):
                    continue
                pid, rank = entry.get("process"), entry["world_rank"]
                fields = entry
                found = _WORLD.search(str(entry.get("message", "")))
                if found:
                    world = int(found.group(2))
                    break
    except OSError:
        return None
    if not isinstance(pid, int) or rank is None:
        return None
    return RayRank(pid=pid, rank=rank, local_rank=_int(fields.get("local_rank")),
                   node_rank=_int(fields.get("node_rank")), world_size=world,
                   job_id=fields.get("job_id"), run_name=fields.get("run_name"))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _raylet_of(worker: Proc) -> Proc | None:
    env = procfacts.read_environ(worker.pid) or {}
    try:
        return Proc(int(env.get("RAY_RAYLET_PID", "")))
    except (ValueError, ProcessError):
        try:
            parent = worker.parent()
        except ProcessError:
            return None
        return parent if parent is not None and _is_raylet(parent) else None


def _only_raylet() -> Proc | None:
    """The node's raylet when there is exactly one (a driver attached to a cluster started apart)."""
    raylets = [p for p in all_processes() if _is_raylet(p)]
    return raylets[0] if len(raylets) == 1 else None


def _driver_above(raylet: Proc) -> Proc | None:
    """The driver that started this local cluster (the raylet's Python ancestor), if any."""
    for parent in _safe_parents(raylet):
        if _loads_ray(parent):
            return parent
    return None


def _driver_job_id(driver: Proc, logs: Path | None) -> str | None:
    """The driver's Ray job id, from its core log's name (``python-core-driver-<job id>ff…_<pid>.log``)."""
    if logs is None:
        return None
    for path in logs.glob(f"python-core-driver-*_{driver.pid}.log"):
        return path.name.split("-")[3][:8]
    return None


def _safe_parents(proc: Proc) -> list[Proc]:
    try:
        return proc.parents()
    except ProcessError:
        return []


def _safe_children(proc: Proc, recursive: bool = True) -> list[Proc]:
    try:
        return proc.children(recursive=recursive)
    except ProcessError:
        return []

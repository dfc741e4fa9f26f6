"""The job found from a PID, rediscovered when its processes change (ranks restart, exit)."""

from __future__ import annotations

import time
from dataclasses import replace

from . import procfs
from .proc import Proc, ProcessError, ProcessGone
from .discover import describe_job, find_by_store, find_job, maybe_partial
from .process import JobProcesses

# A job found through its store is looked for again when a rank is gone, and, while fewer ranks
# are connected than its world holds (one that never joined), at most this often: a scan reads
# every Python process's fds.
RESCAN_S = 5.0


class JobWatch:
    """``job``: the job as last discovered. Raises ``TrainwatchError`` subclasses for a bad PID."""

    def __init__(self, pid: int) -> None:
        self.job = find_job(pid)
        self._family: frozenset[int] | None = None  # the job's descendant PIDs at the last discovery
        self._scanned = time.monotonic()  # when a job found through its store was last looked for

    def current(self) -> JobProcesses:
        """The job now: the same record while its processes are the same, no ranks once it ended."""
        if self.job.found_by == "store":
            return self._through_store()
        try:
            root = Proc(self.job.root_pid)
            if root.state() == "Z":
                raise ProcessGone(root.pid, "a zombie")
            if root.create_time() != self.job.started_at and self.job.started_at:
                raise ProcessGone(root.pid, "its PID was reused")
        except ProcessError:
            return replace(self.job, ranks=(), waiting_rendezvous=False)  # the job has ended
        family = procfs.descendant_pids(root.pid)
        if family is not None and family == self._family and not any(
                procfs.state_letter(r.pid) in (None, "Z", "X") for r in self.job.ranks):
            return self.job  # the same processes as last time: nothing to rediscover
        self._family = family
        job = describe_job(root, self.job.launcher)
        if maybe_partial(job, root):  # a driver whose actors joined their store since (or a rank's peers)
            found = find_by_store(root)
            if found is not None:
                self.job = found
                return found
        old = self.job  # ranks that already exited no longer show their environment: keep the layout
        self.job = replace(job, notes=old.notes, world_size=job.world_size or old.world_size,
                           local_world_size=job.local_world_size or old.local_world_size,
                           nnodes=job.nnodes or old.nnodes, master_addr=job.master_addr or old.master_addr,
                           master_port=job.master_port or old.master_port, job_id=job.job_id or old.job_id,
                           run_dir=job.run_dir or old.run_dir)
        return self.job

    def _through_store(self) -> JobProcesses:
        """A job whose ranks were found through their store, not under a launcher: the same record
        while every rank lives and the world is whole; else found again from its store (bounded)."""
        alive = [r for r in self.job.ranks if procfs.state_letter(r.pid) not in (None, "Z", "X")]
        whole = len(alive) == len(self.job.ranks) >= (self.job.local_world_size or len(self.job.ranks))
        now = time.monotonic()
        if whole or (len(alive) == len(self.job.ranks) and now - self._scanned < RESCAN_S):
            return self.job
        self._scanned = now
        starts = [self.job.root_pid, *(r.pid for r in alive)]
        for pid in starts:
            try:
                start = Proc(pid)
                if start.state() == "Z":
                    continue
            except ProcessError:
                continue  # gone: another of the job's processes still leads to its store
            job = find_by_store(start, previous=self.job, address=self._elsewhere())
            if job is not None:
                self.job = replace(job, root_pid=self.job.root_pid, cmdline=self.job.cmdline,
                                   started_at=self.job.started_at,
                                   world_size=max(job.world_size or 0, self.job.world_size or 0) or None)
                return self.job
        # no store any more: the job is ending; the ranks still alive are what is left of it
        self.job = replace(self.job, ranks=tuple(alive))
        return self.job

    def _elsewhere(self) -> tuple[str, int] | None:
        """The store's address when another node serves it: the ranks here are the processes
        connected to it (none of them serves it, so none leads to it)."""
        rdzv = self.job.rendezvous
        if rdzv is None or rdzv.served_here or not self.job.master_addr or not self.job.master_port:
            return None
        return self.job.master_addr, self.job.master_port

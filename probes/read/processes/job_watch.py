"""The job found from a PID, rediscovered when its processes change (ranks restart, exit)."""

from __future__ import annotations

from dataclasses import replace

from . import procfs
from .proc import Proc, ProcessError, ProcessGone
from .discover import describe_job, find_job
from .process import JobProcesses


class JobWatch:
    """``job``: the job as last discovered. Raises ``TrainwatchError`` subclasses for a bad PID."""

    def __init__(self, pid: int) -> None:
        self.job = find_job(pid)
        self._family: frozenset[int] | None = None  # the job's descendant PIDs at the last discovery

    def current(self) -> JobProcesses:
        """The job now: the same record while its processes are the same, no ranks once it ended."""
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
        old = self.job  # ranks that already exited no longer show their environment: keep the layout
        self.job = replace(job, notes=old.notes, world_size=job.world_size or old.world_size,
                           local_world_size=job.local_world_size or old.local_world_size,
                           nnodes=job.nnodes or old.nnodes, master_addr=job.master_addr or old.master_addr,
                           master_port=job.master_port or old.master_port, job_id=job.job_id or old.job_id,
                           run_dir=job.run_dir or old.run_dir)
        return self.job

"""This node's ranks as evidence records for one poll: the live ones as sampled, the exited
ones as the exit ledger knows them, the missing ones, each with its GPU."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from .errors import AccessDenied, ToolMissing
from .observed import ObservedRank, SharedStill
from .read.processes import kernel_view, procfs, stillness
from .read.processes.discover import expected_local_ranks
from .read.processes.exits import ExitLedger
from .read.gpus.gpu import GpuProbe
from .read.processes.process import JobProcesses, RankProcess, collective_timeout_s
from .read.stacks.sampler import StackSample
from .read.processes.usage import CpuMeter
from .sampling import Sampler
from .snapshot import HostInfo, KernelState

MAX_LOG_FILES = 32  # log files whose tail each poll reads: bounded for jobs with a file per rank

class LocalEvidence:
    """Remembers every rank process ever seen (exits, restarts) and each one's CPU time."""

    def __init__(self, sampler: Sampler, exits: ExitLedger, gpu: GpuProbe | None) -> None:
        self.sampler, self.exits, self.gpu = sampler, exits, gpu
        self.seen: dict[int, RankProcess] = {}  # pid -> rank process, everything ever seen
        self._cpu = CpuMeter()
        self._io: dict[int, int] = {}  # pid -> storage bytes read + written at the last poll
        self._elsewhere: dict[int, SharedStill | None] = {}  # pid -> what another trainwatch had left of it

    def cpu_baseline(self, job: JobProcesses) -> None:
        """A CPU reading now, so the first snapshot has CPU% too."""
        for proc in job.ranks:
            self._cpu.read(proc.pid, time.time())

    def ranks(self, job: JobProcesses, samples: dict[int, StackSample], now: float, warnings: list[str],
              notes: list[str]) -> tuple[list[ObservedRank], HostInfo | None]:
        """Every rank of ``job`` (and every rank seen before) as evidence, and this host's GPUs."""
        evidence: list[ObservedRank] = []
        alive = set()
        self.exits.note_job(job)
        for proc in job.ranks:
            self.seen.setdefault(proc.pid, proc)
            zombie = procfs.zombie_exit(proc.pid)
            sample = samples.get(proc.pid)
            if zombie is not None or (sample is not None and sample.gone):
                self.exits.record(proc, zombie, now)
                continue
            alive.add(proc.pid)
            evidence.append(self._rank(proc, sample, now, notes))
        for pid, proc in self.seen.items():  # ranks seen before and gone now
            if pid not in alive:
                self.exits.record(proc, procfs.zombie_exit(pid), now)
        evidence = self._with_exits(evidence, job, now)
        evidence += _missing(job, evidence)
        evidence = self._with_log_tails(evidence)
        host, evidence = self._with_gpu(job, evidence, warnings, notes)
        notes += self._restarts(evidence)
        self._forget_restarted(evidence)
        return evidence, host

    def _with_log_tails(self, evidence: list[ObservedRank]) -> list[ObservedRank]:
        """Each rank's telling log tail, for the ranks of the first ``MAX_LOG_FILES`` log files (in
        rank order): the views show it, here and on a viewer on another node."""
        order = sorted(evidence, key=lambda r: (r.rank is None, r.rank or 0))
        files = set(list(dict.fromkeys(r.log_path for r in order if r.log_path))[:MAX_LOG_FILES])
        return [replace(r, log_tail=self.exits.logs.shown_tail(r.log_path, r.rank, r.local_rank))
                if r.log_path in files else r for r in evidence]

    def _forget_restarted(self, evidence: list[ObservedRank]) -> None:
        """Keep per-PID state for the ranks shown and, per rank number, the process before its
        latest restart (for the restart note); forget every older one, here and in the sampler."""
        shown = {r.pid for r in evidence if r.pid is not None}
        previous: dict[int, RankProcess] = {}
        for pid, proc in self.seen.items():
            if pid not in shown and proc.rank is not None:
                known = previous.get(proc.rank)
                if known is None or (proc.create_time, pid) > (known.create_time, known.pid):
                    previous[proc.rank] = proc
        keep = shown | {proc.pid for proc in previous.values()}
        for pid in [p for p in self.seen if p not in keep]:
            del self.seen[pid]
            self._io.pop(pid, None)
            self._elsewhere.pop(pid, None)
            self._cpu.forget(pid)
            self.exits.forget(pid)
        self.sampler.forget_except(keep, {r.log_path for r in evidence if r.log_path})

    def _rank(self, proc: RankProcess, sample: StackSample | None, now: float, notes: list[str]) -> ObservedRank:
        threads = self.sampler.stacks.get(proc.pid, ())
        cls = self.sampler.classes.get(proc.pid)
        failed = sample is not None and sample.error is not None
        if failed:
            notes.append(f"rank {proc.rank}: {sample.error.message}")
            if isinstance(sample.error, (AccessDenied, ToolMissing)) and sample.error.remedy:
                notes.append(f"  hint: {sample.error.remedy}")
        if sample is not None and sample.read:
            notes.append(f"rank {proc.rank}: {sample.read}")
        step, period, held = self.sampler.steps.fields(proc.pid)
        cpu, rss = self._cpu.read(proc.pid, now)
        kernel = sample.kernel if sample is not None and sample.kernel is not None else kernel_view.kernel_state(proc.pid)
        self._io_progress(proc.pid, kernel, now)
        return ObservedRank(
            rank=proc.rank, pid=proc.pid, host=socket.gethostname(), local_rank=proc.local_rank,
            container_pid=proc.container_pid,
            phase=cls.phase if cls else "unknown",
            op=cls.op if cls else None,
            where=cls.where if cls else None,
            user_frame=cls.user_frame if cls else None,
            sampled=not failed,
            cpu_pct=cpu, rss_bytes=rss, threads=threads,
            children=proc.children, log_path=proc.log_path,
            detail="; ".join(d for d in (cls.detail if cls else None, sample.read if sample else None) if d) or None,
            step=step, step_period_s=period, step_held_s=held,
            native=bool(threads) and any(f.native for t in threads[:1] for f in t.frames),
            log=self.sampler.log_activity(proc.log_path, now),
            collective_timeout_s=collective_timeout_s(proc.env or {}),
            kernel=kernel,
            progress_seen=self.sampler.watch.take_signs(proc.pid),
            watched_since=self.sampler.watch.first_seen(proc.pid),
            first_look=self.sampler.watch.first_look(proc.pid),
            still_elsewhere=self._shared_still(proc.pid),
        )

    def _shared_still(self, pid: int) -> SharedStill | None:
        """What another trainwatch process on this node had established of ``pid`` (read once, when
        this one first looked at it)."""
        if pid not in self._elsewhere:
            self._elsewhere[pid] = stillness.read_shared(pid)
        return self._elsewhere[pid]

    def _io_progress(self, pid: int, kernel: KernelState | None, now: float) -> None:
        """A rank in a file read or write whose storage counters grew is making progress (a big
        checkpoint, a slow data shard), however still its stack."""
        if kernel is None or kernel.read_bytes is None or kernel.write_bytes is None:
            return
        moved = kernel.read_bytes + kernel.write_bytes
        before = self._io.get(pid)
        self._io[pid] = moved
        if before is not None and moved > before and kernel.syscall in kernel_view.FILE_CALLS:
            self.sampler.watch.mark(pid, now)

    def _with_exits(self, ranks: list[ObservedRank], job: JobProcesses, now: float) -> list[ObservedRank]:
        """Live ranks (a lingering one that raised carries its exception) and exited ones (with their last step)."""
        merged = self.exits.ranks(ranks, job, self.seen, self.sampler.classes, self.sampler.stacks, now)
        clock = self.sampler.steps.clock
        return [replace(r, step=clock.step(r.pid)) if r.seen == "exited" and r.step is None and r.pid else r
                for r in merged]

    def _restarts(self, ranks: list[ObservedRank]) -> list[str]:
        notes = []
        for rank in ranks:
            if rank.seen == "exited":
                continue
            old = [p for p, proc in self.seen.items() if proc.rank == rank.rank and p != rank.pid]
            notes.extend(f"rank {rank.rank} restarted: PID {pid} -> {rank.pid}" for pid in old)
        return notes

    def _with_gpu(self, job: JobProcesses, ranks: list[ObservedRank], warnings: list[str],
                  notes: list[str]) -> tuple[HostInfo | None, list[ObservedRank]]:
        if self.gpu is None:
            return None, ranks
        try:
            reading = self.gpu.read(job.ranks, job.launcher)
        except Exception as exc:  # noqa: BLE001 - the GPU probe must never take the snapshot down
            notes.append(f"GPU probe failed: {exc}")
            return None, ranks
        warnings += list(reading.warnings)
        notes += list(reading.notes)
        ranks = [replace(r, gpu=reading.per_pid.get(r.pid)) if r.pid in reading.per_pid else r for r in ranks]
        return reading.host, ranks


def _missing(job: JobProcesses, ranks: list[ObservedRank]) -> list[ObservedRank]:
    present = {r.rank for r in ranks}
    return [ObservedRank(rank=g, host=socket.gethostname(), local_rank=local, seen="missing")
            for local, g in sorted(expected_local_ranks(job).items()) if g not in present]

"""A live view of one local job: each ``poll()`` returns a fresh Snapshot, remembering what came before."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import psutil

from .errors import AccessDenied, ToolMissing
from .evidence.watcher import CrashThread
from .judge.gpu_warnings import gpu_phase_warnings
from .judge.judgement import JudgeMemory, JudgeOptions, judge_job
from .judge.native import PARALLEL as NATIVE_PARALLEL, NativeCache, resolve_natively
from .judge.phases import Classification, classify, is_stdlib, is_user, main_thread, stack_signature, where_frame
from .judge.steps import StepReader, slow_step_warnings
from .observed import ObservedJob, ObservedRank, ObservedRas
from .read import procfs, ras
from .read.collective_feed import CollectiveFeed
from .read.discover import describe_job, expected_local_ranks, find_job
from .read.exits import ExitLedger
from .read.gpu import GpuProbe
from .read.loggrowth import LogGrowth, LogGrowthWatch
from .read.process import JobProcesses, RankProcess, collective_timeout_s, job_record
from .read.pyspy import find_pyspy
from .read.sampler import StackSample, sample_all
from .read.source_lines import source_line
from .read.usage import CpuMeter
from .snapshot import PROBLEM_VERDICTS, LogActivity, Rank, Snapshot, compact_ranks

FULL_REFRESH_EVERY = 5  # every few polls, dump every rank anyway (other threads, stale lines)


class LocalSource:
    """Samples the job found from ``pid``. Not thread-safe: one poll at a time (the app ensures it)."""

    def __init__(self, pid: int, window: float = 3.0, samples: int = 3, gpu: bool = True,
                 catch_crashes: bool = False, stuck_after: float | None = None, auto_native: bool = True,
                 collective_wait: float = 0.0) -> None:
        """``collective_wait``: one-shot callers (``snapshot``) wait up to this long in each poll
        for the ranks' Flight Recorder; 0 (live views): never wait, use what was fetched.
        ``stuck_after``: a fixed stuck threshold in seconds instead of each rank's own rhythm.
        ``auto_native``: off judges from Python stacks alone (for comparison)."""
        self.job = find_job(pid)
        self.window = max(0.0, window)
        self.samples = max(1, samples) if self.window > 0 else 1
        self.memory = JudgeMemory()  # progress, tie-break places and the last verdict, across polls
        self._native = NativeCache()
        self.auto_native = auto_native
        self._workers: dict[tuple[int, tuple], str | None] = {}  # (pid, stack) -> stuck DataLoader worker
        self.stuck_after = stuck_after
        self._steps = StepReader(every=FULL_REFRESH_EVERY)
        self._stacks: dict[int, tuple] = {}
        self._class: dict[int, Classification] = {}
        self._seen: dict[int, RankProcess] = {}  # pid -> rank process, everything ever seen
        self._exits = ExitLedger(self.job.root_pid, self.job.run_dir)  # deaths, first to die, lingering crashes
        self._cpu = CpuMeter()
        self._polls = 0
        self._pyspy_missing: ToolMissing | None = None
        self._family: frozenset[int] | None = None  # the job's descendant PIDs at the last discovery
        self._gpu = GpuProbe() if gpu else None
        self._lock = threading.Lock()
        self._catcher = CrashThread(self.job.root_pid, self.job.run_dir) if catch_crashes else None
        self._collective_wait = collective_wait
        self._feed = CollectiveFeed(lambda: self.job)  # fetches while the first window is sampled
        self._logs = LogGrowthWatch()
        self._growth: dict[str, LogGrowth] = {}  # path -> its growth at the last look
        self._ras_read: dict[float, tuple[ObservedRas, str | None]] = {}  # RAS replies read, by when asked

    def close(self) -> None:
        self._feed.close()
        if self._catcher is not None:
            self._catcher.stop()
        if self._gpu is not None:
            self._gpu.close()

    @contextmanager
    def paused_judgement(self) -> Iterator[None]:
        """Hold polls while something else samples the ranks (an evidence dump): its py-spy
        attaches wake every thread, which must not count as the ranks' progress."""
        with self._lock:
            try:
                yield
            finally:
                for proc in self.job.ranks:
                    self.memory.progress.rebaseline(proc.pid, procfs.thread_counters(proc.pid))

    # -- polling ---------------------------------------------------------------------------
    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        """Rediscover, sample (several times within the window on the first poll), analyse."""
        with self._lock:
            notes: list[str] = list(self.job.notes)
            job = self._rediscover() if self._polls else self.job  # the constructor just discovered it
            rounds = self.samples if self._polls == 0 else 1
            pause = self.window / (rounds - 1) if rounds > 1 else 0.0
            if self._polls == 0 and rounds > 1:
                for proc in job.ranks:
                    self._cpu.read(proc.pid, time.time())  # a CPU baseline, so the first snapshot has CPU% too
            samples: dict[int, StackSample] = {}
            first_done = 0.0
            for i in range(rounds):
                if i:  # on a schedule from the first round: sampling time (native dumps too) comes out of the pause
                    time.sleep(max(0.0, first_done + i * pause - time.monotonic()))
                samples = self._sample(job, native_for, resolve=i >= rounds - 2)
                first_done = first_done or time.monotonic()
            self._polls += 1
            self._take_crash_records()
            return self._build(job, samples, notes)

    def _take_crash_records(self) -> None:
        """The crash catcher's findings (signal, faulthandler frame, fatal message) win over ours."""
        if self._catcher is not None:
            self._exits.adopt(self._catcher.records())

    def _rediscover(self) -> JobProcesses:
        try:
            root = psutil.Process(self.job.root_pid)
            if root.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(root.pid)
            if root.create_time() != self.job.started_at and self.job.started_at:
                raise psutil.NoSuchProcess(root.pid)  # PID reused
        except psutil.Error:
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

    def _sample(self, job: JobProcesses, native_for: frozenset[int], resolve: bool = True) -> dict[int, StackSample]:
        """One sampling round. ``resolve``: take native samples where needed (the last two rounds of a
        poll: the first of them finds an unchanged stack, its dumps overlap the pause before the last,
        which then reuses them from the cache)."""
        try:
            find_pyspy()
            self._pyspy_missing = None
        except ToolMissing as exc:  # one clear line for the whole job, not one per rank
            self._pyspy_missing = exc
            return {}
        requests = []
        for proc in job.ranks:
            if procfs.state_letter(proc.pid) in (None, "Z", "X"):
                continue
            native = proc.rank in native_for
            counters = procfs.thread_counters(proc.pid)
            skip = self._polls % FULL_REFRESH_EVERY and not self.memory.progress.needs_dump(proc.pid, counters)
            requests.append((proc.pid, native, self._stacks.get(proc.pid), bool(skip), counters))
        samples = sample_all(requests, locals_for=self._steps_due(requests))
        now = time.time()
        self._read_steps(samples, now)
        classified = {pid: classify(sample.threads, source_line) for pid, sample in samples.items()
                      if sample.threads is not None}
        take = lambda pids: sample_all([(pid, True, None, False, None) for pid in pids],  # noqa: E731
                                       parallel=NATIVE_PARALLEL)
        if self.auto_native and resolve:
            samples, classified = resolve_natively(samples, classified, self._native, self.memory.progress, now, take,
                                                           source_line)
        for pid, cls in classified.items():
            sample = samples[pid]
            self._stacks[pid] = sample.threads
            self._class[pid] = cls
            self.memory.progress.observe(pid, stack_signature(main_thread(sample.threads)), cls.phase, sample.before,
                                 sample.after, now, dumped=not sample.reused)
        self._look_at_logs(job, now)
        return samples

    def _look_at_logs(self, job: JobProcesses, now: float) -> None:
        """One stat per log file; a rank's own log that grew is that rank's progress."""
        self._exits.note_job(job)  # who writes which file: growth of a shared one is nobody's in particular
        looked = {path: self._logs.look(path) for path in {p.log_path for p in job.ranks if p.log_path}}
        self._growth.update({path: growth for path, growth in looked.items() if growth is not None})
        for proc in job.ranks:
            growth = looked.get(proc.log_path) if proc.log_path else None
            if growth is not None and growth.grew and self._exits.logs.own(growth.path):
                self.memory.progress.mark_progress(proc.pid, now)

    # -- building the snapshot -----------------------------------------------------------------
    def _build(self, job: JobProcesses, samples: dict[int, StackSample], notes: list[str]) -> Snapshot:
        """This poll's evidence, judged by ``judge_job``, as a snapshot."""
        now = time.time()
        warnings: list[str] = []
        evidence: list[ObservedRank] = []
        alive_pids = set()
        self._exits.note_job(job)
        if self._collective_wait:
            self._feed.refresh()  # a second take after the window: RAS judges across two
        collectives = self._feed.wait(self._collective_wait) if self._collective_wait else self._feed.state()
        ras_seen = self._ras_evidence(job, notes)
        for proc in job.ranks:
            self._seen.setdefault(proc.pid, proc)
            zombie = procfs.zombie_exit(proc.pid)
            sample = samples.get(proc.pid)
            if zombie is not None or (sample is not None and sample.gone):
                self._record_exit(proc.pid, zombie, now)
                continue
            alive_pids.add(proc.pid)
            evidence.append(self._rank_evidence(proc, sample, now, notes))
        for pid, proc in self._seen.items():  # ranks seen before and gone now
            if pid not in alive_pids:
                self._record_exit(pid, procfs.zombie_exit(pid), now)
        evidence = self._merge_exits(evidence, job, now)
        evidence += self._missing(job, evidence)
        gpu_host, evidence = self._add_gpu(job, evidence, warnings, notes)
        self._restarts(evidence, notes)
        unsampled = self._pyspy_missing.message if self._pyspy_missing is not None else None
        judged = judge_job(ObservedJob(job_record(job), tuple(evidence), collectives, unsampled, ras_seen),
                           self.memory, now, JudgeOptions(window=self.window, stuck_after=self.stuck_after))
        ranks = [self._with_worker(rank) for rank in judged.ranks]
        if not self._collective_wait:  # the next fetch, knowing whether a stuck episode (pipe dumps) is on
            self._feed.refresh(stuck=any(r.state == "stuck" for r in ranks))
        if self._pyspy_missing is not None:
            warnings.append(str(self._pyspy_missing))
        warnings += _launch_warnings(job)
        if self._gpu is not None:
            warnings += list(gpu_phase_warnings(ranks))
        warnings += slow_step_warnings(ranks, self._steps.clock, self.window)
        return Snapshot(
            job=job_record(job),
            ranks=tuple(ranks),
            groups=judged.groups,
            verdict=judged.verdict,
            hosts=(gpu_host,) if gpu_host else (),
            collectives=judged.collectives,
            warnings=tuple(dict.fromkeys(warnings)),
            notes=tuple(dict.fromkeys(notes)),
            taken_at=now,
            window_s=self.window,
            source="live",
        )

    def _ras_evidence(self, job: JobProcesses, notes: list[str]) -> tuple[ObservedRas, ...]:
        """NCCL RAS's recent replies as evidence: this job's reports; another job's (or an unreadable
        one) as none, with a note that lasts until the next reply. A refused connection (no RAS)
        says nothing."""
        seen = []
        for reply, at in self._feed.ras_recent():
            if at not in self._ras_read:
                pids = {p.pid for p in job.ranks}
                whose = ras.ownership(reply.report, pids) if reply.report is not None else None
                note = whose or (f"NCCL RAS: {reply.note}" if reply.raw and reply.note else None)
                names = tuple(ras.local_names().items()) if reply.report is not None and not whose else ()
                self._ras_read = {a: v for a, v in self._ras_read.items() if a > at - 60.0}
                self._ras_read[at] = (ObservedRas(reply.origin, at, None if whose else reply.report, names), note)
            seen.append(self._ras_read[at])
        if seen and seen[-1][1]:
            notes.append(seen[-1][1])
        return tuple(observed for observed, _ in seen)

    def _rank_evidence(self, proc: RankProcess, sample: StackSample | None, now: float,
                       notes: list[str]) -> ObservedRank:
        threads = self._stacks.get(proc.pid, ())
        cls = self._class.get(proc.pid)
        failed = sample is not None and sample.error is not None
        if failed:
            notes.append(f"rank {proc.rank}: {sample.error.message}")
            if isinstance(sample.error, (AccessDenied, ToolMissing)) and sample.error.remedy:
                notes.append(f"  hint: {sample.error.remedy}")
        step, period = self._steps.fields(proc.pid)
        cpu, rss = self._cpu.read(proc.pid, now)
        return ObservedRank(
            rank=proc.rank, pid=proc.pid, host=socket.gethostname(), local_rank=proc.local_rank,
            phase=cls.phase if cls else "unknown",
            op=cls.op if cls else None,
            where=cls.where if cls else None,
            user_frame=cls.user_frame if cls else None,
            sampled=not failed,
            cpu_pct=cpu, rss_bytes=rss, threads=threads,
            children=proc.children, log_path=proc.log_path,
            detail=cls.detail if cls else None, step=step, step_period_s=period,
            native=bool(threads) and any(f.native for t in threads[:1] for f in t.frames),
            log=self._log_activity(proc.log_path, now),
            collective_timeout_s=collective_timeout_s(proc.env or {}),
        )

    def _log_activity(self, path: str | None, now: float) -> LogActivity | None:
        growth = self._growth.get(path) if path else None
        if growth is None:
            return None
        return LogActivity(age_s=round(max(0.0, now - growth.last_write_at), 1), every_s=growth.usual_every_s,
                           longest_s=growth.longest_s, own=self._exits.logs.own(growth.path), bar_s=growth.bar_s)

    def _with_worker(self, rank: Rank) -> Rank:
        """A rank stuck waiting for its DataLoader: name the worker that holds it up (sampled once per stack)."""
        if rank.state != "stuck" or rank.phase != "dataloader" or not rank.children or rank.pid is None:
            return rank
        key = (rank.pid, stack_signature(main_thread(rank.threads)))
        if key not in self._workers:
            self._workers[key] = busy_worker(rank.children)
        found = self._workers[key]
        return replace(rank, detail=found) if found else rank

    # -- steps (probes/judge/steps.py) ---------------------------------------------------------------
    def _steps_due(self, requests: list) -> frozenset[int]:
        """Ranks whose step-like locals this sampling round reads, with --locals in the same pass:
        every round of the first window and of the full refreshes (every rank is dumped then
        anyway), every poll while the verdict is a problem; see StepReader.due."""
        self._steps.next_round()
        last = self.memory.verdict
        problem = last is not None and last.kind in PROBLEM_VERDICTS
        force, now = self._polls % FULL_REFRESH_EVERY == 0 or problem, time.time()
        return frozenset(pid for pid, native, _prev, _skip, counters in requests
                         if not native and self._steps.due(pid, counters, now, force=force))

    def _read_steps(self, samples: dict[int, StackSample], now: float) -> None:
        for pid, sample in samples.items():
            if sample.ints is not None and sample.threads:
                self._steps.observe(pid, main_thread(sample.threads).frames, sample.ints, sample.after, sample.at or now)

    def _record_exit(self, pid: int, zombie: tuple[int | None, str | None] | None, now: float) -> None:
        self._exits.record(self._seen[pid], zombie, now)

    def _merge_exits(self, ranks: list[ObservedRank], job: JobProcesses, now: float) -> list[ObservedRank]:
        """Live ranks (a lingering one that raised carries its exception) and exited ones (with their last step)."""
        merged = self._exits.ranks(ranks, job, self._seen, self._class, self._stacks, now)
        return [replace(r, step=self._steps.clock.step(r.pid)) if r.seen == "exited" and r.step is None and r.pid
                else r for r in merged]

    def _missing(self, job: JobProcesses, ranks: list[ObservedRank]) -> list[ObservedRank]:
        present = {r.rank for r in ranks}
        return [ObservedRank(rank=g, host=socket.gethostname(), local_rank=local, seen="missing")
                for local, g in sorted(expected_local_ranks(job).items()) if g not in present]

    def _restarts(self, ranks: list[ObservedRank], notes: list[str]) -> None:
        for rank in ranks:
            if rank.seen == "exited":
                continue
            old = [p for p, proc in self._seen.items() if proc.rank == rank.rank and p != rank.pid]
            notes.extend(f"rank {rank.rank} restarted: PID {pid} -> {rank.pid}" for pid in old)

    def _add_gpu(self, job: JobProcesses, ranks: list[ObservedRank], warnings: list[str], notes: list[str]):
        if self._gpu is None:
            return None, ranks
        try:
            reading = self._gpu.read(job.ranks, job.launcher)
        except Exception as exc:  # the GPU probe must never take the snapshot down
            notes.append(f"GPU probe failed: {exc}")
            return None, ranks
        warnings += list(reading.warnings)
        notes += list(reading.notes)
        ranks = [replace(r, gpu=reading.per_pid.get(r.pid)) if r.pid in reading.per_pid else r for r in ranks]
        return reading.host, ranks


def busy_worker(children: tuple[int, ...]) -> str | None:
    """``DataLoader worker PID 812 is in dataset.py:40 __getitem__``: the first worker busy outside the
    worker loop's queue wait (in user code, else in any library), from one bounded plain dump each."""
    samples = sample_all([(pid, False, None, False, None) for pid in children[:8]], parallel=4)
    for pid in sorted(samples):
        main = main_thread(samples[pid].threads)
        frame = next((f for f in main.frames if is_user(f)), None) or where_frame(main.frames) if main else None
        if frame is not None and not is_stdlib(frame) and "torch/utils/data/" not in frame.file:
            return f"DataLoader worker PID {pid} is in {frame.label()}"
    return None


def _launch_warnings(job: JobProcesses) -> list[str]:
    out = []
    if job.world_size and job.local_world_size and job.world_size > job.local_world_size:
        local = compact_ranks(r.rank for r in job.ranks if r.rank is not None)
        out.append(f"job spans {job.nnodes or '?'} nodes (world size {job.world_size}); only this node's ranks "
                   f"({local}) are shown: add --hosts/--slurm to see the others")
    return out


def open_source(pid: int, window: float = 3.0, **kwargs) -> LocalSource:
    """The live source for ``pid`` (with crash capture); raises TrainwatchError subclasses for bad PIDs."""
    kwargs.setdefault("catch_crashes", True)
    return LocalSource(pid, window=window, **kwargs)

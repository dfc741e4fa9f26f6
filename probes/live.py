"""A live view of one local job: each ``poll()`` returns a fresh Snapshot, remembering what came before.

The scheduler over the flow: rediscover the job (``read/processes/job_watch.py``), sample its ranks
(``sampling.py``), gather every rank's evidence (``local_evidence.py``) and the collective
state (``read/collectives/collective_feed.py``), judge it all once (``judge/judgement.py``), and make the
snapshot.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from .judge.judgement import JudgeMemory, JudgeOptions, judge_job
from .judge.phases import is_stdlib, is_user, main_thread, pool_call, stack_signature, where_frame
from .judge.waits import blocked_on
from .local_evidence import LocalEvidence
from .observed import ObservedJob, ObservedRank, SharedStill
from .read.processes import exit_events, kernel_view, procfs, stillness
from .read.collectives.collective_feed import CollectiveFeed
from .read.processes.exits import ExitLedger
from .read.gpus.gpu import GpuProbe
from .read.logs.attempts import AttemptLog, log_dir_of, max_restarts
from .read.processes.discover import expected_local_ranks
from .read.processes.job_watch import JobWatch
from .read.processes.process import JobProcesses, job_record
from .read.stacks.sampler import StackSample, sample_all
from .sampling import Sampler, io_of, signature_digest
from .snapshot import PROBLEM_VERDICTS, Job, KernelState, Rank, Snapshot
from .source import OneNodeSource

if TYPE_CHECKING:
    from .evidence.crash_catcher import CrashThread


# A first window a viewer's call cuts short is watched for at least this share of it: agents that
# started late answer with the others (streams.FIRST_CALL_S), not a whole window later.
MIN_FIRST_LOOK = 0.5
PEERS_FOR_S = 30.0  # who holds the other end of a blocked rank's pipe, FIFO or socket: looked for again after this


class LocalSource(OneNodeSource):
    """Samples the job found from ``pid``. Not thread-safe: one poll at a time (the app ensures it)."""

    def __init__(self, pid: int, window: float = 3.0, samples: int = 3, gpu: bool = True,
                 catch_crashes: bool = False, stuck_after: float | None = None, auto_native: bool = True,
                 collective_wait: float = 0.0, answer_now: threading.Event | None = None) -> None:
        """``collective_wait``: one-shot callers (``snapshot``) wait up to this long in each poll
        for the collective state; 0 (live views): never wait, use what was read.
        ``stuck_after``: a fixed stuck threshold in seconds instead of each rank's own rhythm.
        ``auto_native``: off judges from Python stacks alone (for comparison).
        ``answer_now``: set when a viewer calls for the first answer (node agents): the first
        window ends then, once at least ``MIN_FIRST_LOOK`` of it was watched."""
        self._watch = JobWatch(pid)
        self.window = max(0.0, window)
        self.samples = max(1, samples) if self.window > 0 else 1
        self.stuck_after = stuck_after
        self.memory = JudgeMemory()  # progress, tie-break places and the last verdict, across polls
        exits = ExitLedger(self.job.root_pid, self.job.run_dir)  # deaths, first to die, lingering crashes
        exits.exit_events = exit_events.shared()  # how DataLoader workers a dying rank names ended
        self._sampler = Sampler(exits, auto_native)
        self._gpu = GpuProbe() if gpu else None
        self._evidence = LocalEvidence(self._sampler, exits, self._gpu)
        self._catcher: CrashThread | None = None
        if catch_crashes:  # not for one-shot snapshots: the catcher's readers load only where it runs
            from .evidence.crash_catcher import CrashThread
            self._catcher = CrashThread(self.job.root_pid, self.job.run_dir)
        self._collective_wait = collective_wait
        # reads while the first window is sampled, from when its py-spy runs have started: its
        # threads would otherwise hold up the start of every run
        self._feed = CollectiveFeed(lambda: self.job, start=False)
        self._workers: dict[tuple[int, tuple], str | None] = {}  # (pid, stack) -> stuck DataLoader worker
        self._peers: dict[tuple, tuple[float, KernelState]] = {}  # (pid, call, target) -> (when, who holds it)
        self._answer_now = answer_now
        self._looked: float | None = None  # the first window as watched, when a call cut it short
        self._polls = 0
        self._problem = False  # the last verdict was a problem: the sampler reads more then
        self._attempt_log = AttemptLog()  # a restarted job's attempts, from its launcher's log
        self._launcher_log: str | None = None
        self._attempt: tuple[int, float | None] | None = None  # the attempt running now, and when it began
        self._lock = threading.Lock()
        self._host = socket.gethostname()

    @property
    def job(self) -> JobProcesses:
        """The job as last discovered."""
        return self._watch.job

    def close(self) -> None:
        self._feed.close()
        if self._catcher is not None:
            self._catcher.stop()
        if self._gpu is not None:
            self._gpu.close()

    def remembered_places(self) -> Mapping[int, frozenset[str]]:
        return self.memory.familiar

    @contextmanager
    def paused_judgement(self) -> Iterator[None]:
        """Hold polls while something else samples the ranks (an evidence dump): its py-spy
        attaches wake every thread, which must not count as the ranks' progress."""
        with self._lock:
            try:
                yield
            finally:
                for proc in self.job.ranks:
                    tid = self._sampler.train_tid.get(proc.pid)
                    self._sampler.watch.rebaseline(proc.pid, procfs.thread_counters(proc.pid, tid))

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        """Rediscover, sample (several times within the window on the first poll), judge."""
        with self._lock:
            notes: list[str] = list(self.job.notes)
            job = self._watch.current() if self._polls else self.job  # the constructor just discovered it
            rounds = self.samples if self._polls == 0 else 1
            pause = self.window / (rounds - 1) if rounds > 1 else 0.0
            if self._polls == 0 and rounds > 1:
                self._evidence.cpu_baseline(job)
            samples: dict[int, StackSample] = {}
            first_done = 0.0
            self._looked = None
            i = 0
            while i < rounds:
                # on a schedule from the first round: sampling time (native dumps too) comes out of the pause
                if i and self._wait_round(first_done, first_done + i * pause):
                    i = rounds - 1  # called for: the last round now
                    self._looked = time.monotonic() - first_done
                samples = self._sampler.round(job, self._polls, native_for, resolve=i >= rounds - 2,
                                              problem=self._problem, started=self._while_sampling)
                first_done = first_done or time.monotonic()
                i += 1
            self._feed.refresh()  # (a no-op once started: if nothing was sampled, it starts here)
            self._polls += 1
            if self._catcher is not None:  # its findings (signal, faulthandler frame, fatal message) win over ours
                self._evidence.exits.adopt(self._catcher.records())
            return self._judged(job, samples, notes)

    def _wait_round(self, first_done: float, due: float) -> bool:
        """Wait until ``due``; True when a viewer called for the first answer meanwhile (then only
        until ``MIN_FIRST_LOOK`` of the window has been watched)."""
        call = self._answer_now
        if call is None or not call.wait(max(0.0, due - time.monotonic())):
            time.sleep(max(0.0, due - time.monotonic()))
            return False
        time.sleep(max(0.0, first_done + MIN_FIRST_LOOK * self.window - time.monotonic()))
        return time.monotonic() < due

    def _while_sampling(self) -> None:
        """What overlaps a round's py-spy runs, once they have started: the collective feed's
        round, and on the first poll NVML's start and first GPM sample (in a thread: NVML can
        block on a failing GPU; the GPU read after the round waits for it)."""
        self._feed.refresh()
        if self._gpu is not None and self._polls == 0:
            threading.Thread(target=self._gpu.prime, name="tw-gpu-prime", daemon=True).start()

    def _judged(self, job: JobProcesses, samples: dict[int, StackSample], notes: list[str]) -> Snapshot:
        """This poll's evidence, judged by ``judge_job``, as a snapshot."""
        now = time.time()
        warnings: list[str] = []
        ranks, gpu_host = self._evidence.ranks(job, samples, now, warnings, notes)
        if self._collective_wait:
            self._feed.refresh()  # a second take after the window: RAS judges across two
            self._feed.wait(self._collective_wait)
        collective = self._feed.evidence(job)
        notes += collective.notes
        missing = self._sampler.pyspy_missing
        record = self._with_attempts(job, job_record(job))
        if any(r.seen == "exited" for r in ranks):  # ranks ended: was the job stopped from outside?
            record = replace(record, stopped_by=self._evidence.exits.launcher_stop(job.launcher_pid))
        evidence = ObservedJob(record, tuple(ranks), unsampled=missing.message if missing else None,
                               **collective.fields)
        window = self._looked if self._looked is not None else self.window  # a first window cut short counts as watched
        options = JudgeOptions(window=window, stuck_after=self.stuck_after)
        judged = judge_job(evidence, self.memory, now, options)
        if judged.read_workers or judged.read_peers:  # the judge asks who holds a rank up: read it, ask again
            read = tuple(self._with_peers(self._with_worker(r, judged.read_workers), judged.read_peers)
                         for r in evidence.ranks)
            if read != evidence.ranks:
                evidence = replace(evidence, ranks=read)
                judged = judge_job(evidence, self.memory, now, options)
        ranked = judged.ranks
        self._share_stillness(ranked, now)
        self._problem = judged.verdict.kind in PROBLEM_VERDICTS
        if not self._collective_wait:  # the next read, knowing whether a stuck episode (pipe dumps) is on
            self._feed.refresh(stuck=any(r.state == "stuck" for r in ranked))
        if missing is not None:
            warnings.append(str(missing))
        warnings += judged.warnings
        return Snapshot(job=record, ranks=ranked, groups=judged.groups, verdict=judged.verdict,
                        hosts=(gpu_host,) if gpu_host else (), collectives=judged.collectives,
                        warnings=tuple(dict.fromkeys(warnings)), notes=tuple(dict.fromkeys(notes)),
                        taken_at=now, window_s=window, source="live")

    def _share_stillness(self, ranks: tuple[Rank, ...], now: float) -> None:
        """Leave what this poll established of each stuck rank for the node's other trainwatch
        processes (``read/processes/stillness.py``); a rank seen progressing clears it."""
        for rank in ranks:
            if rank.pid is None or rank.host != self._host:
                continue
            if rank.state == "stuck" and rank.stuck_for_s is not None:
                signature = self._sampler.watch.signature(rank.pid)
                still = SharedStill(now - rank.stuck_for_s, now, self.memory.progress.still_kinds(rank.pid),
                                    counters=self._sampler.watch.last_counters(rank.pid),
                                    signature=signature_digest(signature) if signature is not None else None,
                                    io=io_of(rank.kernel))
                stillness.write_shared(rank.pid, still)
            elif rank.state == "running":
                stillness.forget_shared(rank.pid)

    def _with_peers(self, rank: ObservedRank, wanted: tuple[int, ...]) -> ObservedRank:
        """Who holds the other end of the pipe, FIFO or socket a stuck rank is blocked on, or the
        children of one waiting in ``subprocess`` (read once per thing it is blocked on)."""
        if rank.pid not in wanted or rank.kernel is None:
            return rank
        key = (rank.pid, rank.kernel.syscall, rank.kernel.target)
        now = time.monotonic()
        self._peers = {k: v for k, v in self._peers.items() if now - v[0] < PEERS_FOR_S}  # holders may change
        if key not in self._peers:
            self._peers[key] = (now, kernel_view.with_peers(rank.pid, rank.kernel))
        found = self._peers[key][1]
        return replace(rank, kernel=replace(rank.kernel, peers=found.peers, peers_known=found.peers_known,
                                            target_kind=found.target_kind, target=found.target))

    def _with_attempts(self, job: JobProcesses, record: Job) -> Job:
        """A job its launcher restarted: the attempt running now, when it began, and how each
        attempt ended, from the ranks' TORCHELASTIC_RESTART_COUNT and the launcher's log."""
        counts = [int(c) for p in job.ranks if (c := p.env.get("TORCHELASTIC_RESTART_COUNT", "")).isdigit()]
        if job.launcher_pid and self._launcher_log is None:
            self._launcher_log = procfs.log_file_of(job.launcher_pid) or ""
        log_dir = next((d for p in job.ranks if (d := log_dir_of(p.log_path))), None)
        ends = self._attempt_log.ends(self._launcher_log, expected_local_ranks(job), job.started_at, log_dir)
        if counts:
            self._attempt = max(counts), min((p.create_time for p in job.ranks if p.create_time), default=None)
        elif ends and len(ends) <= max_restarts(job.cmdline):  # between attempts: the launcher starts the next
            self._attempt = (max(len(ends), self._attempt[0] if self._attempt else 0), None)
        if self._attempt is None or (not self._attempt[0] and not ends):
            return record
        return replace(record, attempt=self._attempt[0], attempt_started_at=self._attempt[1], attempts=ends)

    def _with_worker(self, rank: ObservedRank, wanted: tuple[int, ...]) -> ObservedRank:
        """The busy DataLoader worker of a rank the judge asked about (read once per stack)."""
        if rank.pid not in wanted:
            return rank
        main = main_thread(rank.threads)
        key = (rank.pid, stack_signature(main))
        if key not in self._workers:
            pool = main is not None and pool_call([f for f in main.frames if not f.native]) is not None
            self._workers[key] = busy_worker(rank.children, "pool worker" if pool else "DataLoader worker")
        return replace(rank, dataloader_worker=self._workers[key])


def busy_worker(children: tuple[int, ...], noun: str = "DataLoader worker") -> str | None:
    """``DataLoader worker PID 812 is in dataset.py:40 __getitem__``: the first worker busy outside the
    worker loop's queue wait (in user code, else in any library), from one bounded plain dump each;
    with what the kernel says it is blocked on (``…, waiting for data from FIFO /run/x (tmpfs on
    /run): no process has it open for writing``)."""
    samples = sample_all([(pid, False, None, False, None) for pid in children[:8]], parallel=4)
    for pid in sorted(samples):
        main = main_thread(samples[pid].threads)
        task = _task_frames(main.frames) if main else ()
        frame = next((f for f in task if is_user(f)), None) or where_frame(task) if task else None
        if frame is not None and not is_stdlib(frame) and "torch/utils/data/" not in frame.file:
            kernel = kernel_view.kernel_state(pid)
            blocked = blocked_on(kernel_view.with_peers(pid, kernel)) if kernel is not None and kernel.target else None
            return f"{noun} PID {pid} is in {frame.label()}" + (f", waiting for {blocked}" if blocked else "")
    return None


# A worker process's own loop (a DataLoader's, a Pool's, a Process's start): the frames inner to it
# are its task. Below it, a forked worker still shows the parent's frames it was forked from.
_WORKER_LOOPS = (("torch/utils/data/_utils/worker.py", "_worker_loop"), ("multiprocessing/pool.py", "worker"),
                 ("multiprocessing/process.py", "BaseProcess._bootstrap"))


def _task_frames(frames: tuple) -> tuple:
    """The frames of a worker's task: those inner to its worker loop (all, without one)."""
    for i, frame in enumerate(frames):
        if any(frame.file.endswith(path) and frame.function == name for path, name in _WORKER_LOOPS):
            return frames[:i]
    return frames


def open_source(pid: int, window: float = 3.0, **kwargs) -> LocalSource:
    """The live source for ``pid`` (with crash capture); raises TrainwatchError subclasses for bad PIDs."""
    kwargs.setdefault("catch_crashes", True)
    return LocalSource(pid, window=window, **kwargs)

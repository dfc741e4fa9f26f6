"""Catch rank deaths cheaply and often, before the launcher tears the others down.

:class:`CrashCatcher` reads only /proc (every ~0.2 s); the TUI and ``watch`` call its ``tick()``
between their own polls, :class:`CrashThread` runs it in the background for a live source. A rank
reaped before it looked (torchrun reaps within 0.1 s) is asked of what outlives it, in order: the
kernel's exit event (``read/processes/exit_events.py``, root), the launcher's log (``read/logs/launcher_log.py``),
its memory cgroup's OOM count (``read/processes/cgroup_oom.py``), the kernel log and its own last words
(``read/processes/exits.py``). When nothing says, the death itself is still reported: "vanished between …".
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path


from .. import rundir
from ..errors import TrainwatchError
from ..judge import exits
from ..read.processes import cgroup_oom, exit_events, procfs
from ..read.logs import launcher_log
from ..read.logs.kernlog import kernel_fault
from ..read.processes import exits as ended
from ..read.processes.discover import LAUNCHERS, expected_local_ranks, find_job
from ..read.processes.exits import CrashRecord
from ..read.processes.proc import Proc, ProcessError
from ..read.processes.process import RankProcess
from ..read.logs.ranklog import RankLogs

LATE_S = 10.0  # how long a rank reaped without a word may still be explained by its log
ALONE_S = 2.0  # a rank gone with no word while the others live on this long left the job abnormally
LAUNCHER_LOG_BYTES = 512 * 1024
CRASHES_KEPT = 1024  # crash records kept: the first death and the latest others


def latest_records(records: list[CrashRecord], kept: int = CRASHES_KEPT) -> list[CrashRecord]:
    """The first death and the latest others, at most ``kept`` in all: a job restarting for a week
    does not grow the catcher without end."""
    if len(records) <= kept:
        return records
    first = [r for r in records if r.exit.first][:1]
    others = [r for r in records if not r.exit.first]
    return first + others[len(others) - (kept - len(first)):]


class CrashCatcher:
    """Watches the ranks of the job of ``root_pid`` through /proc and records each abnormal death.

    Ranks are found by ``discover.find_job`` (launchers, mp.spawn, srun-style ranks) whenever the
    job's process family changes; between changes a tick costs a few small /proc reads."""

    def __init__(self, root_pid: int, run_dir: Path | None = None, save_dir: Path | None = None) -> None:
        self.root_pid = root_pid
        self.run_dir = Path(run_dir) if run_dir else None
        self.save_dir = Path(save_dir) if save_dir else None
        self.records: list[CrashRecord] = []
        self.logs = RankLogs()
        self._tracked: dict[int, RankProcess] = {}
        # A container's ranks: the launcher there logs their PIDs in its own namespace (pid -> ours)
        self._ours: dict[int, int] = {}
        self._done: set[int] = set()  # pids already judged
        # Dead with no reason said yet: mp.spawn's parent prints a rank's traceback only after
        # tearing the others down, so the reason may still come (pid -> (rank, status, died at)).
        self._unexplained: dict[int, tuple[RankProcess, tuple | None, float]] = {}
        self._family: frozenset[int] | None = None
        self._job_root: int | None = None
        self._launcher_log: str | None = None
        self._launcher_pid: int | None = None
        self.exit_events = exit_events.shared()
        self._last_alive: dict[int, float] = {}  # pid -> last tick that saw it alive
        self._cgroups: dict[int, tuple[cgroup_oom.MemoryCgroup, int | None]] = {}  # pid -> (cgroup, OOM count)
        # Gone with no word at all (pid -> (rank, when it was found gone)): a crash once the others
        # live on without it, or the launcher's log or status says so; else a normal end.
        self.vanished: dict[int, tuple[RankProcess, float]] = {}
        self._locals: dict[int, int] = {}  # local rank -> global rank on this node (the launcher's layout)
        self._unseen: set[int] = set()  # PIDs of ranks the launcher's log says died, never seen alive here
        self._look_unseen = False  # the family changed: a rank may have died before it was ever seen

    @property
    def rank_pids(self) -> dict[int, int | None]:
        return {pid: proc.rank for pid, proc in self._tracked.copy().items()}

    def tick(self) -> list[CrashRecord]:
        """One cheap pass; returns the deaths found in it (also appended to ``records``)."""
        self._discover()
        new: list[CrashRecord] = []
        now = time.time()
        for pid, proc in list(self._tracked.items()):
            status = procfs.zombie_exit(pid)
            alive = status is None and procfs.state_letter(pid) not in (None, "Z")
            if alive:
                self._last_alive[pid] = now
                self._copy_error_file(proc)
                continue
            del self._tracked[pid]
            self._done.add(pid)
            record = self._judge(proc, status)
            if record is not None:
                new.append(record)
        new.extend(self._vanished_crashes(now))
        if self._look_unseen or not self.job_alive():
            self._look_unseen = False
            new.extend(self._unseen_deaths())
        keep = self._tracked.keys() | self.vanished.keys()  # per-PID state of ranks gone and judged goes
        for known in (self._last_alive, self._cgroups):
            for pid in [p for p in known if p not in keep]:
                del known[pid]
        late = self._explained_late()
        new.extend(r for r in late if r.pid not in {known.pid for known in self.records})
        if new:
            self._mark_first(new)
        return new + [r for r in late if r not in new]

    def wait_for_death(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s, waking at once when a tracked rank exits (the kernel's exit
        events); True when one did. Without exit events: a plain sleep, False."""
        tracked = set(self._tracked.copy())  # copy(): tick() may change it in another thread
        if self.exit_events is None or self.exit_events.unavailable is not None or not tracked:
            time.sleep(timeout)
            return False
        return self.exit_events.wait_any(tracked, timeout) is not None

    def job_alive(self) -> bool:
        return procfs.state_letter(self.root_pid) not in (None, "Z")

    def _discover(self) -> None:
        family = procfs.descendant_pids(self.root_pid)  # a few small reads, not a /proc scan
        if family is None:
            try:
                family = frozenset(p.pid for p in Proc(self.root_pid).children(recursive=True))
            except ProcessError:
                return  # the root is gone: job_alive() says so and the catcher's last tick follows
        if family == self._family:
            return
        self._look_unseen = self._family is not None and bool(self._family - family)
        self._family = family
        try:
            job = find_job(self.root_pid)
        except (TrainwatchError, ProcessError):
            return  # not started yet, or gone: try again when the family changes
        self._job_root = job.root_pid
        if self.run_dir is None and job.run_dir:
            self.run_dir = Path(job.run_dir)
        ranks = ended.infer_ranks(job)
        self._locals = expected_local_ranks(job) or self._locals
        self._done &= {proc.pid for proc in ranks} | self._unseen  # judged and no longer listed: never seen again
        for proc in ranks:
            self.logs.note_writer(proc.pid, proc.log_path)
        if job.launcher_pid:
            self._launcher_pid = job.launcher_pid
            self._launcher_log = procfs.log_file_of(job.launcher_pid) or self._launcher_log
            self.logs.note_writer(job.launcher_pid, self._launcher_log)
        for proc in ranks:
            if proc.container_pid is not None:
                self._ours[proc.container_pid] = proc.pid
            if proc.pid in self._tracked or proc.pid in self._done:
                continue
            if proc.pid not in self._cgroups and (cgroup := cgroup_oom.memory_cgroup(proc.pid)) is not None:
                self._cgroups[proc.pid] = (cgroup, cgroup.oom_kills())
            # a rank already dead when first seen has no environment left: tracked when its
            # number could be inferred (the one missing local rank of a launcher's job)
            inferred = not proc.env and proc.rank is not None and job.launcher in LAUNCHERS
            if "RANK" in proc.env or inferred or (job.launcher == "mp.spawn" and proc.rank is not None):
                self._tracked[proc.pid] = proc

    def _copy_error_file(self, proc: RankProcess) -> str | None:
        """Copy the torchelastic error file as soon as it exists: a restart deletes its folder."""
        src = proc.env.get("TORCHELASTIC_ERROR_FILE")
        if not src or not self.save_dir or not os.path.exists(src):
            return None
        dest = self.save_dir / "crashes" / f"rank{proc.rank}-torchelastic-error.json"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        except OSError:
            return None
        return str(dest)

    def _judge(self, proc: RankProcess, status: tuple[int | None, str | None] | None) -> CrashRecord | None:
        error_copy = self._copy_error_file(proc)
        error_text = ended.read_bounded(error_copy, 256 * 1024) if error_copy else ""
        status, at, source = self._status(proc.pid, status)
        record = ended.read_exit(proc, status, now=at or time.time(), run_dir=self.run_dir, logs=self.logs,
                                 error_text=error_text, clean=self._clean, launcher_log=self._launcher_log)
        info = replace(record.exit, source=record.exit.source or source, last_seen=self._last_alive.get(proc.pid))
        oom = self._oom(proc.pid)
        if oom and info.signal in (None, "SIGKILL") and info.code in (None, 137):
            info = replace(info, signal="SIGKILL", code=None, reason=exits.OOM_KILLED, message=oom,
                           source=info.source or "memory cgroup")
        record = replace(record, exit=info)
        if info.code == 0 and info.signal is None:
            return None
        if info.reason is None:
            self._unexplained[proc.pid] = (proc, status, info.at or time.time())
        if not exits.abnormal(info):
            self.vanished[proc.pid] = (proc, time.time())  # no word yet: decided by what follows
            return None
        return self._save(replace(record, error_file=error_copy))

    def _status(self, pid: int, status: tuple[int | None, str | None] | None
                ) -> tuple[tuple[int | None, str | None] | None, float | None, str | None]:
        """(exit status, when, who said): its zombie, else the kernel's exit event, else the launcher's log."""
        if status is not None:
            return status, None, "zombie"
        heard = self.exit_events.status(pid, wait=0.1) if self.exit_events is not None else None
        if heard is not None:
            return procfs.decode_wait_status(heard[0]), heard[1], "kernel exit event"
        failure = self._launcher_failures().get(pid)
        if failure is not None:
            return (failure.code, failure.signal), failure.at, "launcher log"
        return None, None, None

    def launcher_stop(self) -> str | None:
        """``SIGTERM to the launcher``: a stop from outside, as the launcher's log or its own exit
        status says it (a launcher killed by a signal was stopped; torchrun says it was told to)."""
        said = launcher_log.stop_signal(ended.read_bounded(self._launcher_log, LAUNCHER_LOG_BYTES)) \
            if self._launcher_log else None
        status = self.launcher_status()
        signal = said or (status[1] if status is not None else None)
        return f"{signal} to the launcher" if signal else None

    def _launcher_failures(self) -> dict[int, launcher_log.LauncherFailure]:
        if not self._launcher_log:
            return {}
        failures = launcher_log.failures(ended.read_bounded(self._launcher_log, LAUNCHER_LOG_BYTES))
        return {self._ours.get(pid, pid): failure for pid, failure in failures.items()}

    def _oom(self, pid: int) -> str | None:
        """Why its cgroup says it was OOM-killed, when the count grew since the rank was first seen."""
        known = self._cgroups.get(pid)
        if known is None or known[1] is None:
            return None
        cgroup, before = known
        after = cgroup.oom_kills()
        return cgroup_oom.describe(before, after, cgroup) if after is not None and after > before else None

    def _vanished_crashes(self, now: float) -> list[CrashRecord]:
        """Ranks gone with no word: a crash once the launcher's log names them, or once the job
        went on without them for ``ALONE_S`` (ranks of one job end together)."""
        found = []
        failures = self._launcher_failures() if self.vanished else {}
        for pid, (proc, gone_at) in list(self.vanished.items()):
            failure = failures.get(pid)
            alone = now - gone_at >= ALONE_S and bool(self._tracked) and self.job_alive()
            if failure is None and not alone:
                continue
            del self.vanished[pid]
            if failure is not None:
                status = (failure.code, failure.signal)
                record = ended.read_exit(proc, status, now=failure.at or gone_at, run_dir=self.run_dir,
                                         logs=self.logs, clean=self._clean, launcher_log=self._launcher_log)
                info = replace(record.exit, source="launcher log", last_seen=self._last_alive.get(pid))
                if not exits.abnormal(info):
                    continue
            else:
                record = ended.read_exit(proc, None, now=gone_at, run_dir=self.run_dir, logs=self.logs,
                                         clean=self._clean, launcher_log=self._launcher_log)
                info = replace(record.exit, reason=exits.VANISHED, at=gone_at, last_seen=self._last_alive.get(pid),
                               message=self.vanished_words(pid, gone_at))
            found.append(self._save(replace(record, exit=info)))
        return found

    def rank_numbers_known(self) -> list[int]:
        """Every rank number the catcher has tracked or recorded."""
        known = [p.rank for p in self._tracked.copy().values()] + [r.rank for r in self.records]
        return sorted({n for n in known if n is not None})

    def _unseen_deaths(self) -> list[CrashRecord]:
        """Ranks that died before the catcher ever saw them (before `watch` attached, or between two
        looks at a job still starting): the launcher's log names each (``failed (exitcode: -9)
        local_rank: 2 (pid: …)``, stamped); an armed run's ``hook.json`` says whose PID it was."""
        failures = self._launcher_failures()
        known = set(self._tracked) | self._done | self._unseen | set(self.vanished) | {r.pid for r in self.records}
        fresh = {pid: f for pid, f in failures.items() if pid not in known}
        if not fresh:
            return []
        hooks = {rec.get("pid"): rec.get("rank") for rec in rundir.hook_records(self.run_dir)} if self.run_dir else {}
        found = []
        for pid, failure in sorted(fresh.items(), key=lambda item: item[1].at or 0.0):
            rank = hooks.get(pid) if isinstance(hooks.get(pid), int) else failure.rank
            if rank is None and failure.local_rank is not None:
                rank = self._locals.get(failure.local_rank)
            self._unseen.add(pid)
            proc = RankProcess(pid=pid, rank=rank, local_rank=failure.local_rank)
            heard = self.exit_events.status(pid) if self.exit_events is not None else None
            status = procfs.decode_wait_status(heard[0]) if heard else (failure.code, failure.signal)
            at = heard[1] if heard else failure.at
            record = ended.read_exit(proc, status, now=at or time.time(), run_dir=self.run_dir, logs=self.logs,
                                     clean=self._clean, launcher_log=self._launcher_log)
            info = replace(record.exit, source="kernel exit event" if heard else "launcher log")
            said = kernel_fault(pid) if info.signal == "SIGKILL" and info.reason is None else None
            if said and "Killed process" in said[1]:  # the OOM killer named it (its cgroup is gone with it)
                info = replace(info, reason=exits.OOM_KILLED, message="kernel: " + said[1][:160])
            if exits.abnormal(info):
                found.append(self._save(replace(record, exit=info)))
        return found

    @staticmethod
    def rank_numbers(procs: dict[int, tuple[RankProcess, float]]) -> list[int | None]:
        return [proc.rank for proc, _ in procs.values()]

    def vanished_now(self) -> list[CrashRecord]:
        """Every rank still gone with no word, as crashes (the job ended badly, or how is unknown)."""
        found = []
        for pid, (proc, gone_at) in sorted(self.vanished.items(), key=lambda item: item[1][1]):
            record = ended.read_exit(proc, None, now=gone_at, run_dir=self.run_dir, logs=self.logs,
                                     clean=self._clean, launcher_log=self._launcher_log)
            info = replace(record.exit, reason=exits.VANISHED, at=gone_at, last_seen=self._last_alive.get(pid),
                           message=self.vanished_words(pid, gone_at))
            found.append(self._save(replace(record, exit=info)))
        self.vanished.clear()
        if found:
            self._mark_first(found)
        return found

    def vanished_words(self, pid: int, gone_at: float) -> str:
        """``vanished between 12:03:05 and 12:03:07; no exit status could be read (…)``."""
        seen = self._last_alive.get(pid)
        span = (f"between {clock(seen)} and {clock(gone_at)}" if seen else f"by {clock(gone_at)}")
        why = self.exit_events.unavailable if self.exit_events is not None else "kernel exit events turned off"
        return f"vanished {span}; no exit status could be read ({why or 'no exit event was heard'})"

    def launcher_status(self) -> tuple[int | None, str | None] | None:
        """The launcher's own exit status, once it is gone, where the kernel's exit events say it."""
        if self.exit_events is None:
            return None
        for pid in dict.fromkeys(p for p in (self.root_pid, self._launcher_pid, self._job_root) if p):
            heard = self.exit_events.status(pid)
            if heard is not None:
                return procfs.decode_wait_status(heard[0])
        return None

    def _explained_late(self) -> list[CrashRecord]:
        """Deaths whose reason the log gave after the fact (within ``LATE_S``): new crash records
        for ranks reaped unseen, and recorded crashes now with their reason (``first`` kept)."""
        found = []
        for pid, (proc, status, died_at) in list(self._unexplained.items()):
            record = ended.read_exit(proc, status, now=died_at, run_dir=self.run_dir, logs=self.logs,
                                     clean=self._clean, launcher_log=self._launcher_log)
            if record.exit.reason is not None and exits.abnormal(record.exit):
                known = next((i for i, r in enumerate(self.records) if r.pid == pid), None)
                if known is not None:
                    earlier = self.records[known]
                    record = replace(record, exit=replace(record.exit, first=earlier.exit.first),
                                     error_file=earlier.error_file)
                    self.records[known] = record = self._save(record)
                else:
                    record = self._save(record)
                found.append(record)
            if record.exit.reason is not None or time.time() - died_at > LATE_S:
                del self._unexplained[pid]
        return found

    def _clean(self, text: str) -> str:
        return ended.redactor_for([self.root_pid, self._job_root])(text)

    def _mark_first(self, new: list[CrashRecord]) -> None:
        if any(r.exit.first for r in self.records):
            self.records.extend(new)
            self.records[:] = latest_records(self.records)
            return
        first_pid = exits.first_to_die((r.pid, r.exit) for r in new)
        ordered = sorted(new, key=lambda r: r.pid != first_pid)
        first = replace(ordered[0], exit=replace(ordered[0].exit, first=True))
        self.records.extend([first] + ordered[1:])
        new[:] = [first] + ordered[1:]
        if first.saved_to:
            self._save(first)

    def _save(self, record: CrashRecord) -> CrashRecord:
        """Every record passes here: how the DataLoader workers it names ended, then written out."""
        record = replace(record, exit=ended.with_worker_ends(record.exit, self.exit_events))
        if self.save_dir is None:
            return record
        folder = self.save_dir / "crashes"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{record.rank}-pid{record.pid}.json"
        record = replace(record, saved_to=str(path))
        clean = ended.redacted(record, self._clean)  # what is written leaves trainwatch: no secrets
        path.write_text(json.dumps(dataclasses.asdict(clean), indent=2))
        return record


class CrashThread:
    """Runs the crash catcher every half second, between polls, so a dying rank's status and
    faulthandler frame are caught before the launcher tears the job down."""

    INTERVAL = 0.5

    def __init__(self, root_pid: int, run_dir: str | None = None) -> None:
        self._catcher = CrashCatcher(root_pid, run_dir=Path(run_dir) if run_dir else None)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tw-crash-catcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            with self._lock:
                self._catcher.tick()
            if not self._catcher.job_alive():
                with self._lock:
                    self._catcher.tick()
                return

    def records(self) -> list:
        with self._lock:
            return list(self._catcher.records)

    def stop(self) -> None:
        self._stop.set()


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))

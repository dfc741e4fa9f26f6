"""A dead job's leftovers as evidence, judged by the one judge: ``trainwatch open`` on dumps and logs.

``read/logs/leftovers.py`` finds and reads the files; this module turns each rank's findings into the
same evidence record a live rank has (its last stacks, how it ended, its Flight Recorder trace),
calls ``judge_job``, and serves the snapshot to the same views (``--json``, ``summary.md``, the UI).
A rank of the job that left nothing is kept as ``missing``: the rank that never dumped is often
the one the others waited for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from dataclasses import replace
import time
from contextlib import AbstractContextManager
from pathlib import Path

from ..judge.judgement import JudgeMemory, judge_job
from ..judge.phases import classify
from ..observed import SILENT, UNTOLD, ObservedJob, ObservedRank
from ..read.logs import crashlog, library_words, ranklog
from ..read.collectives import flightrec
from ..read.logs.attempts import attempt_ends, log_dir_of
from ..read.logs.leftovers import Leftovers, RankLeft, read_leftovers
from ..read.processes.exits import job_frame
from ..read.stacks.source_lines import source_line
from ..read.collectives.sources.watchdog import parse_watchdog, watchdog_state
from ..read.stacks.stack_text import faulthandler_threads, main_thread_first, traceback_thread, without_hook_frames
from ..redact import scrub
from ..snapshot import AttemptEnd, CollectiveState, ExitInfo, Job, LibraryError, Snapshot, ThreadStack
from ..source import OneNodeSource
from .bundle_rank import RankEvidence
from .summary import render

SOURCE_PREFIX = "post-mortem:"
UNNAMED_LAUNCHER = "launcher not named in these files"


class PostMortemSource(OneNodeSource):
    """``poll()`` returns the judged snapshot of what the job left (``source="post-mortem:<paths>"``)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self.left = read_leftovers(self.paths)
        self.evidence, self._stacks = observed_job(self.left)
        now = ended_at(self.left)
        if now is None:  # ages of pending collectives cannot be told: say none rather than a wrong one
            self.evidence = dataclasses.replace(self.evidence, collectives=_ageless(self.evidence.collectives),
                                                watchdog=_ageless(self.evidence.watchdog))
        now = now or self.left.newest or time.time()
        judged = judge_job(self.evidence, JudgeMemory(), now)
        notes = [*self.left.notes, *(n for r in self.left.ranks.values() for n in r.notes), *_missing_notes(self.evidence),
                 *_untold_notes(self.evidence)]
        self.snapshot = Snapshot(job=self.evidence.job, ranks=judged.ranks, groups=judged.groups,
                                 verdict=judged.verdict, collectives=judged.collectives, warnings=judged.warnings,
                                 notes=tuple(dict.fromkeys(scrub(n) for n in notes)), taken_at=now,
                                 source=SOURCE_PREFIX + ",".join(str(p) for p in self.paths))

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        return self.snapshot

    def summary(self) -> str:
        """``summary.md`` for the dead job, with what was read and what was missing."""
        evidence = [RankEvidence(rank=r.rank, pid=r.pid or 0, faulthandler=self._stacks.get(r.rank, ("none", ""))[0],
                                 files={"stacks.txt": main_thread_first(self._stacks[r.rank][1])}
                                 if self._stacks.get(r.rank) else {})
                    for r in self.snapshot.ranks if r.rank is not None]
        text = render(self.snapshot, evidence, [], reason="post-mortem of what the job left", redacted=True,
                      sources={})
        read = [f"- {what}: `{path}`" for path, what in self.left.used[:200]]
        more = len(self.left.used) - len(read)
        read += [f"- … and {more} more"] if more > 0 else []
        return text + "\n## Read\n\n" + "\n".join(read) + f"\n\n{self.left.examined:,} files looked at.\n"

    def paused_judgement(self) -> AbstractContextManager[None]:
        """Nothing is sampled: nothing to pause."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing held open."""


def observed_job(left: Leftovers) -> tuple[ObservedJob, dict[int, tuple[str, str]]]:
    """The evidence record of the dead job, and per rank (where its last stacks came from, their text)."""
    numbers = sorted(set(left.ranks) | set(range(left.world_size or 0)))
    by_rank = {f.rank: f for f in left.failures if f.rank is not None}
    host = left.host or socket.gethostname()
    ranks, stacks = [], {}
    logs = ranklog.RankLogs()  # one file several ranks wrote is shared: each is shown its own lines
    for found in left.ranks.values():
        for path in {found.own_log, *found.log_files} - {None}:
            logs.note_writer(found.rank, path)
    for number in numbers:
        found = left.ranks.get(number)
        if found is None or not _has_anything(found):
            ranks.append(ObservedRank(rank=number, host=host, seen="missing"))
            continue
        threads, origin, text = _last_stacks(found)
        if text:
            stacks[number] = (origin, text)
        rank = _rank(found, threads, by_rank.get(number), host, _launcher_status(left), _ended_badly(left))
        ranks.append(dataclasses.replace(rank, log_tail=logs.shown_tail(rank.log_path, number, None)))
    run = left.run or {}
    ends = _attempts(left)
    job = Job(launcher=_launcher(left), pid=int(run.get("pid") or left.launcher_pid or 0), host=host,
              world_size=left.world_size or (max(numbers) + 1 if numbers else None),
              started_at=run.get("started_at"), cmdline=tuple(scrub(a) for a in run.get("command") or ()),
              run_dir=next((p for p, what in left.used if what == "trainwatch run directory"), None),
              attempt=len(ends) - 1 if len(ends) > 1 else None,
              attempt_started_at=ends[-1].started_at if len(ends) > 1 else None,
              attempts=ends if len(ends) > 1 else ())
    return ObservedJob(job, tuple(ranks), collectives=_collectives(left), watchdog=_watchdog(left)), stacks


def _attempts(left: Leftovers) -> tuple[AttemptEnd, ...]:
    """A restarted job's attempts, from the launcher's log that holds the most of them (the last
    one ended the job: the ranks' own files tell it; the ones before are its history)."""
    found: tuple[AttemptEnd, ...] = ()
    for path, text in left.logs.items():
        ends = attempt_ends(text.splitlines(), log_dir=log_dir_of(path) or _run_folder(path))
        if len(ends) > len(found):
            found = ends
    return tuple(replace(e, exit=replace(e.exit, message=scrub(e.exit.message) if e.exit.message else None))
                 for e in found)


def _run_folder(path: str) -> str | None:
    """A launcher's log lying in a ``--log-dir`` run folder (``<dir>/<run id>/``) beside its attempts."""
    folder = Path(path).parent
    return str(folder) if (folder / "attempt_0").is_dir() else None


def ended_at(left: Leftovers) -> float | None:
    """When the job ended, as its files tell: the latest of the ranks' last words, the launcher's
    failure report and the hook's exit records; None when only dumps (whose copies lose their
    times) are there."""
    times = [f.at for f in left.failures if f.at]
    for found in left.ranks.values():
        if found.last_words and found.last_words.at:
            times.append(found.last_words.at)
        if found.exit_record and isinstance(found.exit_record.get("at"), (int, float)):
            times.append(float(found.exit_record["at"]))
    return max(times, default=None)


def _ageless(state: CollectiveState | None) -> CollectiveState | None:
    if state is None:
        return None
    return dataclasses.replace(state, ranks=tuple(dataclasses.replace(r, pending_since=None) for r in state.ranks))


def _has_anything(found: RankLeft) -> bool:
    return bool(found.lines or found.dumps or found.last_words or found.fault_text or found.exit_record
                or found.error_file)


def _last_stacks(found: RankLeft) -> tuple[tuple[ThreadStack, ...], str, str]:
    """The rank's last stacks: its last words, else a fatal faulthandler dump, else its last traceback."""
    if found.last_words and found.last_words.stacks:
        threads = without_hook_frames(faulthandler_threads(found.last_words.stacks))
        if threads:
            return threads, f"last words on {found.last_words.trigger}", found.last_words.stacks
    for text, where in ((found.fault_text, "faulthandler, on a fatal signal"),
                        ("\n".join(found.lines), "faulthandler's dump in its log, on a fatal signal")):
        fault = crashlog.parse_faulthandler(text) if text else None
        threads = faulthandler_threads(fault.text) if fault is not None else ()
        if threads:
            return threads, where, fault.text
    raised = traceback_thread(found.lines)
    if raised is not None:
        return (raised,), "the traceback in its log", "\n".join(f"{f.file}:{f.line} {f.function}" for f in raised.frames)
    return (), "none", ""


def _launcher_status(left: Leftovers) -> int | None:
    """The exit status ``trainwatch run`` recorded for the launcher (negative: killed by that signal)."""
    status = (left.launcher_exit or {}).get("status")
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _rank(found: RankLeft, threads: tuple[ThreadStack, ...], failure, host: str,  # noqa: ANN001
          launcher_status: int | None = None, ended_badly: bool = False) -> ObservedRank:
    cls = classify(threads, source_line) if threads else None
    return ObservedRank(
        rank=found.rank, pid=found.pid or (failure.pid if failure else None), host=found.host or host,
        seen="exited", phase=cls.phase if cls else "unknown", op=cls.op if cls else None,
        where=cls.where if cls else None, user_frame=cls.user_frame if cls else None,
        detail=cls.detail if cls else None, threads=threads, exit=_exit(found, failure, launcher_status, ended_badly),
        log_path=found.own_log or (found.log_files[0] if found.log_files else None))


def _exit(found: RankLeft, failure, launcher_status: int | None = None,  # noqa: ANN001
          ended_badly: bool = False) -> ExitInfo:
    """How the rank ended, from everything that says: the launcher's report, its last words, its
    uncaught exception, a fatal signal's faulthandler dump, its log's fatal line; with none of
    them, a launcher that exited 0 (torchrun does only when every rank did)."""
    code = signal = at = reason = message = frame = None
    source = None
    if failure is not None:
        code, signal, at, source = failure.code, failure.signal, failure.at, "launcher log"
    words = found.last_words
    if words is not None:
        at = at or words.at
        if words.trigger.startswith("SIG") and signal is None and code is None:
            signal, source = words.trigger, "last words"
    fault = ((crashlog.parse_faulthandler(found.fault_text) if found.fault_text else None)
             or (crashlog.parse_faulthandler("\n".join(found.lines)) if found.lines else None))
    if fault is not None and fault.signal:
        signal, frame, reason = signal or fault.signal, crashlog.user_frame(fault), crashlog.classify(fault.text)
    said = ranklog.reason_of(found.lines) if found.lines else None
    if said is not None:  # the rank's own words on an abort say why (crashlog.ABORTED)
        reason = said.reason if reason in (None, crashlog.ABORTED) else reason
        message, frame = said.message, frame or said.frame
    if found.exit_record and found.exit_record.get("exception"):
        message = message or str(found.exit_record["exception"])
        frame = frame or job_frame(found.exit_record.get("frame"))
        at = at or found.exit_record.get("at")
    if found.error_file:
        message = message or found.error_file.splitlines()[0]
    if code is None and signal is None and (said is not None and said.raised or found.exit_record):
        code = 1  # an uncaught exception ends the interpreter with status 1
    if code is None and signal is None and not (reason or message or frame):
        if launcher_status == 0:
            code, source = 0, "the launcher's exit status"
        else:
            reason = SILENT if ended_badly and _silent(found) else UNTOLD
    library = _library_error(found, signal)
    if library is not None and reason in (None, crashlog.ABORTED):
        reason, message = crashlog.classify(library.words) or reason, library.words
    return ExitInfo(code=code, signal=signal, at=at, reason=reason, frame=frame,
                    message=scrub(message) if message else None, source=source,
                    library=dataclasses.replace(library, words=scrub(library.words)) if library else None)


def _ended_badly(left: Leftovers) -> bool:
    """The job did not end well: its launcher's recorded status is not 0, or a rank was stopped,
    raised or faulted (a normal end leaves no last words, exception or fault trace at all)."""
    status = (left.launcher_exit or {}).get("status")
    if isinstance(status, int):
        return status != 0
    return any(f.last_words or f.stop_trace or f.exit_record or f.error_file
               or (f.fault_text and crashlog.parse_faulthandler(f.fault_text)) for f in left.ranks.values())


def _silent(found: RankLeft) -> bool:
    """An armed rank whose hook said nothing: no last words (nor faulthandler's trace at a stop
    signal), no recorded exception, no fatal signal's trace. Its hook hears all of those, so the
    rank ended by what no handler sees: a SIGKILL, or os._exit."""
    fault = crashlog.parse_faulthandler(found.fault_text) if found.fault_text else None
    return (found.armed and found.last_words is None and not found.stop_trace and not found.exit_record
            and fault is None and not found.error_file)


def _library_error(found: RankLeft, signal: str | None) -> LibraryError | None:
    """What a collective library said as the rank failed: its lines, its recorded exception, its
    error file; a C++ abort in a log several ranks share counts for a rank that died of SIGABRT."""
    texts = [found.lines, (found.exit_record or {}).get("exception"), found.error_file]
    if signal == "SIGABRT":
        texts.append(found.shared_abort)
    for text in texts:
        lines = text.splitlines() if isinstance(text, str) else list(text or ())
        said = library_words.library_error(lines) if lines else None
        if said is not None:
            return said
    return None


def _collectives(left: Leftovers) -> CollectiveState | None:
    """Each rank's freshest Flight Recorder trace (``flightrec.fresher``), read into its collectives."""
    chosen: dict[int, flightrec.FoundTrace] = {}
    for number, found in left.ranks.items():
        for dump in found.dumps:
            chosen[number] = flightrec.fresher(chosen.get(number), flightrec.FoundTrace(dump.trace, dump.source, dump.at))
    if not chosen:
        return None
    sources = "+".join(sorted({f.source for f in chosen.values()}))
    return flightrec.read_rows({rank: f.trace for rank, f in chosen.items()}, source=sources)


def _watchdog(left: Leftovers) -> CollectiveState | None:
    rows: dict = {}
    for text in left.logs.values():
        rows.update(parse_watchdog(text, now=left.newest or time.time()))
    return watchdog_state(rows)


def _launcher(left: Leftovers) -> str:
    if left.run is not None:
        return "trainwatch run"
    if left.failures:
        return "torchrun"
    return UNNAMED_LAUNCHER


def _untold_notes(evidence: ObservedJob) -> list[str]:
    """What these files do not hold: how ranks ended, and their stacks (a plain log has neither)."""
    from ..snapshot import who
    untold = [r.rank for r in evidence.ranks if r.exit is not None and r.exit.reason == UNTOLD and r.rank is not None]
    notes = []
    if not evidence.ranks:
        notes.append("ranks: none named in these files (no `[rankN]:` lines, no rank's own log, no Flight Recorder "
                     "dump, no error file): a log of a job that ran normally reads so too")
    if untold:
        notes.append(f"how {who(untold)} ended: not in these files (no exit status, no launcher failure report, "
                     "no last words)")
    if evidence.ranks and not any(r.threads for r in evidence.ranks):
        notes.append("stacks: none in these files (`trainwatch run` keeps each rank's last stacks)")
    return notes


def _missing_notes(evidence: ObservedJob) -> list[str]:
    missing = [r.rank for r in evidence.ranks if r.seen == "missing"]
    if not missing:
        return []
    from ..snapshot import compact_ranks
    return [f"rank{'s' if len(missing) > 1 else ''} {compact_ranks(missing)} left nothing here (no dump, no log line, "
            "no last words): gather its node's files too; a rank that never dumped is often the one the others "
            "waited for"]

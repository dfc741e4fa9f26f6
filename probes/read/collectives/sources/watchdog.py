"""Each rank's NCCL watchdog timeout, read from log text: which collective it waited on, per group.

When a collective outlives its timeout, torch's NCCL watchdog logs two lines (recent torch 2.x)::

    [rank0]:[E1122 12:18:27.888751453 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective
      operation timeout: WorkNCCL(SeqNum=861, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576,
      Timeout(ms)=45000) ran for 45072 milliseconds before timing out.
    [rank0]:[E1122 12:18:27.888875275 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 0]
      failure detected by watchdog at work sequence id: 861 PG status: last enqueued work: 861, last completed work: 860

torch around 2.4 prints the status as ``[PG 0 (default_pg) Rank 1] Timeout at NCCL work: 6463, last
enqueued NCCL work: 6463, last completed NCCL work: 6462.``; older torch prints the first line alone,
1.x without ``SeqNum``. The timeout is quoted again when the watchdog thread dies (``terminated with
exception: [Rank 1] Watchdog caught …``, ``what():  …``, a Python ``DistBackendError: …``): a timeout
that follows a colon is such a quote and is not read again.

What torch's source says about these lines, and how they are read:

- ``[rankN]:`` is the process's global rank (c10 logging's ``GLOBAL_RANK``). ``Rank N`` inside the
  message is the rank within the process group, and the ``[Rank N]`` of the timeout line is cached
  process-wide on first use (``WorkNCCL::logPrefix`` keeps it in a function-local static), so it can
  name another group's rank (a fix prints ``[PG GUID 2 Rank 0]`` there instead; read too). The
  prefix's global rank wins; without one, the group prefix's ``Rank N``, then ``[Rank N]``.
- The group is the ``PG GUID``: the group's name, the same on every rank, and what Flight Recorder
  entries carry as ``process_group[0]``. ``PG ID`` counts the groups one process has joined, so one
  group can have different IDs on different ranks.
- The stamp is local time without a year, month not zero-padded (``E709`` is July 9). Its fraction
  is ``CLOCK_MONOTONIC`` nanoseconds, not the wall clock's (stamps run backwards within a second),
  so whole seconds only.

The source reads the tail of every log file of the job's ranks (ranks that exited included: their
logs keep the lines), again only when a file changed, and fills ``ObservedJob.watchdog``. Parsing
judges nothing: the rows go through the same cross-rank analysis as Flight Recorder rows.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime

from . import CollectiveSource, FeedOptions, RankEnvs, Reading
from .. import nccl_state
from ...processes.process import JobProcesses
from ...logs.ranklog import split_prefix
from ....snapshot import CollectiveCall, CollectiveState, RankCollective
from ....record import Record

MAX_LINE = 8192  # longer lines are not torch's (its watchdog lines are a few hundred characters)
STALE_S = 60  # a timeout stamped this long before ``since`` belongs to an earlier run
_DAY_S = 86400

_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: Work\w*\((?P<work>.*?)\) "
                      r"ran for (?P<ms>\d{1,18}) milliseconds")
_SEQ = re.compile(r"\bSeqNum=(\d{1,18})\b")
_OPTYPE = re.compile(r"\bOpType=(\w+)")
_NUMEL = re.compile(r"\bNumelIn=(\d{1,18})\b")
_STATUS = re.compile(r"(?:failure detected by watchdog at work sequence id"
                     r"|Exception \(either an error or timeout\) detected by watchdog at work"
                     r"|Timeout at NCCL work): (?P<seq>\d{1,18})\b")
_ENQUEUED = re.compile(r"last enqueued (?:NCCL )?work: (-?\d{1,18})\b")
_COMPLETED = re.compile(r"last completed (?:NCCL )?work: (-?\d{1,18})\b")
_GLOBAL = re.compile(r"\[rank(\d{1,9})\]:")
_STAMP = re.compile(r"(?<![\w.])\[?[EWIF](?P<md>\d{3,4}) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.\d+)?\s")
# [PG ID 0 PG GUID 0(default_pg) Rank 0], [PG ID 1 PG GUID 1 Rank 1], [PG 0 (default_pg) Rank 1]
_PG = re.compile(r"\[PG (?:ID (?P<id>\d+) )?(?:PG )?(?:GUID )?(?P<name>[^\s()\[\]]+)[^\[\]]*?\bRank (?P<rank>\d{1,9})\]")
_MSG_RANK = re.compile(r"\[Rank (\d{1,9})\]\s*$")
_MSG_PREFIX = re.compile(r"\[(?:PG [^\[\]]*)?Rank \d+\]\s*$")
# "…terminated with exception: ", "what():  ", "DistBackendError: ", but not a "[rank0]:" prefix
_QUOTED = re.compile(r"[^\]\s]:\s*$")

# NCCL's OpType names that differ from torch's (and Flight Recorder's) op names; the rest are lower-cased.
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather"}


@dataclass(frozen=True, repr=False)
class _Said(Record):
    """One timeout or status line: who said it, when, and about which work."""

    index: int  # line number
    source: int | None  # global rank from the line's [rankN]: prefix
    rank: int | None  # the rank the message names (group prefix, then [Rank N])
    pg: str | None
    stamp: float | None  # unix seconds
    seq: int | None
    op: str | None = None
    numel: int | None = None
    ran_ms: int | None = None
    enqueued: int | None = None
    completed: int | None = None


def op_name(optype: str) -> str:
    """NCCL's ``OpType`` as torch names the op: ``ALLREDUCE`` -> ``all_reduce``."""
    return _OPS.get(optype, optype.lower())


def parse_watchdog(text: str, since: float | None = None, now: float | None = None) -> dict[tuple[int, str], RankCollective]:
    """Each rank's (and process group's) watchdog timeout from log text: (rank, pg) -> RankCollective.

    ``now`` gives the stamps their year; timeouts stamped before ``since - 60`` are left out
    (an earlier run's lines in the same file). A rank's later timeout in a group replaces an earlier one.
    """
    now = time.time() if now is None else now
    cutoff = None if since is None else since - STALE_S
    timeouts: list[_Said] = []
    statuses: dict[tuple[int | None, int | None], list[_Said]] = {}
    for index, line in enumerate(text.splitlines()):
        if len(line) > MAX_LINE:
            continue
        said = _read_line(index, line, now)
        if said is None or (cutoff is not None and said.stamp is not None and said.stamp < cutoff):
            continue
        if said.op is not None:
            timeouts.append(said)
        else:
            statuses.setdefault((said.source, said.seq), []).append(said)
    found: dict[tuple[int, str], _Said] = {}
    for timeout in timeouts:
        status = _status_of(timeout, statuses)
        pg = timeout.pg or (status.pg if status else None) or "0"
        rank = next((r for r in (timeout.source, status.rank if status else None, timeout.rank) if r is not None), None)
        if rank is None:
            continue
        if status is not None:
            timeout = replace(timeout, enqueued=status.enqueued, completed=status.completed)
        old = found.get((rank, pg))
        if old is not None and old.seq == timeout.seq:  # the same work quoted again
            timeout = replace(old, **{k: v for k, v in vars(timeout).items() if v is not None})
        found[(rank, pg)] = timeout
    return {key: _row(*key, found[key]) for key in sorted(found, key=lambda k: (k[0], len(k[1]), k[1]))}


def watchdog_state(rows: dict[tuple[int, str], RankCollective]) -> CollectiveState | None:
    """The rows as one collective state, source "watchdog" (judged across ranks like any other)."""
    if not rows:
        return None
    return CollectiveState(source="watchdog", ranks=tuple(rows.values()))


def _read_line(index: int, line: str, now: float) -> _Said | None:
    """A watchdog timeout (``op`` set) or a group status line; None for any other line."""
    timeout = _TIMEOUT.search(line) if "Watchdog caught" in line else None
    if timeout is not None:
        work = timeout["work"]
        optype, seq, numel = _OPTYPE.search(work), _SEQ.search(work), _NUMEL.search(work)
        if optype is None:
            return None
        head = line[:timeout.start()]
        if _QUOTED.search(_MSG_PREFIX.sub("", head)):
            return None
        said = _head(index, line, head, now, seq=int(seq[1]) if seq else None)
        own = _MSG_RANK.search(head)
        return replace(said, rank=said.rank if said.rank is not None else (int(own[1]) if own else None),
                       op=op_name(optype[1]), numel=int(numel[1]) if numel else None, ran_ms=int(timeout["ms"]))
    status = _STATUS.search(line) if "work" in line else None
    if status is None:
        return None
    tail = line[status.end():]
    enqueued, completed = _ENQUEUED.search(tail), _COMPLETED.search(tail)
    return replace(_head(index, line, line[:status.start()], now, seq=int(status["seq"])),
                   enqueued=_count(enqueued[1]) if enqueued else None,
                   completed=_count(completed[1]) if completed else None)


def _head(index: int, line: str, head: str, now: float, seq: int | None) -> _Said:
    """Who said it and when, from what precedes the message on its line."""
    sources = _GLOBAL.findall(head)
    source = int(sources[-1]) if sources else _prefix_rank(line)
    stamps = list(_STAMP.finditer(head))
    groups = list(_PG.finditer(head))
    group = groups[-1] if groups else None
    return _Said(index=index, source=source, rank=int(group["rank"]) if group else None,
                 pg=group["name"] if group else None, stamp=_stamp(stamps[-1], now) if stamps else None, seq=seq)


def _prefix_rank(line: str) -> int | None:
    """The global rank of a ``[N]:`` prefix (torchrun's ``${rank}`` template); None for a number too long."""
    try:
        return split_prefix(line)[0]
    except ValueError:  # int() refuses thousands of digits
        return None


def _stamp(match: re.Match[str], now: float) -> float | None:
    """A stamp's unix time (local time, whole seconds): this year, or last year where this year's
    would be more than a day ahead of ``now``. None when it is no date."""
    month, day = divmod(int(match["md"]), 100)
    year = time.localtime(now).tm_year
    for y in (year, year - 1):
        try:
            at = datetime(y, month, day, int(match["h"]), int(match["m"]), int(match["s"])).timestamp()
        except (ValueError, OverflowError, OSError):
            continue  # no such day in that year (29 Feb): the other year
        if at <= now + _DAY_S:
            return at
    return None


def _count(text: str) -> int | None:
    """A sequence number; torch prints -1 for none."""
    number = int(text)
    return number if number >= 0 else None


def _status_of(timeout: _Said, statuses: dict[tuple[int | None, int | None], list[_Said]]) -> _Said | None:
    """The group status line the same process logged after the timeout, about the same work (taken
    once). Without a [rankN]: prefix to tell processes apart, the ranks the lines name must agree."""
    if timeout.seq is None:
        return None
    candidates = statuses.get((timeout.source, timeout.seq), [])
    for n, status in enumerate(candidates):
        if status.index < timeout.index:
            continue
        if timeout.source is None and None not in (status.rank, timeout.rank) and status.rank != timeout.rank:
            continue
        return candidates.pop(n)
    return None


def _row(rank: int, pg: str, said: _Said) -> RankCollective:
    has_status = said.enqueued is not None or said.completed is not None
    enqueued = said.enqueued if has_status else said.seq
    known = said.seq is not None and enqueued == said.seq  # the op is that of the last enqueued work only when it is the timed-out one
    since = said.stamp - said.ran_ms / 1000 if said.stamp is not None and said.ran_ms is not None else None
    return RankCollective(rank=rank, pg=pg, last_enqueued=enqueued, last_completed=said.completed,
                          op=said.op if known else None,
                          sizes=str(said.numel) if known and said.numel is not None else None,
                          pending_seq=said.seq, pending_op=said.op, pending_since=since,
                          calls=(CollectiveCall(said.seq, said.op, created=since),)
                          if said.seq is not None and said.op else ())


TAIL_BYTES = nccl_state.LOG_TAIL_BYTES  # the first look: the watchdog's lines come last, then the crash
OVERLAP_BYTES = 64 * 1024  # read again each time: a timeout line whose status line came later
NEEDLE = b"Watchdog caught collective operation timeout"


class Source(CollectiveSource):
    field = "watchdog"
    interval = 2.0

    def __init__(self, options: FeedOptions, envs: RankEnvs | None = None) -> None:
        super().__init__(options, envs)
        self._lock = threading.Lock()
        self._read_to: dict[str, int] = {}  # log path -> bytes of it read so far
        self._rows: dict[str, dict[tuple[int, str], RankCollective]] = {}  # log path -> its timeouts

    def fetch(self, job: JobProcesses) -> None:
        """What each log gained since the last look (a log that shrank is read afresh)."""
        for proc in job.ranks:
            if proc.log_path:
                self._read_to.setdefault(proc.log_path, -1)
        for path, done in list(self._read_to.items()):
            try:
                size = os.stat(path).st_size
                if size == done:
                    continue
                fresh = size < done or done < 0
                start = max(0, size - TAIL_BYTES) if fresh else max(0, done - OVERLAP_BYTES, size - TAIL_BYTES)
                with open(path, "rb") as handle:
                    handle.seek(start)
                    data = handle.read(size - start)
            except OSError:
                continue  # gone or unreadable now: its timeouts read so far stay, and it is tried again
            self._read_to[path] = start + len(data)
            found = parse_watchdog(data.decode(errors="replace"), since=job.started_at) if NEEDLE in data else {}
            with self._lock:
                rows = {} if fresh else self._rows.get(path, {})
                self._rows[path] = {**rows, **found}

    def reading(self, job: JobProcesses) -> Reading:
        with self._lock:
            rows = {key: row for found in self._rows.values() for key, row in found.items()}
        return Reading(watchdog_state(rows))

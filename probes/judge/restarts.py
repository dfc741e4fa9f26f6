"""A job its launcher restarted: what ended each attempt is history, not a fresh start. Pure.

torchrun ``--max-restarts`` starts the whole group again when a rank fails; the new ranks run
healthy until the failure comes back. Judged alone, each attempt reads "healthy" between crashes.
With the attempts' ends (``Job.attempts``, read from the launcher's log by ``read/logs/attempts.py``):

* while the attempt running now has not outlived the attempts before it (twice the longest of
  them), the job is in a crash loop when the same rank ended every attempt the same way
  (``crashed``, that rank: "restarted 2 times; each attempt ended when rank 2 raised ValueError: …
  at train.py:40"), or it is recovering from the last failure (``crashed``, the rank that ended
  the last attempt, every end named);
* a crash in the attempt running now says whether it is the same end again;
* an attempt that outlived the ones before it runs on: its own verdict, the restarts said after it;
* an attempt younger than that which looks stuck is said as such, after the loop: the attempts
  before it ran as long and ended as said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .exits import describe_exit
from ..snapshot import AttemptEnd, Job, Rank, Verdict, age_text

OUTLIVED = 2.0  # an attempt that ran this many times as long as the longest before it runs on


def with_restarts(verdict: Verdict, ranks: Sequence[Rank], job: Job | None, now: float | None) -> Verdict:
    """``verdict`` of the attempt running now, read with how the attempts before it ended."""
    ended = _before(job)
    if not ended:
        return verdict
    history = history_words(ended)
    last = ended[-1]
    if verdict.kind == "crashed":
        same = verdict.culprits == ((last.rank,) if last.rank is not None else ()) and _current_end_is(ranks, last)
        if same and _repeats(ended):
            each = "the attempt" if len(ended) == 1 else f"each of the {len(ended)} attempts"
            return replace(verdict, summary=f"a crash loop: {verdict.summary}; the same end as {each} before it "
                                            f"({_restarted(ended)})")
        return replace(verdict, summary=f"{verdict.summary}; before it: {history}")
    if ranks and all(r.state == "exited" for r in ranks):  # the attempt running now is over, and well
        return replace(verdict, summary=f"{verdict.summary}; {history}")
    age = _age(job, ended[-1], now)
    longest = max((d for e in ended if (d := _lasted(e)) is not None), default=None)
    if age is not None and longest is not None and age > OUTLIVED * longest:
        return replace(verdict, summary=f"{verdict.summary}; {history}; attempt {job.attempt} has run for "
                                        f"{age_text(age)}, longer than any before it ({age_text(longest)}): it runs on")
    if age is None and verdict.kind not in ("healthy", "unknown", "rendezvous"):
        return replace(verdict, summary=f"{verdict.summary}; {history}")  # how long it has run is unknown
    if verdict.kind == "rendezvous" or not ranks:
        now_words = f"the launcher is starting attempt {job.attempt}"
    elif verdict.kind in ("healthy", "unknown"):
        now_words = f"attempt {job.attempt} runs ({verdict.summary})"
    else:  # younger than the attempts that ended: what it looks like now is said, the loop leads
        now_words = f"attempt {job.attempt} reads {verdict.kind} so far ({verdict.summary})"
    if age is not None and longest is not None:
        now_words += f"; {age_text(age)} in, where the attempts before it lasted up to {age_text(longest)}"
    culprits = (last.rank,) if last.rank is not None else ()
    loop = "a crash loop: " if _repeats(ended) and len(ended) > 1 else ""
    return Verdict("crashed", culprits, f"{loop}{history}; {now_words}", verdict.since)


def history_words(ended: Sequence[AttemptEnd]) -> str:
    """``restarted 2 times; each attempt ended when rank 2 raised ValueError: … at train.py:40``, or
    each end named where they differ."""
    if _repeats(ended):
        each = "each attempt" if len(ended) > 1 else "attempt 0"
        return f"{_restarted(ended)}; {each} ended when {cause(ended[-1])}"
    parts = [f"attempt {e.attempt} ended when {cause(e)}" if i == 0 else f"attempt {e.attempt} when {cause(e)}"
             for i, e in enumerate(ended)]
    return f"{_restarted(ended)}: " + "; ".join(parts)


def cause(end: AttemptEnd) -> str:
    """``rank 2 raised ValueError: bad batch at train.py:40 train``, ``rank 1 was killed by SIGKILL``."""
    who = f"rank {end.rank}" if end.rank is not None else "a rank"
    info = end.exit
    if info.reason and info.message and info.code not in (None, 0) and info.signal is None:
        text = f"{who} raised {info.message}"
        return text + (f" at {info.frame}" if info.frame else "")
    if info.signal and not info.reason:
        return f"{who} was killed by {info.signal}"
    return f"{who} died: {describe_exit(replace(info, source=None))}"


def _before(job: Job | None) -> list[AttemptEnd]:
    """The ends of the attempts before the one running now."""
    if job is None or not job.attempts or job.attempt is None:
        return []
    return sorted((e for e in job.attempts if e.attempt < job.attempt), key=lambda e: e.attempt)


def _key(end: AttemptEnd) -> tuple:
    info = end.exit
    return end.rank, info.signal, info.reason or info.code, info.frame


def _repeats(ended: Sequence[AttemptEnd]) -> bool:
    return len({_key(e) for e in ended}) == 1


def _restarted(ended: Sequence[AttemptEnd]) -> str:
    n = len(ended)
    return "restarted once" if n == 1 else f"restarted {n} times"


def _current_end_is(ranks: Sequence[Rank], last: AttemptEnd) -> bool:
    """The attempt running now ended as the last one did: the same rank, signal and reason."""
    rank = next((r for r in ranks if r.rank == last.rank and r.exit is not None), None)
    if rank is None or rank.exit is None:
        return False
    info = rank.exit
    return info.signal == last.exit.signal and (info.reason or info.code) == (last.exit.reason or last.exit.code)


def _lasted(end: AttemptEnd) -> float | None:
    if end.started_at is None or end.exit.at is None:
        return None
    return max(0.0, end.exit.at - end.started_at)


def _age(job: Job | None, last: AttemptEnd, now: float | None) -> float | None:
    """How long the attempt running now has run, counted as the ones before it are: from the end
    of the one before (its restart and rendezvous included), else from its ranks' start."""
    began = last.exit.at if last.exit.at is not None else job.attempt_started_at if job else None
    if began is None or now is None:
        return None
    return max(0.0, now - began)

"""When ranks that wait on their GPU are a hang, and when they may still be in a long GPU step.

A rank blocked at ``loss.item()`` while its GPU computes a long step looks exactly like one
blocked behind a collective that never completes: the same stack, the same spinning CPU. Without
a collective source that shows a pending collective, waiting on the GPU is called a hang only
with evidence:

* the wait outlasted a **bound** no healthy step reaches: ``FLOOR_S``, or longer for a job whose
  own rhythm is slower (``STEP_FACTOR`` steps, ``GAP_FACTOR`` times its longest quiet stretch that
  ended in progress), but never longer than the job's collective timeout where its environment
  shows it (``read/processes/process.py collective_timeout_s``; past that, its own watchdog would have
  called the collective hung);
* or the rank's log has been **silent** far beyond how often it was seen to write
  (``LOG_FACTOR`` times its longest interval, at least ``LOG_MIN_SILENCE_S``), or, on first
  attach, beyond the rate of the unfinished progress bar that is its last line.

Until then the verdict is ``unknown`` (progress cannot be judged yet), saying what is missing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..snapshot import LogActivity, Rank, age_text
from ..wording import log_activity as log_text

FLOOR_S = 120.0  # no healthy step keeps the host blocked on its GPU this long without a collective
STEP_FACTOR = 3.0
GAP_FACTOR = 2.0
LOG_FACTOR = 4.0
LOG_MIN_SILENCE_S = 30.0


def bound(ranks: Sequence[Rank]) -> tuple[float, str]:
    """Seconds of waiting on the GPU after which it is a hang, and where that figure comes from."""
    seconds, why = FLOOR_S, "the floor for a GPU wait"
    for rank in ranks:
        if rank.step_period_s and STEP_FACTOR * rank.step_period_s > seconds:
            seconds, why = STEP_FACTOR * rank.step_period_s, f"{STEP_FACTOR:.0f} of its {rank.step_period_s:.0f} s steps"
        if rank.longest_quiet_s and GAP_FACTOR * rank.longest_quiet_s > seconds:
            seconds, why = GAP_FACTOR * rank.longest_quiet_s, f"twice its longest quiet stretch, {rank.longest_quiet_s:.0f} s"
    timeouts = [r.collective_timeout_s for r in ranks if r.collective_timeout_s]
    if timeouts and min(timeouts) < seconds:
        seconds, why = min(timeouts), "the job's collective timeout"
    return seconds, why


def span(seconds: float) -> str:
    """``9 s``, ``150 s``; from 10 minutes on as :func:`age_text` says it (``19 min``)."""
    return f"{seconds:.0f} s" if seconds < 600 else age_text(seconds)


def silent(log: LogActivity | None) -> bool:
    """The log stopped growing far beyond its usual interval (learnt while watching, else the
    rate of its progress bar)."""
    if log is None or log.age_s is None:
        return False
    usual = log.longest_s if log.every_s is not None else log.bar_s
    return usual is not None and log.age_s >= max(LOG_FACTOR * usual, LOG_MIN_SILENCE_S)


def judge_gpu_wait(waiting: Sequence[Rank], seconds: float) -> tuple[bool, str]:
    """Whether ranks seen waiting on their GPU for ``seconds`` (no collective state) are a hang,
    and the evidence in words, to follow the description of the wait."""
    logs = [r.log for r in waiting if r.log is not None and r.log.age_s is not None]
    freshest = min(logs, key=lambda log: log.age_s or 0.0) if logs else None
    said = log_text(freshest)
    if logs and all(silent(log) for log in logs):
        return True, f"{said}: its log went silent" if said else "its log went silent"
    limit, why = bound(waiting)
    if seconds >= limit:
        text = f"waited past {span(limit)} ({why}) with no sign of progress"
        return True, f"{text}; {said}" if said else text
    text = f"no collective state yet: not called a hang before {span(limit)} ({why})"
    return False, f"{text}; {said}" if said else text

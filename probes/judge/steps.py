"""Which training step each rank is at, how long its steps take, and which rank fell behind.

The step comes from a ``py-spy dump --locals`` of the rank's main thread, read narrowly:

* only frames of the user's own code (:func:`phases.is_user`) and the Hugging Face Trainer's
  loop (``transformers/trainer.py``: ``_inner_training_loop``, or ``_run_epoch`` in newer releases);
* only locals with a name in :data:`LOOP_NAMES` / :data:`HF_NAMES`;
* only values whose repr is a plain integer literal. Everything else a local holds (strings,
  tensors, objects; possibly secrets) is dropped while py-spy's output is parsed and never stored.

Priority of the names, best first (:data:`LOOP_NAMES`): counters that keep growing across epochs
(``global_step``, ``step``, ``iteration``, ``iter_num``, ``iter``, ``it``), then the batch index within
an epoch (``batch_idx``), then ``epoch``, and ``i`` only when nothing better exists. Among frames
with equally good names the outermost wins: that is the loop that drives the rest.

The HF Trainer's ``self.state.global_step`` is an attribute, which py-spy does not show; its loop's
locals give the optimizer step in progress as ``epoch * num_update_steps_per_epoch + update_step``
(transformers 4.46 and later), else the micro-batch count ``total_batched_samples``, else the batch
index ``step`` (plus ``epoch * steps_in_epoch``). Whichever applies, every rank of one job reads the
same kind of count, so ranks stay comparable and the period stays right per unit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..frames import LOOP_NAMES, is_hf_loop, is_user
from ..observed import FrameInts, ThreadCounters
from ..snapshot import Frame, Rank, who
from ..median import median
from ..record import Record

SLOW_FACTOR = 3.0

# -- the step from one dump ---------------------------------------------------------------------
def step_from_locals(frames: Sequence[Frame], ints: FrameInts) -> int | None:
    """The step a rank is at, from its main thread's frames and their allowed integer locals."""
    for index, frame in enumerate(frames):
        if is_hf_loop(frame) and index in ints:
            step = _hf_step(ints[index])
            if step is not None:
                return step
    best: tuple[int, int] | None = None  # (name priority, -frame index): lower wins
    value = None
    for index, frame in enumerate(frames):
        if not is_user(frame) or is_hf_loop(frame):
            continue
        for name, number in ints.get(index, {}).items():
            if name not in LOOP_NAMES or number < 0:
                continue
            key = (LOOP_NAMES.index(name), -index)
            if best is None or key < best:
                best, value = key, number
    return value


def _hf_step(local: dict[str, int]) -> int | None:
    """The optimizer step in progress, 1-based like the Trainer's ``global_step`` and progress bar
    (its loop counters are 0-based: ``update_step`` 2 is the third step)."""
    epoch = local.get("epoch")
    per_epoch = local.get("num_update_steps_per_epoch")
    update = local.get("update_step")
    if epoch is not None and per_epoch is not None and update is not None and update >= 0:
        return epoch * per_epoch + update + 1
    if local.get("total_batched_samples", -1) >= 0:
        return local["total_batched_samples"]
    step = local.get("step")
    if step is None or step < 0:
        return None
    if epoch is not None and local.get("steps_in_epoch") is not None:
        return epoch * local["steps_in_epoch"] + step + 1
    return step + 1


# -- rhythm ----------------------------------------------------------------------------------------
@dataclass(repr=False)
class _Series(Record):
    """One rank's step values over time and the intervals between changes."""

    step: int
    changed_at: float | None  # when the step was last seen to change (None: not yet)
    seen_at: float
    intervals: deque  # recent seconds per step, oldest first


MIN_INTERVALS = 3  # step intervals seen before a period is reported


class StepClock:
    """Per PID: when the step value changed, and the time per step (median of recent intervals,
    each divided by the steps that passed between two reads)."""

    def __init__(self, keep: int = 12) -> None:
        self.keep = keep
        self._series: dict[int, _Series] = {}

    def observe(self, pid: int, step: int | None, now: float) -> bool:
        """Note ``pid``'s step read at ``now``; whether it changed since the last read (the loop
        went round: progress, whatever line the rank was dumped at)."""
        if step is None:
            return False
        series = self._series.get(pid)
        if series is None:
            self._series[pid] = _Series(step, None, now, deque(maxlen=self.keep))
            return False
        changed = step != series.step
        if changed:
            if step > series.step and series.changed_at is not None and now > series.changed_at:
                series.intervals.append((now - series.changed_at) / (step - series.step))
            series.step, series.changed_at = step, now  # a step going back (new epoch, restart): no interval
        series.seen_at = now
        return changed

    def still(self, pid: int, now: float) -> None:
        """The step is known unchanged at ``now`` without a read (the main thread has not run)."""
        series = self._series.get(pid)
        if series is not None:
            series.seen_at = max(series.seen_at, now)

    def held_for(self, pid: int) -> float | None:
        """How long the current step is known to have lasted: from the change that began it to the
        last time it was seen unchanged (a lower bound); None before a change was seen."""
        series = self._series.get(pid)
        if series is None or series.changed_at is None:
            return None
        return series.seen_at - series.changed_at

    def step(self, pid: int) -> int | None:
        series = self._series.get(pid)
        return series.step if series else None

    def period(self, pid: int) -> float | None:
        """Seconds per step: the median of recent intervals; None until ``MIN_INTERVALS`` are known, so
        one slow step (a checkpoint, a busy machine) cannot set the rhythm alone."""
        series = self._series.get(pid)
        if series is None or len(series.intervals) < MIN_INTERVALS:
            return None
        return median(series.intervals)

    def last_change(self, pid: int) -> float | None:
        series = self._series.get(pid)
        return series.changed_at if series else None

    def history(self, pid: int) -> list[float]:
        """Recent seconds per step, oldest first (for a sparkline)."""
        series = self._series.get(pid)
        return list(series.intervals) if series else []

    def forget(self, pid: int) -> None:
        self._series.pop(pid, None)


class StepReader:
    """When to pay for a ``--locals`` dump, and the clock fed by them. A rank is read when the
    caller forces it (rounds where every rank is dumped anyway, something is wrong, or neither the
    rank's stack nor its counters showed progress at the last look) or every ``every`` rounds, and never
    while its main thread has not run since the last read (its step cannot have changed)."""

    def __init__(self, every: int = 5) -> None:
        self.every = max(1, every)
        self.clock = StepClock()
        self._read: dict[int, tuple[int, ThreadCounters | None]] = {}  # pid -> (round, counters after)
        self._round = 0

    def next_round(self) -> None:
        self._round += 1

    def forget(self, pid: int) -> None:
        self._read.pop(pid, None)
        self.clock.forget(pid)

    def due(self, pid: int, counters: ThreadCounters | None, now: float, force: bool = False) -> bool:
        """Whether this round should read ``pid``'s locals. A main thread that has not run since the
        last read counts as a read that saw the same step."""
        last = self._read.get(pid)
        if last is None:
            return True
        if counters is not None and counters == last[1]:
            self.clock.still(pid, now)
            return False
        return force or self._round - last[0] >= self.every

    def observe(self, pid: int, frames: Sequence[Frame], ints: FrameInts, after: ThreadCounters | None,
                now: float) -> bool:
        """One ``--locals`` read of ``pid``: its main thread's frames and allowed integers; whether
        its step changed since the last read."""
        self._read[pid] = (self._round, after)
        return self.clock.observe(pid, step_from_locals(frames, ints), now)

    def fields(self, pid: int) -> tuple[int | None, float | None, float | None]:
        """``(step, step_period_s, step_held_s)`` for the Rank."""
        period, held = self.clock.period(pid), self.clock.held_for(pid)
        return (self.clock.step(pid), round(period, 3) if period is not None else None,
                round(held, 1) if held is not None else None)


# -- words -----------------------------------------------------------------------------------------
def step_note(ranks: Sequence[Rank]) -> str | None:
    """``rank 2 is at step 1,204 while ranks 0-1 are at step 1,205`` when live ranks differ in step."""
    by_step: dict[int, list[int]] = {}
    for rank in ranks:
        if rank.step is not None and rank.rank is not None and rank.state in ("running", "stuck", "unknown"):
            by_step.setdefault(rank.step, []).append(rank.rank)
    if len(by_step) < 2:
        return None
    lead = max(by_step, key=lambda step: (len(by_step[step]), step))  # the most ranks; ties: the furthest
    others = sorted(step for step in by_step if step != lead)
    parts = []
    for i, step in enumerate(others):
        numbers = by_step[step]
        verb = "" if i else (" is" if len(numbers) == 1 else " are")
        parts.append(f"{who(numbers)}{verb} at step {step:,}")
    majority = by_step[lead]
    return f"{', '.join(parts)} while {who(majority)} {'is' if len(majority) == 1 else 'are'} at step {lead:,}"


def seconds(value: float) -> str:
    """Two significant digits below ten seconds (``0.26``, ``2.6``), whole seconds above."""
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


def step_label(step: int | None, period: float | None) -> str | None:
    """``1,204 (2.6s/step)``, ``1,204``, or None when the step is unknown."""
    if step is None:
        return None
    return f"{step:,}" if period is None else f"{step:,} ({seconds(period)}s/step)"


def slow_step_warnings(ranks: Sequence[Rank], min_s: float) -> list[str]:
    """``rank 2: step 1,204 has taken 9.1 s, 3.5x its usual 2.6 s`` for a rank whose current step
    has lasted over :data:`SLOW_FACTOR` times its period (and at least ``min_s``) while another
    rank is at a later step. The time is what was seen (``step_held_s``: :meth:`StepClock.held_for`),
    a lower bound."""
    live = [r for r in ranks if r.pid is not None and r.step is not None
            and r.state in ("running", "stuck", "unknown")]
    furthest = max((r.step for r in live), default=None)
    out = []
    for rank in live:
        period, taken = rank.step_period_s, rank.step_held_s
        if period is None or taken is None or rank.step >= furthest:
            continue
        if taken >= max(SLOW_FACTOR * period, min_s):
            out.append(f"rank {rank.rank}: step {rank.step:,} has taken {taken:.1f} s, "
                       f"{taken / period:.1f}x its usual {seconds(period)} s")
    return out

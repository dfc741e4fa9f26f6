"""Records what a trainwatch process judged, for the stress scripts (``stress_observers.py --record``).

On ``PYTHONPATH`` with ``TW_RECORD=<folder>`` set, every trainwatch process started (not the job's
ranks) wraps the judge: each poll whose verdict is a problem is written to
``<folder>/<pid>-<command>.txt`` with the two polls before it, every rank's evidence in one line
(phase, where, step, the moments progress was seen, the kernel's view, the first look) and the state
judged. A wrong look between two screen captures is then on record with what made it.
"""

from __future__ import annotations

import os
import sys
import time

if os.environ.get("TW_RECORD") and any("trainwatch" in a for a in getattr(sys, "orig_argv", [])[:4]):
    from trainwatch.probes.judge import judgement as _judgement

    _judge = _judgement.judge_job
    _recent: list = []
    _out = os.path.join(os.environ["TW_RECORD"], f"{os.getpid()}-{'-'.join(sys.orig_argv[3:5])}.txt")

    def _poll(now, evidence, judged) -> str:
        lines = [f"  judged at {now:.2f}: {judged.verdict.kind}: {judged.verdict.summary}"]
        for r in evidence.ranks:
            k = r.kernel
            state = next((x for x in judged.ranks if x.pid == r.pid), None)
            lines.append(
                f"    rank {r.rank} pid {r.pid} phase={r.phase} where={r.where} step={r.step} "
                f"progress_seen={[round(t - now, 2) for t in r.progress_seen]} "
                f"kernel={k and k.letter} syscall={k and k.syscall} tracer={k and k.tracer} "
                f"asleep={k and k.asleep_since and round(k.asleep_since - now, 2)} first={r.first_look} "
                f"{_elsewhere(r, now)}-> {state and state.state} {state and state.stuck_for_s} {state and state.stuck_source}")
        return "\n".join(lines)

    def _elsewhere(r, now) -> str:
        """What another trainwatch process had left of the rank, and whether this one joined it."""
        other = r.still_elsewhere
        if other is None:
            return ""
        joined = r.first_look is not None and _judgement._joins(other, r.first_look)
        return (f"elsewhere=(since {round(other.since - now, 2)}, until {round(other.until - now, 2)}, "
                f"by {other.by}, signature {other.signature}, counters {other.counters}) joined={joined} ")

    def judge_job(evidence, memory, now, options):
        judged = _judge(evidence, memory, now, options)
        _recent.append((now, evidence, judged))
        del _recent[:-3]
        if judged.verdict.kind not in ("healthy", "unknown"):
            with open(_out, "a") as out:
                out.write(f"=== {now:.2f} {judged.verdict.kind}\n" + "\n".join(_poll(*r) for r in _recent) + "\n")
        return judged

    _judgement.judge_job = judge_job
    if "trainwatch.probes.live" in sys.modules:  # imported with the judge: it holds its own name for it
        sys.modules["trainwatch.probes.live"].judge_job = judge_job

    from trainwatch.probes import sampling as _sampling

    _resolve = _sampling.resolve_natively

    def resolve_natively(samples, classified, cache, tracker, now, take_native, source_line=None):
        """Each native sample asked for, and what came of it, in the same file."""
        def take(pids):
            started = time.monotonic()
            got = take_native(pids)
            with open(_out, "a") as out:
                for pid, sample in got.items():
                    out.write(f"--- {now:.2f} native {pid}: {'no stacks' if sample.threads is None else 'ok'} "
                              f"in {time.monotonic() - started:.2f}s {sample.error or ''}\n")
            return got
        return _resolve(samples, classified, cache, tracker, now, take, source_line)

    _sampling.resolve_natively = resolve_natively

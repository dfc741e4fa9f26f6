"""Recorded jobs replayed as the live view samples them, and judged by the one judge.

Stacks: real py-spy dumps (``fixtures/h100/pyspy``: one H100, NCCL 2.28, torch 2.11;
``fixtures/pyspy``: gloo on CPU). Flight Recorder traces: ``fixtures/fr``.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainwatch.probes.read.collectives.flightrec import load_trace, read_rows
from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, Judgement, judge_job
from trainwatch.probes.observed import ObservedJob, ObservedRank
from trainwatch.probes.read.processes.exits import ExitLedger
from trainwatch.probes.read.processes.procfs import ThreadCounters
from trainwatch.probes.read.stacks.pyspy import parse_dump
from trainwatch.probes.read.stacks.sampler import StackSample
from trainwatch.probes.sampling import Sampler
from trainwatch.probes.snapshot import CollectiveState, Job, Rank, ThreadStack

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "h100" / "pyspy"
WINDOW = 3.0
SPACING = WINDOW / 2  # three samples over the window, as `snapshot` takes them
END = 1000.0 + 3 * SPACING  # when the last sample of a replay is taken
JOB = Job("torchrun", 1, "h")

__all__ = ["END", "JOB", "JudgeMemory", "WINDOW", "gloo_mismatch", "h100_item_hang", "judged", "observe", "replay"]


def load(name: str, pid: int) -> tuple[ThreadStack, ...]:
    return tuple(parse_dump(json.loads((H100 / f"{name}.json").read_text()), pid))


def observe(prefix: str, pid: int, wakeups_per_sample: int, native: bool = True,
            rank: int = 0, start: float = 1000.0) -> ObservedRank:
    """One rank sampled as the live view samples it: three plain samples of ``<prefix>-1..3``
    (+ the recorded native one when asked for), its evidence carrying what the sampler saw."""
    native_threads = load(f"{prefix}-native", pid)
    return sample_rounds(pid, [load(f"{prefix}-{i}", pid) for i in (1, 2, 3)], wakeups_per_sample,
                         native_threads if native else None, rank, start)


def sample_rounds(pid: int, rounds: list[tuple[ThreadStack, ...]], wakeups_per_sample: int,
                  native_threads: tuple[ThreadStack, ...] | None, rank: int, start: float = 1000.0) -> ObservedRank:
    """Observe ``rounds`` (one per sample, ``SPACING`` apart from ``start``) with the main thread's
    counters as recorded in the hangs: CPU always burning (on a CPU through every gap: a spin),
    ``wakeups_per_sample`` wake-ups each."""
    sampler = Sampler(ExitLedger(root_pid=1))  # the live view's own sampler, after its py-spy calls
    now = start
    for i, threads in enumerate(rounds, start=1):
        now += SPACING
        ns = int(now * 1e9)
        counters = ThreadCounters(cpu_ticks=150 * i, voluntary=40 + wakeups_per_sample * i, involuntary=3,
                                  at_ns=ns, run_ns=ns - int(start * 1e9), queued_ns=0)

        def take(pids: list[int]) -> dict[int, StackSample]:
            return {p: StackSample(p, native_threads, counters, counters) for p in pids}

        sampler.absorb({pid: StackSample(pid, threads, counters, counters)}, now, take)
    cls, threads = sampler.classes[pid], sampler.stacks[pid]
    return ObservedRank(rank=rank, pid=pid, host="h", phase=cls.phase, op=cls.op, where=cls.where,
                        user_frame=cls.user_frame, detail=cls.detail, threads=threads,
                        native=bool(threads) and any(f.native for f in threads[0].frames),
                        progress_seen=sampler.watch.take_signs(pid), watched_since=sampler.watch.first_seen(pid))


def judged(memory: JudgeMemory, ranks: list[ObservedRank], collectives: CollectiveState | None = None,
           now: float = END) -> Judgement:
    """The one judge over the replayed evidence, as the live view calls it."""
    return judge_job(ObservedJob(JOB, tuple(ranks), collectives), memory, now, JudgeOptions(window=WINDOW))


def replay(prefix: str, pid: int, wakeups_per_sample: int, native: bool = True) -> Rank:
    """One rank's replayed recording, judged on its own."""
    memory = JudgeMemory()
    (rank,) = judged(memory, [observe(prefix, pid, wakeups_per_sample, native)]).ranks
    return rank


def gloo_stacks(name: str) -> tuple[ThreadStack, ...]:
    data = json.loads((FIXTURES / "pyspy" / name).read_text())
    main_pid = next(t["os_thread_id"] for t in data if t["thread_name"] == "MainThread")
    return tuple(parse_dump(data, main_pid))


def gloo_mismatch() -> tuple[list[ObservedRank], CollectiveState, float]:
    """Two gloo ranks (torch 2.13) that never wake up, both at the recorded all_gather stack, with
    the Flight Recorder traces of the recorded mismatch (rank 0 enqueued all_reduce #5)."""
    stacks = gloo_stacks("gloo_all_gather.json")
    ranks = [sample_rounds(100 + n, [stacks] * 3, 0, None, n) for n in (0, 1)]
    traces = {n: load_trace((FIXTURES / "fr" / "gloo-2.13" / "mismatch" / f"rank{n}.json").read_bytes())
              for n in (0, 1)}
    return ranks, read_rows(traces, source="hook"), END


def h100_item_hang() -> tuple[list[ObservedRank], CollectiveState, float]:
    """The recorded H100 hang in ``.item()`` behind an all_reduce, with its Flight Recorder dump,
    judged 27.4 s after the all_reduce was enqueued."""
    fr = FIXTURES / "fr" / "h100" / "hook-dump_nccl_trace_json-hung.json"
    state = read_rows({0: load_trace(fr.read_bytes())}, source="hook")
    now = state.ranks[0].pending_since + 27.4
    rank = observe("nccl_item-pid557", 557, wakeups_per_sample=0, start=now - 3 * SPACING)
    return [rank], state, now

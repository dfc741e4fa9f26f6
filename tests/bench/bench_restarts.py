"""Benchmark: a week-long live view of a job whose ranks keep restarting; the viewer's memory stays flat.

Each poll every rank of an 8-rank job restarts under a new PID (an elastic job restarting its
workers, compressed: a real week might see a few hundred restarts). Every poll goes through the
live view's own per-PID machinery: the sampler absorbs a recorded py-spy stack per rank
(classification, its ``StackWatch``), ``LocalEvidence`` builds the ranks' evidence (exits, restarts,
what it forgets) and ``judge_job`` judges it with one ``JudgeMemory`` kept across polls. PIDs lie
above ``pid_max``: /proc has nothing for them, so no real process is touched.

    python tests/bench/bench_restarts.py [--restarts 5000] [--ranks 8]

Prints the Python heap (tracemalloc) at its highest in the second quarter of the restarts and in the
second half, and their ratio, and the per-PID records kept after a quarter and at the end; exits 1
when what is kept per PID grows with the restarts or the heap grows by more than a quarter.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_merge import recorded_threads  # noqa: E402

from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, judge_job  # noqa: E402
from trainwatch.probes.local_evidence import LocalEvidence  # noqa: E402
from trainwatch.probes.observed import ObservedJob, StackSample, ThreadCounters  # noqa: E402
from trainwatch.probes.read.processes.exits import FORGOTTEN_KEPT, ExitLedger  # noqa: E402
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess, job_record  # noqa: E402
from trainwatch.probes.sampling import Sampler  # noqa: E402

CHECKPOINTS = 16  # heap readings over the run
HEAP_GROWTH = 1.25  # the most the heap may grow from a quarter of the restarts to the end
BASE = 4_000_000  # above the kernel's largest pid_max (2^22): never a real process


def kept(evidence: LocalEvidence, sampler: Sampler, memory: JudgeMemory, exits: ExitLedger) -> dict[str, int]:
    """What is remembered per PID, per holder."""
    return {"seen": len(evidence.seen), "stacks": len(sampler.stacks), "classes": len(sampler.classes),
            "looks": len(sampler.watch._looks), "progress": len(memory.progress._tracks), "exits": len(exits._exits)}


def run(restarts: int, ranks: int) -> dict:
    threads = recorded_threads("gloo_all_gather.json")
    memory, exits = JudgeMemory(), ExitLedger(root_pid=1)
    sampler = Sampler(exits, auto_native=False)
    evidence = LocalEvidence(sampler, exits, gpu=None)
    early_at = max(1, restarts // 4)
    step = max(1, restarts // CHECKPOINTS)
    heaps: list[int] = []
    early_kept: dict[str, int] = {}
    tracemalloc.start()
    started = time.perf_counter()
    for restart in range(restarts):
        now = 1_000.0 + restart
        pids = [BASE + restart * ranks + n for n in range(ranks)]
        job = JobProcesses(launcher="torchrun", root_pid=1, host="h", local_world_size=ranks, world_size=ranks,
                           ranks=tuple(RankProcess(pid=p, rank=n, local_rank=n, create_time=now)
                                       for n, p in enumerate(pids)))
        counters = ThreadCounters(cpu_ticks=restart, voluntary=restart, involuntary=0)
        samples = {p: StackSample(p, threads, counters, counters) for p in pids}
        sampler.absorb(samples, now, lambda wanted: {})
        observed, _host = evidence.ranks(job, samples, now, [], [])
        judge_job(ObservedJob(job_record(job), tuple(observed)), memory, now, JudgeOptions(window=1.0))
        if restart + 1 == early_at:
            early_kept = kept(evidence, sampler, memory, exits)
        if (restart + 1) % step == 0 or restart + 1 == restarts:
            gc.collect()
            heaps.append(tracemalloc.get_traced_memory()[0])
    took = time.perf_counter() - started
    end_kept = kept(evidence, sampler, memory, exits)
    tracemalloc.stop()
    # Dicts keep room for what was deleted until they resize, so the heap saws up and down: compare
    # the highest point of the second half with that of the second quarter.
    half = len(heaps) // 2
    return {"restarts": restarts, "ranks": ranks, "took_s": took, "early_at": early_at,
            "early_bytes": max(heaps[half // 2:half]), "early_kept": early_kept,
            "end_bytes": max(heaps[half:]), "end_kept": end_kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restarts", type=int, default=5000)
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args(argv)
    r = run(args.restarts, args.ranks)
    pids = r["restarts"] * r["ranks"]
    print(f"{r['restarts']} polls, every one of {r['ranks']} ranks restarting each poll ({pids} PIDs) in "
          f"{r['took_s']:.1f} s ({1000 * r['took_s'] / r['restarts']:.2f} ms per poll)")
    print(f"  heap at most {r['early_bytes'] / 1024:.0f} KiB in the second quarter of the restarts, "
          f"{r['end_bytes'] / 1024:.0f} KiB in the second half ({r['end_bytes'] / r['early_bytes']:.2f}x)")
    print(f"  kept per PID after {r['early_at']}: {r['early_kept']}; after {r['restarts']}: {r['end_kept']}")
    if r["end_kept"] != r["early_kept"] or max(r["end_kept"].values()) > 2 * r["ranks"]:
        print("FAILED: what is kept per PID grows with the restarts")
        return 1
    if r["early_at"] * r["ranks"] < FORGOTTEN_KEPT:
        print(f"  (the heap is judged from {FORGOTTEN_KEPT * 4 // r['ranks'] + 1} restarts on: until then the "
              f"ledger's list of restarted PIDs is still filling to its {FORGOTTEN_KEPT})")
    elif r["end_bytes"] > HEAP_GROWTH * r["early_bytes"]:
        print(f"FAILED: the heap grew more than {HEAP_GROWTH}x")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

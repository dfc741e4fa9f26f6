"""Benchmark (not a test): what reading the step costs. A plain `py-spy dump --json` vs the same
dump with `--locals`, per rank, interleaved in one run; then one parallel sampling pass over all
ranks with and without the locals; then one deep stack (many frames, many locals each), closer
to a real trainer than the planted job's shallow loop.

    python tests/bench/bench_steps.py [--ranks 4] [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from real_jobs import PlantedJob  # noqa: E402

from trainwatch.probes.read.processes import procfs  # noqa: E402
from trainwatch.probes.read.stacks.pyspy import dump_stacks  # noqa: E402
from trainwatch.probes.read.stacks.sampler import sample_all  # noqa: E402

DEEP = textwrap.dedent("""
    import time
    def level(n, step):
        name, ratio, rows = f"layer{n}", n / 3, list(range(50))
        config, tag, count = {"n": n, "rows": rows}, "x" * 200, n * 7
        if n == 0:
            while True:
                time.sleep(0.01)
        return level(n - 1, step)
    level(40, 1204)
""")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def per_pid(pids: list[int], repeat: int) -> tuple[float, float]:
    """Median seconds of one plain and one --locals dump, alternating on every PID."""
    plain, local = [], []
    for _ in range(repeat):
        for pid in pids:
            plain.append(timed(lambda: dump_stacks(pid)))
            local.append(timed(lambda: dump_stacks(pid, locals=True)))
    return statistics.median(plain), statistics.median(local)


def per_pass(pids: list[int], repeat: int) -> tuple[float, float]:
    """Median seconds of one parallel sampling pass over every PID, without and with locals."""
    plain, local = [], []
    for _ in range(repeat):
        for locals_for in (frozenset(), frozenset(pids)):
            requests = [(pid, False, None, False, procfs.thread_counters(pid)) for pid in pids]
            took = timed(lambda: sample_all(requests, locals_for=locals_for))
            (local if locals_for else plain).append(took)
    return statistics.median(plain), statistics.median(local)


def line(label: str, plain: float, local: float) -> None:
    print(f"  {label:<34} plain {plain * 1000:6.1f} ms   --locals {local * 1000:6.1f} ms   "
          f"ratio {local / plain:4.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, \
            PlantedJob(Path(tmp), "healthy", nproc=args.ranks, deadline=300, step_s=0.2) as job:
        pids = job.wait_for_ranks(timeout=180)
        print(f"{len(pids)}-rank planted gloo job (shallow loop), median of {args.repeat} rounds:")
        found = sample_all([(pid, False, None, False, None) for pid in pids], locals_for=frozenset(pids))
        assert all(found[pid].threads for pid in pids), "a rank could not be sampled with --locals"
        line("one dump, per rank", *per_pid(pids, args.repeat))
        line(f"parallel pass over {len(pids)} ranks", *per_pass(pids, args.repeat))
    deep = subprocess.Popen([sys.executable, "-c", DEEP])
    try:
        time.sleep(1.0)
        print(f"one process, 41 frames x 9 locals each, median of {args.repeat}:")
        line("one dump", *per_pid([deep.pid], args.repeat))
    finally:
        deep.kill()
        deep.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

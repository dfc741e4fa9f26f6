"""Benchmark (not a test): one sampling pass of trainwatch vs a sequential `py-spy dump` loop, same 8 ranks.

    python tests/bench/bench_snapshot.py [--ranks 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from real_jobs import PlantedJob  # noqa: E402

from trainwatch.probes.read.pyspy import find_pyspy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, PlantedJob(Path(tmp), "mismatch", nproc=args.ranks, deadline=300) as job:
        pids = job.wait_for_ranks(timeout=180)
        pyspy = find_pyspy()
        from trainwatch.probes.live import LocalSource
        loop, ours, inproc = [], [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            snap = LocalSource(job.pid, window=0, gpu=False).poll()
            assert len(snap.ranks) == args.ranks, snap.ranks
            inproc.append(time.perf_counter() - start)
            start = time.perf_counter()
            for pid in pids:
                subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, timeout=30)
            loop.append(time.perf_counter() - start)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(job.pid), "--window",
                                   "0", "--json"], capture_output=True, timeout=60, check=True)
            assert len(json.loads(done.stdout)["ranks"]) == args.ranks
            ours.append(time.perf_counter() - start)
        a, b, c = statistics.median(loop), statistics.median(ours), statistics.median(inproc)
        print(f"{len(pids)} ranks, median of {args.repeat}:")
        print(f"  sequential py-spy dump loop        {a * 1000:7.0f} ms")
        print(f"  trainwatch sampling pass           {c * 1000:7.0f} ms  (discovery + parallel py-spy + analysis, in process)")
        print(f"  trainwatch snapshot --window 0     {b * 1000:7.0f} ms  (whole CLI: start-up, discovery, sampling, analysis)")
        print(f"  ratio sampling pass / loop         {c / a:7.2f}")
        print(f"  ratio whole CLI / loop             {b / a:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

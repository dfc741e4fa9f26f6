"""Time `trainwatch dump` of a real gloo job, with and without native stacks.

Run: ``python tests/bench/bench_dump.py [--nproc 8] [--repeat 2]``. Prints one line per
configuration; the job is killed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_jobs import PlantedJob  # noqa: E402
from trainwatch.probes.evidence.bundle import write_bundle  # noqa: E402
from trainwatch.probes.live import open_source  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--scenario", default="straggler")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="trainwatch-bench-"))
    job = PlantedJob(work / "job", args.scenario, nproc=args.nproc, deadline=300).start()
    try:
        pids = job.wait_for_ranks(timeout=180)
        source = open_source(pids[0], window=0.5)
        try:
            snapshot = source.poll()
        finally:
            source.close()
        print(f"{args.nproc}-rank {args.scenario} job, {len(snapshot.ranks)} ranks found")
        assert len(snapshot.ranks) == args.nproc, snapshot.ranks
        for native in (False, True):
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                bundle = write_bundle(pids[0], snapshot, work / "out", native=native)
                times.append(time.perf_counter() - started)
                assert (Path(bundle) / "summary.md").is_file(), f"no summary.md in {bundle}"
                shutil.rmtree(bundle)
            label = "with native stacks   " if native else "without native stacks"
            print(f"dump {label}: best {min(times):.2f}s, worst {max(times):.2f}s over {len(times)} runs")
    finally:
        job.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

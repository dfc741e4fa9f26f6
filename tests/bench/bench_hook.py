"""Step rate of a planted healthy job, unarmed vs armed with `trainwatch run`.

    /tmp/twenv/bin/python tests/bench/bench_hook.py [--seconds 10] [--nproc 2]

Prints both rates (steps/s of rank 0, median of interleaved rounds) and armed/unarmed;
within noise means ~1.0. On a loaded machine use more rounds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from real_jobs import PlantedJob  # noqa: E402

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def step_rate(workdir: Path, seconds: float, nproc: int, armed: bool) -> float:
    prefix = [*TRAINWATCH, "run", "--out", str(workdir / "run"), "--"] if armed else None
    job = PlantedJob(workdir, "healthy", nproc=nproc, deadline=seconds + 30, step_s=0.0, prefix=prefix)
    with job:
        job.wait_for_ranks(steps=1)
        first = _last_step(job.log)
        start = time.monotonic()
        time.sleep(seconds)
        last = _last_step(job.log)
        elapsed = time.monotonic() - start
    return (last - first) / elapsed


def _last_step(log: Path) -> int:
    steps = re.findall(r"^step (\d+) ", log.read_text(errors="replace"), re.MULTILINE)
    return int(steps[-1]) if steps else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each; medians are shown")
    args = parser.parse_args(argv)
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):  # interleaved, so load from elsewhere hits both alike
            for armed_run in (False, True):
                workdir = Path(tmp) / f"{'armed' if armed_run else 'unarmed'}{i}"
                rates[armed_run].append(step_rate(workdir, args.seconds, args.nproc, armed=armed_run))
    unarmed, armed = statistics.median(rates[False]), statistics.median(rates[True])
    assert unarmed > 0 and armed > 0, f"a job made no steps (unarmed {unarmed}, armed {armed})"
    print(f"unarmed {unarmed:.1f} steps/s")
    print(f"armed   {armed:.1f} steps/s")
    print(f"ratio   {armed / unarmed:.3f}" if unarmed else "ratio   n/a (no steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

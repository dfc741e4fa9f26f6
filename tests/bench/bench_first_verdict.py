"""Time from `trainwatch attach` to the first verdict on screen, on 8-rank jobs.

Not a test; prints figures. For a healthy DDP job and a DDP straggler job (ranks 0-6 wait inside
``backward`` while rank 7 sleeps, so the first poll needs native samples): the real app is run
headless, from opening the source (discovery) until the header shows a verdict, against the
target of one progress window plus one second. The interpreter's own start and imports, paid
once by the CLI before that, are measured separately.

    python tests/bench/bench_first_verdict.py [--ranks 8] [--window 2]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_jobs import PlantedJob  # noqa: E402

from trainwatch.probes.live import open_source  # noqa: E402
from trainwatch.tui.app import TrainwatchApp  # noqa: E402


async def first_verdict(pid: int, window: float) -> tuple[float, str]:
    started = time.monotonic()
    source = open_source(pid, window=window)
    app = TrainwatchApp(source, interval=2.0)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            while app.snapshot is None:
                await pilot.pause(0.02)
            elapsed = time.monotonic() - started
            verdict = app.snapshot.verdict
    finally:
        source.close()
    return elapsed, f"{verdict.kind}: {verdict.summary}"


def cli_start() -> float:
    """Seconds for the CLI's interpreter start and the imports `attach` needs (Textual, the app, the probes)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import trainwatch.tui.cli, trainwatch.tui.app, trainwatch.probes.live"],
                   capture_output=True, check=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--window", type=float, default=2.0)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tw-bench-first-"))
    print(f"CLI interpreter start and imports: {cli_start():.2f}s (paid once, before discovery)")
    for scenario in ("healthy", "straggler"):
        job = PlantedJob(root / scenario, scenario, nproc=args.ranks, deadline=180, step_s=0.02,
                         script_args=["--ddp"]).start()
        try:
            job.wait_for_ranks(timeout=180)
            time.sleep(4)  # past start-up, and the straggler is stuck
            elapsed, verdict = asyncio.run(first_verdict(job.proc.pid, args.window))
        finally:
            job.stop()
        assert verdict.startswith(scenario), f"{scenario} job judged {verdict}"
        target = args.window + 1.0
        print(f"{scenario} DDP job, {args.ranks} ranks: first verdict on screen after {elapsed:.2f}s "
              f"(target window + 1 s = {target:.1f}s: {'met' if elapsed <= target else 'MISSED'})")
        print(f"  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

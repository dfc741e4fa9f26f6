"""Regenerate ``screenshots/*.svg``: the real monitor on real planted jobs, 120x40.

Run from the repository root (needs PyTorch and py-spy)::

    python -m trainwatch.tui.screenshots [--out screenshots] [--only straggler]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from .app import TrainwatchApp
from .commands.demo import DemoJob

# scenario -> (file name, verdict to wait for, seconds per training step)
SHOTS = {
    "healthy": ("healthy", "healthy", 0.05),
    "straggler": ("straggler", "straggler", 0.05),
    "mismatch": ("mismatch", "mismatch", 0.05),
    "segfault": ("crashed", "crashed", 3.0),  # slow steps: sample before rank 2 dies at step 3
}
SIZE = (120, 40)


async def capture(job: DemoJob, verdict: str, out: Path, timeout: float = 60.0) -> str:
    """Attach to the job headless, wait for ``verdict`` (the view selects the culprit), save the SVG."""
    from ..probes import open_source

    source = open_source(job.proc.pid, window=2.0)
    app = TrainwatchApp(source, interval=2.0, title=f"trainwatch: {out.stem}")
    seen, held_from = "none", None
    try:
        async with app.run_test(size=SIZE) as pilot:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                await pilot.pause(0.5)
                if app.snapshot is None:
                    continue
                seen = app.snapshot.verdict.kind
                held_from = (held_from or app.polls) if seen == verdict else None
                if held_from is not None and app.polls >= held_from + 2:  # a settled picture
                    break
            app.clear_notifications()
            await pilot.pause(0.3)
            app.save_screenshot(out.name, str(out.parent))
    finally:
        source.close()
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--only", choices=sorted(SHOTS), action="append")
    parser.add_argument("--ranks", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for scenario in args.only or SHOTS:
        name, verdict, step_s = SHOTS[scenario]
        job = DemoJob(scenario, args.ranks, deadline=120.0, step_s=step_s).start()
        try:
            job.wait_for_ranks()
            seen = asyncio.run(capture(job, verdict, args.out / f"{name}.svg"))
        finally:
            job.stop()
        ok = seen == verdict
        failed += not ok
        print(f"{'ok' if ok else 'MISMATCH'}: {args.out / (name + '.svg')} (verdict {seen}, wanted {verdict})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

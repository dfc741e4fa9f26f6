"""From a rank's stop to the first problem verdict, in `attach` and in `watch`, on real jobs.

Not a test; prints figures. A 3-rank gloo job runs healthy until its last rank stops, at a moment
drawn at random within its first seconds (it prints that moment: ``rank 2 stops at <unix time>``);
ranks 0-1 then wait for it in all_reduce. Measured, for each repetition, from that moment to the
first problem verdict:

* attach: the live source polled as the app polls it (every ``--interval`` from one poll's start to
  the next, ``--window`` for the first), the verdict taken when the poll returns;
* watch: the real ``trainwatch watch --json`` (its own interval and window), the verdict taken
  from its first problem ``verdict`` event.

A problem verdict before the stop is a false alarm (counted). The goal: within one interval and
the window after the stop (attach 2 s + 2 s, watch 5 s + 1 s). Anchors: Mycroft ≤ 15 s, Ray's
NCCL detector 60 s.

    python tests/bench/bench_latency.py [--reps 10] [--ranks 3]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_jobs import PlantedJob, default_signals  # noqa: E402

from trainwatch.probes.live import open_source  # noqa: E402
from trainwatch.probes.snapshot import PROBLEM_VERDICTS  # noqa: E402

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
STOP = re.compile(r"rank \d+ stops at (\d+\.\d+)")


def stopped_at(job: PlantedJob, timeout: float) -> float | None:
    text = job.log.read_text(errors="replace") if job.log.exists() else ""
    found = STOP.search(text)
    return float(found.group(1)) if found else None


def attach_once(job: PlantedJob, interval: float, window: float, timeout: float) -> tuple[float | None, int]:
    """(seconds from the stop to the first problem verdict, false alarms before the stop)."""
    source = open_source(job.pid, window=window)
    false_alarms = 0
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            started = time.monotonic()
            snap = source.poll()
            shown = time.time()
            stop = stopped_at(job, 0)
            if snap.verdict.kind in PROBLEM_VERDICTS:
                if stop is None or snap.taken_at < stop:
                    false_alarms += 1
                    print(f"    false alarm {snap.taken_at - (stop or snap.taken_at):+.1f}s: {snap.verdict.kind} "
                          f"{snap.verdict.culprits}: {snap.verdict.summary}")
                else:
                    return shown - stop, false_alarms
            time.sleep(max(0.2, interval - (time.monotonic() - started)))  # as the app: every interval from start to start
    finally:
        source.close()
    return None, false_alarms


def watch_once(job: PlantedJob, timeout: float, interval: float) -> tuple[float | None, int]:
    proc = subprocess.Popen([*TRAINWATCH, "watch", str(job.pid), "--json", "--interval", str(interval),
                             "--out", str(job.workdir / "watch")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, preexec_fn=default_signals)
    false_alarms = 0
    try:
        deadline = time.time() + timeout
        for line in proc.stdout:
            event = json.loads(line)
            if event["event"] == "verdict" and event["verdict"] in PROBLEM_VERDICTS:
                stop = stopped_at(job, 0)
                if stop is None or event["unix_time"] < stop:
                    false_alarms += 1
                    print(f"    false alarm: {event['verdict']} {event['culprits']}: {event['summary']}")
                else:
                    return event["unix_time"] - stop, false_alarms
            if time.time() > deadline:
                break
    finally:
        proc.terminate()
        proc.wait(10)
    return None, false_alarms


def run(mode: str, reps: int, ranks: int, root: Path, args: argparse.Namespace) -> tuple[list[float], int, int]:
    delays, false_alarms, missed = [], 0, 0
    for rep in range(reps):
        stall = random.uniform(args.stall_min, args.stall_max)
        job = PlantedJob(root / f"{mode}{rep}", "straggler", nproc=ranks, deadline=stall + 60,
                         script_args=["--stall-after", f"{stall:.2f}"])
        with job:
            job.wait_for_ranks(steps=0)
            if mode == "attach":
                delay, false = attach_once(job, args.interval, args.window, stall + 30)
            else:
                delay, false = watch_once(job, stall + 30, args.watch_interval)
        false_alarms += false
        if delay is None:
            missed += 1
        else:
            delays.append(delay)
        print(f"  {mode} #{rep + 1}: stopped after {stall:.1f}s; problem verdict "
              f"{'never' if delay is None else f'{delay:.2f}s'} after the stop; false alarms {false}")
    return delays, false_alarms, missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--interval", type=float, default=2.0, help="attach's interval")
    parser.add_argument("--window", type=float, default=2.0, help="attach's window")
    parser.add_argument("--watch-interval", type=float, default=5.0)
    parser.add_argument("--stall-min", type=float, default=4.0, help="the rank stops this long after its start, at least")
    parser.add_argument("--stall-max", type=float, default=12.0)
    parser.add_argument("--modes", default="attach,watch")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tw-bench-latency-"))
    goals = {"attach": args.interval + args.window, "watch": args.watch_interval + 1.0}
    ok = True
    for mode in args.modes.split(","):
        print(f"{mode}: {args.reps} runs, {args.ranks} ranks")
        delays, false_alarms, missed = run(mode, args.reps, args.ranks, root, args)
        if delays:
            print(f"{mode}: stop to first problem verdict: median {statistics.median(delays):.2f}s, "
                  f"worst {max(delays):.2f}s (goal {goals[mode]:.0f}s: {sum(d <= goals[mode] for d in delays)} "
                  f"of {len(delays)} within); false alarms {false_alarms}; missed {missed}")
        ok = ok and not missed and not false_alarms
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

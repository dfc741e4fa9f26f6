"""Cost of `trainwatch attach`: its own CPU and the job's step rate with and without it.

Not a test; prints figures. Starts an 8-rank healthy planted job, measures the step rate for
``--seconds`` alone, then with the monitor attached headless at the default refresh::

    python tests/bench/bench_attach.py [--ranks 8] [--seconds 60] [--interval 2]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time

STEP = re.compile(rb"^step (\d+) ", re.M)


def last_step(log) -> int:
    steps = STEP.findall(log.read_bytes())
    return int(steps[-1]) if steps else 0


def step_rate(log, seconds: float) -> float:
    start_step, start = last_step(log), time.monotonic()
    time.sleep(seconds)
    return (last_step(log) - start_step) / (time.monotonic() - start)


def attached_child(pid: int, seconds: float, interval: float) -> None:
    """Run the real app headless for ``seconds`` from its first poll (on a loaded machine that may
    take longer than any fixed start-up allowance), then print CPU seconds used (self + py-spy
    children)."""
    from trainwatch.probes.live import open_source
    from trainwatch.tui.app import TrainwatchApp

    usage = resource.getrusage(resource.RUSAGE_SELF)
    imports_cpu = usage.ru_utime + usage.ru_stime  # interpreter start and imports: paid once
    source = open_source(pid, window=2.0)
    app = TrainwatchApp(source, interval=interval)
    def arm() -> None:
        if app.polls >= 1:
            app.set_timer(seconds, app.exit)
        else:
            app.set_timer(0.2, arm)

    app.call_later(arm)
    started = time.monotonic()
    app.run(headless=True, size=(120, 40))
    wall = time.monotonic() - started
    source.close()
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall": wall, "polls": app.polls, "imports_cpu": imports_cpu,
                      "own_cpu": own.ru_utime + own.ru_stime, "children_cpu": kids.ru_utime + kids.ru_stime}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--child", type=int, metavar="PID", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        attached_child(args.child, args.seconds, args.interval)
        return 0

    from trainwatch.tui.commands.demo import DemoJob

    job = DemoJob("healthy", args.ranks, deadline=2 * args.seconds + 120).start()
    try:
        job.wait_for_ranks(timeout=180)
        time.sleep(3)  # past the start-up
        alone = step_rate(job.log, args.seconds)
        child = subprocess.Popen([sys.executable, __file__, "--child", str(job.proc.pid),
                                  "--seconds", str(args.seconds), "--interval", str(args.interval)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        time.sleep(3)  # discovery and the first window
        attached = step_rate(job.log, args.seconds - 6)
        out, _ = child.communicate(timeout=args.seconds + 60)
        if child.returncode != 0 or not out.strip():
            print(f"the attached monitor failed (status {child.returncode})", file=sys.stderr)
            return 1
        usage = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        job.stop()
    if usage["polls"] < 1 or alone <= 0:
        print(f"no poll ({usage['polls']}) or no steps ({alone:.2f}/s)", file=sys.stderr)
        return 1
    cpu = usage["own_cpu"] + usage["children_cpu"]
    print(f"job: {args.ranks} ranks, healthy; refresh every {args.interval:g}s; {usage['polls']} polls "
          f"in {usage['wall']:.0f}s")
    steady = cpu - usage["imports_cpu"]
    print(f"trainwatch CPU without start-up (imports {usage['imports_cpu']:.1f}s): "
          f"{100 * steady / usage['wall']:.1f}% of one core")
    print(f"trainwatch CPU: {100 * cpu / usage['wall']:.1f}% of one core "
          f"(app {usage['own_cpu']:.1f}s, py-spy {usage['children_cpu']:.1f}s)")
    print(f"step rate: {alone:.2f}/s alone, {attached:.2f}/s attached "
          f"({100 * (attached - alone) / alone:+.1f}%)" if alone else "step rate: no steps seen")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cost of the automatic native samples, side by side with judging from Python stacks alone.

Not a test; prints figures. Two 8-rank DDP jobs (gradients all-reduced inside ``backward``):

1. a straggler job (rank 7 sleeps, ranks 0-6 wait inside backward): polls of the live source
   with automatic native samples on and off: native samples per poll, time per poll, py-spy's
   peak memory, and the verdict each gives;
2. a healthy job: the step rate alone, and with the live source polling every 2 s with
   automatic native samples on, then off (the rounds interleaved), and trainwatch's CPU.

    python tests/bench/bench_native.py [--ranks 8] [--seconds 20]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_jobs import PlantedJob, rank_stuck_at, wait_until  # noqa: E402

from trainwatch.probes.live import LocalSource  # noqa: E402


def ddp_job(workdir: Path, scenario: str, ranks: int, deadline: float) -> PlantedJob:
    return PlantedJob(workdir, scenario, nproc=ranks, deadline=deadline, step_s=0.02, script_args=["--ddp"]).start()


def wait_for_text(job: PlantedJob, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and text not in job.log.read_text(errors="replace"):
        time.sleep(0.5)


def children_cpu_and_rss() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def polls(pid: int, auto_native: bool, count: int) -> dict:
    source = LocalSource(pid, window=2.0, gpu=False, auto_native=auto_native)
    times, natives, verdict = [], [], None
    try:
        for _ in range(count):
            before = source._sampler.native.taken
            started = time.monotonic()
            snap = source.poll()
            times.append(time.monotonic() - started)
            natives.append(source._sampler.native.taken - before)
            verdict = snap.verdict
            time.sleep(1.0)
    finally:
        source.close()
    return {"times": times, "natives": natives, "verdict": verdict}


def step_rate(job: PlantedJob, seconds: float) -> float:
    def last() -> int:
        steps = [int(line.split()[1]) for line in job.log.read_text(errors="replace").splitlines()
                 if line.startswith("step ")]
        return steps[-1] if steps else 0
    start, t0 = last(), time.monotonic()
    time.sleep(seconds)
    return (last() - start) / (time.monotonic() - t0)


def attached_rate(job: PlantedJob, auto_native: bool, seconds: float) -> tuple[float, float]:
    """Step rate while a live source polls every 2 s, and trainwatch's CPU (self + py-spy) in % of a core."""
    import threading
    source = LocalSource(job.proc.pid, window=2.0, gpu=False, auto_native=auto_native)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            source.poll()
            stop.wait(2.0)
    own0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0, _ = children_cpu_and_rss()
    thread = threading.Thread(target=loop, daemon=True)
    started = time.monotonic()
    thread.start()
    rate = step_rate(job, seconds)
    stop.set()
    thread.join()
    wall = time.monotonic() - started
    own1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1, _ = children_cpu_and_rss()
    source.close()
    cpu = (own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime) + (kids1 - kids0)
    return rate, 100 * cpu / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--polls", type=int, default=6)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tw-bench-native-"))

    job = ddp_job(root / "straggler", "straggler", args.ranks, deadline=240)
    try:
        job.wait_for_ranks(timeout=180)
        # the straggler stops at step 3: wait for it in its planted sleep, not for a step that never comes
        wait_until(lambda: rank_stuck_at(job.script, "# stuck in its own work"), 120, "the straggler's sleep")
        time.sleep(2)
        _, rss0 = children_cpu_and_rss()
        on = polls(job.proc.pid, True, args.polls)
        _, rss_on = children_cpu_and_rss()
        off = polls(job.proc.pid, False, args.polls)
    finally:
        job.stop()
    print(f"straggler DDP job, {args.ranks} ranks, {args.polls} polls each (2 s window on the first):")
    assert on["verdict"].kind == "straggler" and on["verdict"].culprits == (args.ranks - 1,), on["verdict"]
    # Without a native sample (off here; timed out on a loaded node) the waiting ranks' wait is unnamed,
    # not their own work: the straggler is still the one in its own work, and the summary says what is unread.
    assert off["verdict"].kind == "straggler" and off["verdict"].culprits == (args.ranks - 1,), off["verdict"]
    assert "a wait its Python stack does not name" in off["verdict"].summary, off["verdict"]
    for name, run in (("auto native on ", on), ("auto native off", off)):
        times = run["times"]
        print(f"  {name}: native samples per poll {run['natives']}, first poll {times[0]:.2f}s, "
              f"later polls median {sorted(times[1:])[len(times[1:]) // 2]:.2f}s")
        print(f"    verdict: {run['verdict'].kind}: {run['verdict'].summary}")
    print(f"  py-spy peak RSS (largest child so far): {rss0:.0f} MB before, {rss_on:.0f} MB after the native polls")

    job = ddp_job(root / "healthy", "healthy", args.ranks, deadline=6 * args.seconds + 180)
    try:
        job.wait_for_ranks(timeout=180)
        wait_for_text(job, "step 20", timeout=120)
        time.sleep(3)
        rates = {"alone": [], "on": [], "off": []}
        cpu = {"on": [], "off": []}
        for _ in range(2):  # interleaved rounds
            rates["alone"].append(step_rate(job, args.seconds / 2))
            for mode in ("on", "off"):
                rate, used = attached_rate(job, mode == "on", args.seconds / 2)
                rates[mode].append(rate)
                cpu[mode].append(used)
    finally:
        job.stop()
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    assert mean["alone"] > 0 and mean["on"] > 0, mean
    print(f"healthy DDP job, {args.ranks} ranks, 2 interleaved rounds of {args.seconds / 2:g}s:")
    print(f"  step rate alone {mean['alone']:.2f}/s; polled with auto native on {mean['on']:.2f}/s "
          f"(ratio {mean['on'] / mean['alone']:.2f}), off {mean['off']:.2f}/s (ratio {mean['off'] / mean['alone']:.2f})")
    print(f"  trainwatch CPU (source + py-spy): on {sum(cpu['on']) / 2:.1f}% of a core, "
          f"off {sum(cpu['off']) / 2:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (not a test): what a look costs a rank that holds many threads.

A GPU rank holds ~160 threads (NCCL, CUDA, OpenMP, pin-memory), and a pausing py-spy attach stops
every one of them; in a lockstep job every rank then waits for the paused one. This starts a
2-rank lockstep gloo job (``many_threads_job.py``: tiny all_reduce steps as fast as they go, each
rank holding ``--threads`` threads in all) and, for each monitor in ``--modes``, measures
``--seconds`` with it looking and ``--seconds`` with nothing looking, in turn:

- ``attach``: the real app, headless, at the default 2 s refresh (``bench_attach.py --child``);
- ``watch``: ``trainwatch watch PID`` at its defaults.

For each: the median over seconds (both ranks) of each second's longest gap between two steps,
its 90th percentile (a look every 2 s touches half the seconds: the median sits on the edge), the
worst second's, the step rate, and the monitor's own CPU (start-up included); *cost* is the monitor's median minus that of the seconds
alone around it. ``--baseline DIR`` runs each monitor from another checkout too (a ``git
worktree`` of the commit before), in the same job and the same rounds, side by side.

    python tests/bench/bench_look_cost.py [--threads 8,64,160] [--seconds 20] [--modes attach,watch]
                                          [--rounds 1] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from real_jobs import PlantedJob, default_signals  # noqa: E402

from bench_snapshot import baseline_env  # noqa: E402

SETTLE_S = 4.0  # a monitor's start: interpreter, imports, discovery, the first window (not counted)


def seconds_between(gaps: Path, start: float, end: float) -> list[tuple[int, float]]:
    """(steps, longest gap in ms) of each whole second of either rank between ``start`` and ``end``."""
    found = []
    for path in gaps.glob("rank*.txt"):
        for line in path.read_text().splitlines():
            at, steps, worst = line.split()
            if start + 1.0 <= float(at) <= end:  # the second ended in the span and began in it too
                found.append((int(steps), float(worst)))
    return found


def monitor(mode: str, pid: int, seconds: float, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    if mode == "attach":
        cmd = [sys.executable, str(HERE / "bench_attach.py"), "--child", str(pid), "--seconds", str(seconds)]
    else:
        cmd = [sys.executable, "-m", "trainwatch.tui.cli", "watch", str(pid), "--out", str(cwd / "watch")]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_signals)  # stopped with SIGINT: not ignored, whoever started us


def cpu_seconds(pid: int) -> float:
    """CPU a monitor used so far, its py-spy runs included (those it reaped)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:  # it ended already: nothing to add
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


def one_phase(job: PlantedJob, gaps: Path, seconds: float, mode: str | None, env: dict[str, str],
              cwd: Path, cpu: list[float]) -> list[tuple[int, float]]:
    """Seconds of the job with ``mode`` looking (None: nothing), after the monitor's start; the
    monitor's share of one core, start-up included, is appended to ``cpu``."""
    proc = monitor(mode, job.pid, seconds + SETTLE_S, env, cwd) if mode else None
    start = time.time() + (SETTLE_S if mode else 0.0)
    time.sleep(seconds + (SETTLE_S if mode else 0.0))
    end = time.time()
    if proc is not None:
        cpu.append(cpu_seconds(proc.pid) / (end - start + SETTLE_S))
        if proc.poll() is None and mode != "attach":  # attach ends by itself, `seconds` after its first poll
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        if mode == "attach" and (proc.returncode != 0 or json.loads(out.decode().splitlines()[-1])["polls"] < 1):
            raise RuntimeError(f"attach failed or never polled ({proc.returncode}): {err.decode()[-2000:]}")
        if mode == "watch" and b"verdict" not in out:
            raise RuntimeError(f"watch said no verdict: {out.decode()[-2000:]} {err.decode()[-2000:]}")
    if job.proc is not None and job.proc.poll() is not None:
        errors = [line for line in job.log.read_text().splitlines() if "Error" in line or "error" in line]
        raise RuntimeError("the job ended early:\n" + "\n".join(errors[:20]))
    return seconds_between(gaps, start, end)


def summary(found: list[tuple[int, float]]) -> dict[str, float]:
    if not found:
        raise RuntimeError("no whole second of steps was recorded")
    worst = [w for _, w in found]
    return {"median_ms": statistics.median(worst), "p90_ms": statistics.quantiles(worst, n=10)[-1] if len(worst) > 1
            else worst[0], "max_ms": max(worst),
            "steps_s": sum(s for s, _ in found) / len(found)}  # a rank's (lockstep: both make as many)


def one_size(threads: int, args: argparse.Namespace, envs: dict[str, dict[str, str]]) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        gaps = tmp / "gaps"
        gaps.mkdir()
        phases = len(args.modes) * len(envs) * 2 + 1
        deadline = args.rounds * phases * (args.seconds + SETTLE_S + 10) + 60
        with PlantedJob(tmp / "job", nproc=2, deadline=deadline, script=HERE / "many_threads_job.py",
                        script_args=["--threads", str(threads), "--gaps", str(gaps), "--backend", args.backend]) as job:
            job.wait_for_ranks(timeout=180)
            time.sleep(1.0)  # past the first steps
            seen: dict[str, list] = {"alone": []}
            cpu: dict[str, list[float]] = {"alone": []}
            for _ in range(args.rounds):
                seen["alone"] += one_phase(job, gaps, args.seconds, None, envs["this"], tmp, [])
                for mode in args.modes:
                    for name, env in envs.items():
                        key = f"{mode} ({name})"
                        seen.setdefault(key, [])
                        seen[key] += one_phase(job, gaps, args.seconds, mode, env, tmp, cpu.setdefault(key, []))
                        seen["alone"] += one_phase(job, gaps, args.seconds, None, env, tmp, [])
            log = job.log.read_text(errors="replace")
    return {"log": log, **{name: {**summary(found), "cpu": statistics.mean(cpu[name]) if cpu[name] else 0.0}
                           for name, found in seen.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="8,64,160", help="comma list of threads per rank (default 8,64,160)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--modes", default="attach,watch")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backend", default="gloo", help="gloo, or nccl (one GPU; --threads 0: NCCL's own)")
    parser.add_argument("--baseline", type=Path, help="another checkout whose monitors run beside this one's")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    assert set(args.modes) <= {"attach", "watch"}, args.modes
    # Each monitor reads the ranks itself: none takes another's dump (read/stacks/shared_dumps.py).
    env = {**os.environ, "TRAINWATCH_SHARED_DUMPS": "0"}
    with tempfile.TemporaryDirectory() as shim:
        envs = {"this": env}
        if args.baseline:
            envs["baseline"] = {**baseline_env(args.baseline, Path(shim)), "TRAINWATCH_SHARED_DUMPS": "0"}
        for threads in (int(n) for n in args.threads.split(",")):
            figures = one_size(threads, args, envs)
            alone = figures["alone"]
            counts = sorted(set(re.findall(r"look-cost rank \d+ threads (\d+)", figures.pop("log"))))
            print(f"{args.backend}: {threads} threads asked per rank (had {'/'.join(counts)}), 2 ranks; "
                  f"{args.seconds:g} s a phase, {args.rounds} round(s); each second's longest gap between two steps:")
            for name, f in figures.items():
                cost = "" if name == "alone" else (
                    f"  cost {f['median_ms'] - alone['median_ms']:+6.1f} ms, "
                    f"step rate {f['steps_s'] / alone['steps_s']:.3f}x alone; "
                    f"itself {100 * f['cpu']:.0f}% of a core")
                print(f"  {name:<18} median {f['median_ms']:6.1f} ms  p90 {f['p90_ms']:6.1f} ms  "
                      f"worst {f['max_ms']:6.1f} ms  "
                      f"{f['steps_s']:7.0f} steps/s{cost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stress: every rank death under `watch` gives a `crashed` alert naming the rank that died first and
how. Not in CI (each round is a real 3-rank job); the result goes in docs/deaths.md as n/N.

For each scenario, N rounds of: a real gloo job (torchrun reaps dead ranks within 0.1 s), `trainwatch
watch --json --on-event` attached from the start, one rank (or its DataLoader worker) killed. A round
passes when the `crashed` alert names that rank alone, with the right cause. Also printed: seconds from the
death to the alert, and which witness told how it ended (zombie, the kernel's exit event, the
launcher's log, the memory cgroup). Where the scenario allows, the rank that dies rotates 0, 1, 2.
The self-kills run under `trainwatch run`: just before a collective, while the others compute,
while they wait in a collective; the OOM kill in a memory cgroup, armed and not. And an abort that
is not the culprit's death: an all_gather of another size under `trainwatch run`, which gloo
answers by aborting the rank that receives it.

Run: ``python tests/bench/stress_deaths.py [--rounds 20] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ when run as a script

import psutil  # noqa: E402

from real_jobs import PlantedJob, wait_until  # noqa: E402
from watching import TRAINWATCH, Watch, rank_pid  # noqa: E402

CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def outside_kill(workdir: Path, env: dict | None = None) -> tuple[dict, float]:
    with PlantedJob(workdir / "job", "healthy", nproc=3, deadline=60) as job:
        job.wait_for_ranks()
        watch = Watch(job.pid, workdir, env=env)
        time.sleep(1.0)
        died = time.time()
        os.kill(rank_pid(job, 2), signal.SIGKILL)
        crashed = watch.until(lambda e: e["event"] == "crashed", 60)
        watch.finish()
    return crashed, died


def self_kill_armed(workdir: Path, scenario: str = "sigkill", culprit: int = 2) -> tuple[dict, float]:
    """Under `trainwatch run`, the culprit SIGKILLs itself: ``sigkill`` just before a collective,
    ``killcompute`` while the others compute, ``killwait`` while they wait in the all_reduce."""
    prefix = [*TRAINWATCH, "run", "--out", str(workdir / "run"), "--"]
    args = ["--culprit", str(culprit)] + (["--fail-step", "8"] if scenario != "sigkill" else [])
    step_s = 1.0 if scenario == "sigkill" else 0.3
    with PlantedJob(workdir / "job", scenario, nproc=3, deadline=60, step_s=step_s, prefix=prefix,
                    script_args=args) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, workdir)
        crashed = watch.until(lambda e: e["event"] == "crashed", 60)
        watch.finish()
    return crashed, crashed["unix_time"]  # the death's own time is not known outside; latency not measured


def size_mismatch_armed(workdir: Path, culprit: int, odd_numel: int) -> tuple[dict, float]:
    """Under `trainwatch run`, the culprit all_gathers another size: gloo aborts the rank that
    receives the odd chunk (a neighbour when it is bigger, the culprit itself when smaller)."""
    prefix = [*TRAINWATCH, "run", "--out", str(workdir / "run"), "--"]
    args = ["--culprit", str(culprit), "--odd-numel", str(odd_numel), "--fail-step", "10"]
    with PlantedJob(workdir / "job", "gathersize", nproc=3, deadline=60, step_s=0.3, prefix=prefix,
                    script_args=args) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, workdir)
        crashed = watch.until(lambda e: e["event"] == "crashed", 60)
        watch.finish()
    return crashed, crashed["unix_time"]


def oom(workdir: Path, culprit: int = 2, armed: bool = False) -> tuple[dict, float]:
    group = CGROUP_V1 / f"trainwatch-stress-oom-{os.getpid()}"
    group.mkdir(exist_ok=True)
    prefix = [*TRAINWATCH, "run", "--out", str(workdir / "run"), "--"] if armed else None
    try:
        with PlantedJob(workdir / "job", "oom", nproc=3, deadline=60, step_s=1.5, prefix=prefix,
                        script_args=["--culprit", str(culprit)]) as job:
            job.wait_for_ranks(steps=0)
            culprit = rank_pid(job, culprit)
            (group / "memory.limit_in_bytes").write_text(str(256 << 20))
            (group / "cgroup.procs").write_text(str(culprit))
            watch = Watch(job.pid, workdir)
            crashed = watch.until(lambda e: e["event"] == "crashed", 60)
            watch.finish()
    finally:
        wait_until(lambda: not (group / "cgroup.procs").read_text().strip(), 30, "the cgroup to empty")
        group.rmdir()
    return crashed, crashed["unix_time"]


def worker_kill(workdir: Path) -> tuple[dict, float]:
    with PlantedJob(workdir / "job", "dataloader", nproc=3, deadline=60) as job:
        job.wait_for_ranks()
        culprit = rank_pid(job, 2)
        workers = wait_until(lambda: psutil.Process(culprit).children(), 30, "the DataLoader worker")
        watch = Watch(job.pid, workdir)
        died = time.time()
        workers[0].kill()
        crashed = watch.until(lambda e: e["event"] == "crashed", 60)
        watch.finish()
    return crashed, died


# name -> (run(workdir, culprit), words the alert must hold, whether the culprit rank rotates 0, 1, 2)
SCENARIOS = {
    "sigkill-outside": (lambda w, c: outside_kill(w), "SIGKILL", False),
    "sigkill-outside-no-exit-events": (lambda w, c: outside_kill(w, {"TRAINWATCH_EXIT_EVENTS": "0"}), "SIGKILL",
                                       False),
    "sigkill-self-armed": (lambda w, c: self_kill_armed(w, "sigkill", c), "SIGKILL", True),
    "sigkill-self-armed-others-compute": (lambda w, c: self_kill_armed(w, "killcompute", c), "SIGKILL", True),
    "sigkill-self-armed-others-wait": (lambda w, c: self_kill_armed(w, "killwait", c), "SIGKILL", True),
    "oom-cgroup": (lambda w, c: oom(w, c), "OOM killer", True),
    "oom-cgroup-armed": (lambda w, c: oom(w, c, armed=True), "OOM killer", True),
    "dataloader-worker-sigkill": (lambda w, c: worker_kill(w), "killed by SIGKILL", False),
    # the rank whose all_gather has another size, not the one gloo aborts (bigger and smaller in turn)
    "gloo-size-mismatch-armed": (lambda w, c: size_mismatch_armed(w, c, 5 if c % 2 == 0 else 3),
                                 "Received data size doesn't match expected size", True),
}


def main(rounds: int = 20, only: list[str] | None = None) -> dict[str, tuple[int, int]]:
    results = {}
    for name, (run, cause, rotate) in SCENARIOS.items():
        if only and name not in only:
            continue
        if name.startswith("oom-cgroup") and (os.geteuid() != 0 or not (CGROUP_V1 / "memory.limit_in_bytes").exists()):
            print(f"{name}: skipped (needs root and a cgroup v1 memory controller)")
            continue
        good, latencies = 0, []
        for n in range(rounds):
            culprit = n % 3 if rotate else 2
            with tempfile.TemporaryDirectory(prefix=f"tw-stress-{name}-") as tmp:
                try:
                    crashed, died = run(Path(tmp), culprit)
                except AssertionError as exc:
                    print(f"  {name} round {n + 1}: no crashed alert ({str(exc)[:200]})")
                    continue
            ok = crashed["culprits"] == [culprit] and cause in crashed["summary"]
            good += ok
            if crashed["unix_time"] > died:
                latencies.append(crashed["unix_time"] - died)
            if not ok:
                print(f"  {name} round {n + 1}: {crashed['culprits']} {crashed['summary'][:200]}")
        results[name] = (good, rounds)
        lat = f"; alert {statistics.median(latencies):.2f} s after the death (median)" if latencies else ""
        print(f"{name}: {good}/{rounds}{lat}", flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    main(args.rounds, args.only)

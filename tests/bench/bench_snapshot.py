"""Benchmark (not a test): one sampling pass of trainwatch vs a sequential `py-spy dump` loop, same ranks.

For each size in ``--ranks`` (a mismatch job: every rank blocked in a collective, once its ranks
have settled), median of ``--repeat`` rounds, the three measured in turn in each round; each ratio
is the median of the rounds' own ratios:

- the sequential loop: ``py-spy dump --pid`` on each rank, one after another;
- trainwatch's sampling pass in this process (discovery, parallel py-spy, judgement);
- ``trainwatch snapshot --window 0 --json``, the whole command (interpreter start-up, imports, the pass).

``--baseline DIR`` also times the whole command from another checkout of trainwatch (e.g. a
``git worktree`` of the previous commit), in the same rounds, so the two are compared side by side.

    python tests/bench/bench_snapshot.py [--ranks 8,32] [--repeat 5] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from real_jobs import PlantedJob, wait_quiet  # noqa: E402

from trainwatch.probes.read.stacks.pyspy import find_pyspy  # noqa: E402


def baseline_env(checkout: Path, shim: Path) -> dict[str, str]:
    """An environment whose ``trainwatch`` package is ``checkout``'s probes/ and tui/ (found before
    the installed one: the editable install's finder comes after PYTHONPATH)."""
    package = shim / "trainwatch"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    for part in ("probes", "tui"):
        link = package / part
        if not link.exists():
            link.symlink_to(checkout.resolve() / part)
    return {**os.environ, "PYTHONPATH": str(shim)}


def whole_command(job_pid: int, ranks: int, env: dict[str, str] | None = None) -> float:
    # as users run it: with compiled modules cached (a shell with PYTHONDONTWRITEBYTECODE=1 would
    # compile every module edited since its last cached copy, on every run)
    env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(job_pid), "--window", "0",
                           "--json"], capture_output=True, timeout=120, check=True, env=env)
    took = time.perf_counter() - start
    assert len(json.loads(done.stdout)["ranks"]) == ranks
    return took


def one_size(ranks: int, repeat: int, baseline: dict[str, str] | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, PlantedJob(Path(tmp), "mismatch", nproc=ranks, deadline=600) as job:
        pids = job.wait_for_ranks(timeout=600)
        wait_quiet(pids, timeout=120, quiet_s=1.0)  # ranks still starting would take the cores from the first rounds
        return side_by_side(job.pid, pids, repeat, baseline=baseline)


def side_by_side(job_pid: int, pids: list[int], repeat: int, baseline: dict[str, str] | None = None,
                 gpu: bool = False) -> dict[str, float]:
    """``repeat`` rounds of the loop, the pass and the command back to back on a running job: the
    medians, and each one's median ratio to the loop. ``gpu``: the pass reads the GPUs too."""
    from trainwatch.probes.live import LocalSource
    pyspy = find_pyspy()
    times: dict[str, list[float]] = {"loop": [], "pass": [], "cli": [], "baseline": []}
    whole_command(job_pid, len(pids))  # once unmeasured: compiled modules cached, files in the page cache
    LocalSource(job_pid, window=0, gpu=gpu).poll()  # and the pass: this process's first-use costs
    if baseline is not None:
        whole_command(job_pid, len(pids), baseline)
    for _ in range(repeat):
        start = time.perf_counter()
        for pid in pids:
            subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, timeout=30)
        times["loop"].append(time.perf_counter() - start)
        start = time.perf_counter()
        snap = LocalSource(job_pid, window=0, gpu=gpu).poll()
        times["pass"].append(time.perf_counter() - start)
        assert len(snap.ranks) == len(pids), snap.ranks
        times["cli"].append(whole_command(job_pid, len(pids)))
        if baseline is not None:
            times["baseline"].append(whole_command(job_pid, len(pids), baseline))
    medians = {name: statistics.median(values) for name, values in times.items() if values}
    # Each round measures the loop and trainwatch back to back: their ratio in a round cancels the
    # machine's drift between rounds (a shared VM's speed moves by 20% over seconds).
    ratios = {f"{name}/loop": statistics.median(v / loop for v, loop in zip(values, times["loop"]))
              for name, values in times.items() if values and name != "loop"}
    print("  rounds (ms):", {name: [round(v * 1000) for v in values] for name, values in times.items() if values})
    return {**medians, **ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="8", help="comma list of job sizes (default: 8)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout whose `snapshot` is timed beside this one")
    args = parser.parse_args(argv)
    # Each run times its own dumps: one must not take another's (read/stacks/shared_dumps.py). Set for
    # the commands it starts and this process's own pass, and put back (the suite runs it in-process).
    before = os.environ.get("TRAINWATCH_SHARED_DUMPS")
    os.environ["TRAINWATCH_SHARED_DUMPS"] = "0"
    try:
        return _measure(args)
    finally:
        if before is None:
            os.environ.pop("TRAINWATCH_SHARED_DUMPS", None)
        else:
            os.environ["TRAINWATCH_SHARED_DUMPS"] = before


def _measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as shim:
        env = baseline_env(args.baseline, Path(shim)) if args.baseline else None
        for ranks in (int(n) for n in args.ranks.split(",")):
            m = one_size(ranks, args.repeat, env)
            print(f"{ranks} ranks, median of {args.repeat} (ratios: the median of each round's own ratio):")
            print(f"  sequential py-spy dump loop        {m['loop'] * 1000:7.0f} ms")
            print(f"  trainwatch sampling pass           {m['pass'] * 1000:7.0f} ms  "
                  f"(discovery + parallel py-spy + analysis, in process)  {m['pass/loop']:.2f}x the loop")
            print(f"  trainwatch snapshot --window 0     {m['cli'] * 1000:7.0f} ms  "
                  f"(whole command: start-up, discovery, sampling, analysis)  {m['cli/loop']:.2f}x the loop")
            if "baseline" in m:
                print(f"  the same from {args.baseline}  {m['baseline'] * 1000:7.0f} ms  "
                      f"{m['baseline/loop']:.2f}x the loop; this checkout's is {m['cli'] / m['baseline']:.2f}x it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stress: nobody else looking at a job changes its verdict (issue 40). Not in CI; prints counts.

Each run: a real 3-rank gloo job, either hung (rank 2 stops; ranks 0-1 wait in all_reduce) or
healthy, watched for ``--minutes`` by everything a team points at a job at once:

* ``trainwatch watch --json --hang-after 20`` guarding it,
* ``trainwatch attach`` open in a real tmux terminal (its screen read every 2 s),
* ``py-spy dump`` of every rank every 2 s,
* ``trainwatch snapshot --json`` every 5 s.

Counted: every verdict any of them showed. A hung job must never read healthy and `watch` must
write its bundle; a healthy job must never read as a problem.

    python tests/bench/stress_observers.py [--runs 10] [--minutes 5] [--only healthy] [--record DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_jobs import PlantedJob, rank_stuck_at, wait_quiet, wait_until  # noqa: E402
from watching import TRAINWATCH, Watch  # noqa: E402

PY_SPY = str(Path(sys.executable).with_name("py-spy"))
BANNERS = ("HEALTHY", "STRAGGLER", "MISMATCH", "HANG", "RENDEZVOUS", "CRASHED", "UNKNOWN")


class Onlookers:
    """The py-spy loop, the snapshot loop and the attach screen, each in a thread, counting verdicts."""

    def __init__(self, job: PlantedJob, tmux: list[str], wrong: str) -> None:
        self.job, self.tmux, self.wrong = job, tmux, wrong
        self.kept: list[Path] = []  # what a snapshot said when it was wrong, for the record
        self.seen: dict[str, Counter] = {"snapshot": Counter(), "attach": Counter()}
        self.dumps = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._py_spy, self._snapshots, self._screen)]

    def __enter__(self) -> "Onlookers":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _py_spy(self) -> None:
        while not self._stop.wait(2.0):
            for pid in self.job.rank_pids():
                subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True, timeout=30)
                self.dumps += 1

    def _snapshots(self) -> None:
        while not self._stop.wait(5.0):
            proc = subprocess.run([*TRAINWATCH, "snapshot", str(self.job.pid), "--json"], capture_output=True,
                                  text=True, timeout=120)
            if proc.returncode == 0:
                kind = json.loads(proc.stdout)["verdict"]["kind"]
                self.seen["snapshot"][kind] += 1
                if kind == self.wrong or (self.wrong == "problem" and kind not in ("healthy", "unknown")):
                    self.kept.append(self.job.workdir / f"wrong-snapshot-{len(self.kept)}.json")
                    self.kept[-1].write_text(proc.stdout)

    def _screen(self) -> None:
        while not self._stop.wait(2.0):
            screen = subprocess.run([*self.tmux, "capture-pane", "-p", "-t", "tw"], capture_output=True, text=True,
                                    timeout=30).stdout
            banner = next((b for b in BANNERS if f" {b} " in screen), None)
            if banner:
                self.seen["attach"][banner.lower()] += 1


def one_run(root: Path, scenario: str, minutes: float, n: int) -> tuple[dict[str, Counter], bool]:
    tmux = ["tmux", "-L", f"tw-stress-{os.getpid()}-{n}", "-f", "/dev/null"]
    with PlantedJob(root / f"{scenario}{n}", scenario, nproc=3, deadline=minutes * 60 + 120, step_s=0.05) as job:
        pids = job.wait_for_ranks()
        if scenario == "straggler":
            wait_until(lambda: rank_stuck_at(job.script, "# stuck in its own work"), 60, "the straggler's sleep")
            wait_quiet(pids)
        attach = " ".join(shlex.quote(p) for p in [*TRAINWATCH, "attach", str(job.pid)])
        subprocess.run([*tmux, "new-session", "-d", "-s", "tw", "-x", "120", "-y", "40",
                        f"env TERM=xterm-256color {attach}"], check=True, timeout=30)
        watch = Watch(job.pid, job.workdir, extra_args=("--interval", "5", "--hang-after", "20"))
        try:
            with Onlookers(job, tmux, "healthy" if scenario == "straggler" else "problem") as others:
                time.sleep(minutes * 60)
        finally:
            watch.stop()
            time.sleep(0.5)  # its last lines reach the reader thread
            watch.finish(timeout=10)  # the events it printed, drained
            subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    seen = dict(others.seen)
    seen["watch"] = Counter(e["verdict"] for e in watch.events if e["event"] == "verdict")
    bundled = any(e["event"] == "bundle" for e in watch.events)
    if others.kept or (scenario == "healthy" and set(seen["watch"]) - {"healthy", "unknown"}):
        (job.workdir / "watch-events.json").write_text(json.dumps(watch.events, indent=1))
        print(f"  kept: {job.workdir} ({len(others.kept)} wrong snapshots, the watch's events)")
    print(f"  {scenario} #{n + 1}: {others.dumps} py-spy dumps; "
          + "; ".join(f"{who} {dict(c)}" for who, c in seen.items()) + f"; watch bundled: {bundled}")
    return seen, bundled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--only", choices=("straggler", "healthy"), help="run only this kind of job")
    parser.add_argument("--record", type=Path, metavar="DIR",
                        help="every trainwatch process writes each problem poll's evidence here (recorder/)")
    args = parser.parse_args(argv)
    if args.record:  # the trainwatch processes started from here on (tmux's too) inherit these
        args.record.mkdir(parents=True, exist_ok=True)
        os.environ["TW_RECORD"] = str(args.record.resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent / "recorder"),
                                                                 os.environ.get("PYTHONPATH")]))
    if shutil.which("tmux") is None:
        print("needs tmux")
        return 2
    root = Path(tempfile.mkdtemp(prefix="tw-stress-observers-"))
    failures = 0
    for scenario, wrong in (("straggler", "healthy"), ("healthy", "problem")):
        if args.only not in (None, scenario):
            continue
        bad_runs, unbundled = 0, 0
        for n in range(args.runs):
            seen, bundled = one_run(root, scenario, args.minutes, n)
            kinds = Counter()
            for counts in seen.values():
                kinds.update(counts)
            bad = kinds["healthy"] if wrong == "healthy" else sum(
                v for k, v in kinds.items() if k not in ("healthy", "unknown"))
            bad_runs += bool(bad)
            unbundled += scenario == "straggler" and not bundled
        print(f"{scenario}: {args.runs - bad_runs} of {args.runs} runs never read {wrong}"
              + (f"; watch bundled in {args.runs - unbundled} of {args.runs}" if scenario == "straggler" else ""))
        failures += bad_runs + unbundled
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

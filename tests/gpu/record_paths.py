"""Recorder (not a test, and not run by the suite: it needs one NVIDIA GPU): the two code-path
failures of ``tests/gpu/nccl_paths.py`` (``mismatch``, ``uneven``), 4 NCCL ranks on one GPU each,
side by side, each under ``trainwatch run`` with ``trainwatch watch --json`` beside it, a default
``snapshot --json`` 8 s into the hang, and ``trainwatch open --json`` of the run directory once the
watchdogs have ended the job. Leaves ``<scenario>.tar.gz`` of all that under ``$OUT`` (default /tmp).

    python tests/gpu/record_paths.py   (from the repository root)
"""
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import psutil

OUT = Path(os.environ.get("OUT", "/tmp"))
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1",
       "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
TW = [sys.executable, "-m", "trainwatch.tui.cli"]


def say(scenario: str, text: str) -> None:
    print(f"[{scenario} {time.strftime('%H:%M:%S')}] {text}", flush=True)


def launcher(port: int, timeout: float = 60.0) -> psutil.Process:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "torch.distributed.run" in cmd and f"--master-port {port}" in cmd:
                return proc
        time.sleep(0.2)
    raise RuntimeError(f"no torchrun on port {port}")


def text_in(folder: Path, needle: str) -> bool:
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_size < 50 << 20:
            if needle in path.read_text(errors="replace"):
                return True
    return False


def record(scenario: str, port: int) -> None:
    work = OUT / "work" / scenario
    work.mkdir(parents=True)
    run_dir = work / "run"
    with open(work / "run-stdout.log", "w") as log:
        job = subprocess.Popen(TW + ["run", "--out", str(run_dir), "--", sys.executable, "-m", "torch.distributed.run",
                                     "--nproc-per-node", "4", "--master-port", str(port),
                                     "tests/gpu/nccl_paths.py", scenario, "150"],
                               stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    watch = None
    try:
        torchrun = launcher(port)
        say(scenario, f"torchrun {torchrun.pid}")
        with open(work / "watch.jsonl", "w") as out, open(work / "watch-stderr.txt", "w") as err:
            watch = subprocess.Popen(TW + ["watch", str(torchrun.pid), "--json", "--interval", "2", "--hang-after", "20",
                                           "--out", str(work / "watch")], stdout=out, stderr=err, env=ENV)
        end = time.monotonic() + 90
        while time.monotonic() < end and not text_in(work, "step 40 "):
            if job.poll() is not None:
                raise RuntimeError(f"the job ended early: {job.returncode}")
            time.sleep(0.5)
        say(scenario, "step 40 seen")
        time.sleep(8)
        for name, extra in (("snapshot-during.json", ["--json"]), ("snapshot-during.txt", [])):
            t = time.monotonic()
            done = subprocess.run(TW + ["snapshot", str(torchrun.pid)] + extra, capture_output=True, text=True,
                                  timeout=90, env=ENV)
            (work / name).write_text(done.stdout + ("\n--- stderr ---\n" + done.stderr if done.stderr else ""))
            say(scenario, f"{name}: exit {done.returncode} in {time.monotonic() - t:.1f} s")
        job.wait(timeout=120)
        say(scenario, f"job ended: {job.returncode}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if watch is not None:
            if watch.poll() is None:
                time.sleep(6)  # its last polls: the deaths
                watch.send_signal(signal.SIGINT)
            try:
                watch.wait(timeout=30)
            except subprocess.TimeoutExpired:
                watch.kill()
            say(scenario, f"watch exit {watch.returncode}")
    done = subprocess.run(TW + ["open", str(run_dir), "--json"], capture_output=True, text=True, timeout=120, env=ENV)
    (work / "open.json").write_text(done.stdout + ("\n--- stderr ---\n" + done.stderr if done.stderr else ""))
    say(scenario, f"open: exit {done.returncode}")


def main() -> int:
    threads = [threading.Thread(target=record, args=(scenario, port), name=scenario)
               for scenario, port in (("mismatch", 29561), ("uneven", 29562))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for scenario in ("mismatch", "uneven"):
        with tarfile.open(OUT / f"{scenario}.tar.gz", "w:gz") as tar:
            tar.add(OUT / "work" / scenario, arcname=scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())

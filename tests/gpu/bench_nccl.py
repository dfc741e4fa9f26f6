"""Benchmark (not a test, and not run by the suite: it needs one NVIDIA GPU): the real NCCL hang of tests/gpu/nccl_hang.py.

Eight NCCL ranks share the one GPU (each its own NCCL_HOSTID; sockets over loopback); the last rank
sleeps in Python and never joins the next all_reduce, the others block behind it at ``.item()``,
spinning in ``cuStreamSynchronize`` as hung NCCL ranks do. Times, median of 5 rounds side by side:
the sequential ``py-spy dump`` loop, trainwatch's pass in process (with the GPU probe), and
``trainwatch snapshot --window 0 --json``; then prints the verdict of a default ``snapshot``. Writes
the job's log and both snapshots under ``$OUT`` (default /tmp).

    python tests/gpu/bench_nccl.py   (from the repository root)
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_snapshot import side_by_side  # noqa: E402

from trainwatch.probes.live import LocalSource  # noqa: E402
out = Path(os.environ.get("OUT", "/tmp"))
env = {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
log = open(out / "nccl_job.log", "w")
job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "8", "--master-port", "29555",
                        "tests/gpu/nccl_hang.py", "170"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (out / "nccl_job.log").read_text(errors="replace").count(" warm") < 8:
        if job.poll() is not None:
            raise SystemExit(f"job exited {job.returncode}")
        time.sleep(0.5)
    print("warm after", round(120 - (deadline - time.monotonic()), 1), "s", flush=True)
    time.sleep(3)
    source = LocalSource(job.pid, window=0, gpu=True)
    try:
        pids = [r.pid for r in source.job.ranks]
        first = source.poll()
    finally:
        source.close()
    print("ranks", len(pids), flush=True)
    (out / "nccl_snapshot_window0.json").write_text(first.to_json())
    print("window 0 verdict:", first.verdict.kind, first.verdict.culprits, first.verdict.summary, flush=True)
    m = side_by_side(job.pid, pids, 5, gpu=True)
    for k in ("pass", "cli"):
        print(f"{k}: median {m[k] * 1000:.0f} ms, {m[k + '/loop']:.2f}x the loop ({m['loop'] * 1000:.0f} ms)", flush=True)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(job.pid), "--json"],
                          capture_output=True, timeout=90, text=True)
    (out / "nccl_snapshot_default.json").write_text(done.stdout)
    verdict = json.loads(done.stdout)["verdict"] if done.stdout else done.stderr[-500:]
    print(f"snapshot (default window) in {time.perf_counter() - t:.1f}s: {verdict}", flush=True)
finally:
    os.killpg(job.pid, 9)
    job.wait()

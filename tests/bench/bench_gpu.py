"""Cost of one GPU probe tick, per device.

    python tests/bench/bench_gpu.py [--ticks 200]

Uses the pynvml fake with 1, 8 and 64 devices (the probe's own overhead: mapping, warnings,
struct handling), then the real NVML when a driver is present (the driver's cost dominates).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fake_nvml import FakeGpu, FakeNvml  # noqa: E402
from trainwatch.probes.read.gpus.gpu import GpuProbe  # noqa: E402
from trainwatch.probes.read.processes.process import RankProcess  # noqa: E402


def fake_job(n: int, gpm: bool = False) -> tuple[FakeNvml, list[RankProcess]]:
    gpus, ranks = [], []
    for i in range(n):
        pid = 10_000 + i
        gpus.append(FakeGpu(
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", bus_id=f"00000000:{i:02X}:00.0",
            util_gpu=100, processes=[(pid, 20 << 30), (pid + 5000, 300 << 20)],
            samples=[(pid, t, 99) for t in range(1, 6)],
            gpm={2: 90.0, 5: 60.0, 10: 40.0} if gpm else None,  # Hopper: GPM samples and metrics each tick
        ))
        ranks.append(RankProcess(pid=pid, rank=i, local_rank=i % 8, children=(pid + 5000,),
                                 env={"RANK": str(i), "LOCAL_RANK": str(i % 8)}))
    return FakeNvml(gpus), ranks


def measure(probe: GpuProbe, ranks: list[RankProcess], ticks: int) -> float:
    probe.read(ranks, "torchrun")  # first tick: init, handles, static facts
    start = time.perf_counter()
    for _ in range(ticks):
        probe.read(ranks, "torchrun")
    return (time.perf_counter() - start) / ticks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=200)
    ticks = parser.parse_args(argv).ticks
    print(f"{'source':<12}{'GPUs':>6}{'ms/tick':>10}{'ms/GPU':>9}")
    for gpm in (False, True):
        for n in (1, 8, 64):
            fake, ranks = fake_job(n, gpm)
            probe = GpuProbe(fake, kmsg_path="/dev/null", in_initial_pid_ns=True)
            per_tick = measure(probe, ranks, ticks)
            mapped = probe.read(ranks, "torchrun").per_pid
            assert sorted(mapped) == [r.pid for r in ranks], f"{n} fake GPUs: ranks mapped {sorted(mapped)}"
            probe.close()
            name = "fake+GPM" if gpm else "fake"
            print(f"{name:<12}{n:>6}{per_tick * 1e3:>10.3f}{per_tick * 1e3 / n:>9.3f}")
    probe = GpuProbe(kmsg_path="/dev/null")
    first = probe.read([], "torchrun")
    if first.notes and first.notes[0].startswith("NVML unavailable"):
        print(f"real NVML: skipped ({first.notes[0]})")
    else:
        n = len(first.host.gpus)
        per_tick = measure(probe, [], max(10, ticks // 10))
        print(f"{'real NVML':<12}{n:>6}{per_tick * 1e3:>10.3f}{per_tick * 1e3 / max(n, 1):>9.3f}")
    probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay NVML readings recorded on real GPUs (tests/fixtures/nvml/*.json) through the probe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_nvml import FakeNvml
from trainwatch.probes.read.gpus.gpu import GpuProbe
from trainwatch.probes.read.processes.process import RankProcess

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "nvml").glob("*.json"))
STABLE = ("index", "name", "uuid", "bus_id", "compute_capability", "mem_total_bytes",
          "ecc_errors", "lost")


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_replay(path):
    data = json.loads(path.read_text())
    reading = GpuProbe(FakeNvml.from_json(path), kmsg_path="/dev/null",
                       in_initial_pid_ns=True).read([], "torchrun")
    assert not any(n.startswith("NVML unavailable") for n in reading.notes)
    assert len(reading.host.gpus) == len(data["devices"])
    recorded = data.get("probe")
    if recorded:  # a real recording: replay must agree with what the real probe saw
        host = recorded["host"]
        for key in ("driver_version", "cuda_driver_version", "nvml_version"):
            assert getattr(reading.host, key) == host[key]
        for got, want in zip(reading.host.gpus, host["gpus"]):
            for key in STABLE:
                assert getattr(got, key) == want[key], key
            # Per-process GPU memory: the real probe's figures matched nvidia-smi on the recording machine.
            assert sorted((p.pid, p.mem_used_bytes) for p in got.processes) == \
                sorted((p["pid"], p["mem_used_bytes"]) for p in want["processes"])


def test_real_h100_recording_reads_as_recorded():
    path = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100-80gb-driver580.json"
    reading = GpuProbe(FakeNvml.from_json(path), kmsg_path="/dev/null", in_initial_pid_ns=True).read([], "torchrun")
    (gpu,) = reading.host.gpus
    assert (gpu.name, gpu.compute_capability, gpu.mem_total_bytes) == ("NVIDIA H100 80GB HBM3", "9.0", 85520809984)
    assert gpu.util_pct == 100.0 and gpu.sm_clock_mhz == 1980 and not gpu.lost
    assert len(gpu.processes) == 7 and all(p.rank is None for p in gpu.processes)  # none of them is our job


def test_synthetic_example_replays_unsupported_fields():
    path = Path(__file__).parents[1] / "fixtures" / "nvml" / "example-synthetic.json"
    ranks = [RankProcess(pid=4101, rank=0, local_rank=0, env={"RANK": "0"}),
             RankProcess(pid=4102, rank=1, local_rank=1, env={"RANK": "1"})]
    reading = GpuProbe(FakeNvml.from_json(path), kmsg_path="/dev/null",
                       in_initial_pid_ns=True).read(ranks, "torchrun")
    a100, rtx = reading.host.gpus
    assert a100.throttle == ("power-cap",) and a100.power_w == 312.0
    assert rtx.power_w is None and rtx.ecc_errors is None and rtx.throttle == ("idle",)
    assert reading.per_pid[4101].proc_util_pct == 99.0
    assert reading.per_pid[4102].mem_used_bytes == 500000000  # through the v2 fallback
    assert any(w.startswith("mixed GPU models") for w in reading.warnings)

"""GpuProbe against the pynvml fake: devices, processes -> ranks, failures, fallbacks."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from fake_nvml import FakeGpu, FakeNvml
from trainwatch.probes.read.gpus.gpu import GpuProbe
from trainwatch.probes.read.processes.process import RankProcess

GiB = 2**30


def rank(pid, r, local=None, cvd=None, children=(), env=None, create_time=0.0):
    e = {"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r if local is None else local)}
    if cvd is not None:
        e["CUDA_VISIBLE_DEVICES"] = cvd
    if env is not None:
        e = env
    return RankProcess(pid=pid, rank=r, local_rank=r if local is None else local, env=e,
                       children=tuple(children), create_time=create_time)


def gpus(n, **kw):
    return [FakeGpu(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
                    bus_id=f"00000000:{0x10 + i:02X}:00.0", **kw) for i in range(n)]


def probe(fake, exact=True):
    return GpuProbe(fake, kmsg_path="/dev/null", in_initial_pid_ns=exact)


def test_four_ranks_four_gpus():
    devs = gpus(4)
    for i, d in enumerate(devs):
        d.util_gpu = 100 if i < 3 else 0
        d.processes = [(1000 + i, (10 + i) * GiB)]
        d.samples = [(1000 + i, 5_000_000, 97 if i < 3 else 0)]
    reading = probe(FakeNvml(devs)).read([rank(1000 + i, i) for i in range(4)], "torchrun")
    assert reading.notes == ()
    assert reading.warnings == ()
    g = reading.per_pid[1002]
    assert (g.index, g.visible, g.util_pct, g.proc_util_pct) == (2, (0, 1, 2, 3), 100.0, 97.0)
    assert g.mem_used_bytes == 12 * GiB and g.mem_total_bytes == 80 * GiB
    assert g.shared_with == ()
    host = reading.host
    assert host.driver_version == "550.54.15" and host.cuda_driver_version == "12.4"
    assert host.gpus[1].processes[0].rank == 1 and host.gpus[1].processes[0].local_pid == 1001
    assert host.gpus[0].bus_id == "00000000:10:00.0" and host.gpus[0].compute_capability == "8.0"


def test_cuda_visible_devices_per_rank_and_sharing():
    devs = gpus(2)
    devs[1].processes = [(10, GiB), (11, GiB)]
    ranks = [rank(10, 0, cvd="1"), rank(11, 1, cvd="GPU-00000001")]
    reading = probe(FakeNvml(devs)).read(ranks, "torchrun")
    assert reading.per_pid[10].index == 1 and reading.per_pid[11].index == 1
    assert reading.per_pid[10].shared_with == (1,)
    assert reading.per_pid[11].shared_with == (0,)


def test_rank_without_context_yet_reads_zero_memory():
    reading = probe(FakeNvml(gpus(2))).read([rank(10, 0), rank(11, 1)], "torchrun")
    assert reading.per_pid[11].index == 1
    assert reading.per_pid[11].mem_used_bytes == 0 and reading.per_pid[11].proc_util_pct == 0.0


def test_unmapped_process_is_never_given_a_rank():
    devs = gpus(1)
    devs[0].processes = [(10, GiB), (4242, 3 * GiB)]
    reading = probe(FakeNvml(devs)).read([rank(10, 0)], "torchrun")
    procs = {p.pid: p for p in reading.host.gpus[0].processes}
    assert procs[4242].rank is None and procs[4242].local_pid is None
    assert any("pid 4242, which is not part of this job (3.0 GiB)" in w for w in reading.warnings)


def test_inside_container_pid_must_agree_with_device():
    devs = gpus(2)
    # NVML host PIDs; 11 happens to equal a local rank pid but sits on GPU 0, not rank 1's GPU
    devs[0].processes = [(11, GiB), (987654, GiB)]
    ranks = [rank(10, 0, cvd="0"), rank(11, 1, cvd="1")]
    reading = probe(FakeNvml(devs), exact=False).read(ranks, "torchrun")
    assert all(p.rank is None for p in reading.host.gpus[0].processes)
    assert reading.per_pid[11].mem_used_bytes is None  # unknown, not zero
    assert any("PID namespace" in n for n in reading.notes)
    assert not any("not part of this job" in w for w in reading.warnings)


def test_child_process_memory_is_attributed_and_marked():
    devs = gpus(1)
    devs[0].processes = [(10, 20 * GiB), (55, 500 * 2**20)]
    reading = probe(FakeNvml(devs)).read([rank(10, 0, children=(55,))], "torchrun")
    child = next(p for p in reading.host.gpus[0].processes if p.pid == 55)
    assert child.rank == 0 and child.local_pid == 55
    assert reading.per_pid[10].mem_used_bytes == 20 * GiB  # the rank's own process only
    assert any("child process 55 holds 500 MiB on GPU 0" in w for w in reading.warnings)


def test_stray_context_on_gpu0():
    devs = gpus(2)
    devs[0].processes = [(10, 20 * GiB), (11, 400 * 2**20)]
    devs[1].processes = [(11, 20 * GiB)]
    reading = probe(FakeNvml(devs)).read([rank(10, 0), rank(11, 1)], "torchrun")
    assert reading.per_pid[11].index == 1
    assert any("rank 1 also hold memory on GPU 0" in w for w in reading.warnings)


def test_not_supported_fields_are_none_and_asked_once():
    devs = gpus(1, errors={
        "nvmlDeviceGetPowerUsage": "NVMLError_NotSupported",
        "nvmlDeviceGetTotalEccErrors": "NVMLError_NotSupported",
        "nvmlDeviceGetProcessUtilization": "NVMLError_NotSupported",
        "nvmlDeviceGetTemperature": "NVMLError_NoPermission",
    })
    devs[0].processes = [(10, GiB)]
    fake = FakeNvml(devs)
    p = probe(fake)
    for _ in range(3):
        reading = p.read([rank(10, 0)], "torchrun")
    d = reading.host.gpus[0]
    assert d.power_w is None and d.ecc_errors is None and d.temperature_c is None
    assert d.util_pct == 0.0
    assert reading.per_pid[10].proc_util_pct is None
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 3
    assert fake.calls["nvmlDeviceGetName"] == 1  # static facts cached


def test_lost_gpu_is_marked_and_not_called_again():
    devs = gpus(2)
    devs[1].processes = [(11, GiB)]
    fake = FakeNvml(devs)
    p = probe(fake)
    p.read([rank(10, 0), rank(11, 1)], "torchrun")
    fake.lose(1)
    reading = p.read([rank(10, 0), rank(11, 1)], "torchrun")
    before = dict(fake.calls)
    reading = p.read([rank(10, 0), rank(11, 1)], "torchrun")
    lost = reading.host.gpus[1]
    assert lost.lost and lost.name == "NVIDIA A100-SXM4-80GB" and lost.util_pct is None
    assert any("GPU 1 (00000000:11:00.0) is lost" in w and "rank 1 on it" in w
               for w in reading.warnings)
    # the healthy GPU is still read; the lost one costs no call at all
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == before["nvmlDeviceGetUtilizationRates"] + 1


def test_gpu_lost_before_handle():
    devs = gpus(2)
    devs[0].lost_at_handle = True
    reading = probe(FakeNvml(devs)).read([rank(10, 0)], "torchrun")
    assert reading.host.gpus[0].lost and not reading.host.gpus[1].lost


@pytest.mark.parametrize("kwargs, text", [
    ({"library_missing": True},
     "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"),
    ({"init_error": "NVMLError_LibRmVersionMismatch"}, "NVIDIA driver/library version mismatch"),
    ({"init_error": "NVMLError_DriverNotLoaded"}, "kernel driver is not loaded"),
])
def test_nvml_unavailable_gives_one_note(kwargs, text):
    p = probe(FakeNvml(gpus(2), **kwargs))
    for _ in range(2):
        reading = p.read([rank(10, 0)], "torchrun")
    assert len(reading.notes) == 1 and text in reading.notes[0]
    assert reading.host.gpus == () and reading.per_pid == {} and reading.warnings == ()


def test_real_pynvml_without_driver_gives_one_note():
    p = GpuProbe(kmsg_path="/dev/null")
    reading = p.read([rank(10, 0)], "torchrun")
    p.close()
    assert reading.notes == (
        "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)",
    )


def test_missing_v3_falls_back_to_v2():
    devs = gpus(1)
    devs[0].processes = [(10, 3 * GiB)]
    fake = FakeNvml(devs, missing_functions=("nvmlDeviceGetComputeRunningProcesses_v3",
                                             "nvmlDeviceGetCurrentClocksEventReasons"))
    devs[0].clock_event_reasons = 0x40 | 0x4
    p = probe(fake)
    p.read([rank(10, 0)], "torchrun")
    reading = p.read([rank(10, 0)], "torchrun")
    assert reading.per_pid[10].mem_used_bytes == 3 * GiB
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1  # tried once, remembered
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2
    assert reading.host.gpus[0].throttle == ("power-cap", "hw-thermal")


def test_old_pynvml_module_without_attributes():
    devs = gpus(1)
    devs[0].processes = [(10, GiB)]
    fake = FakeNvml(devs, absent_functions=("nvmlDeviceGetComputeRunningProcesses_v3",
                                            "nvmlDeviceGetComputeRunningProcesses_v2",
                                            "nvmlDeviceGetCurrentClocksEventReasons"))
    reading = probe(fake).read([rank(10, 0)], "torchrun")
    assert reading.per_pid[10].mem_used_bytes == GiB


def test_process_utilization_keeps_last_seen_timestamp():
    devs = gpus(1)
    devs[0].processes = [(10, GiB)]
    devs[0].samples = [(10, 1_000, 40), (10, 2_000, 90)]
    fake = FakeNvml(devs)
    p = probe(fake)
    assert p.read([rank(10, 0)], "torchrun").per_pid[10].proc_util_pct == 90.0  # newest sample
    # no new sample (NVML answers NotFound): the recent value is kept, not emptied
    assert p.read([rank(10, 0)], "torchrun").per_pid[10].proc_util_pct == 90.0
    devs[0].samples.append((10, 3_000, 55))
    assert p.read([rank(10, 0)], "torchrun").per_pid[10].proc_util_pct == 55.0
    assert p._session.devices[0].last_seen_us == 3_000


def test_process_utilization_goes_to_zero_when_stale():
    devs = gpus(1)
    devs[0].processes = [(10, GiB)]
    devs[0].samples = [(10, 1_000, 80)]
    p = probe(FakeNvml(devs))
    now = [100.0]
    p._session.clock = lambda: now[0]
    assert p.read([rank(10, 0)], "torchrun").per_pid[10].proc_util_pct == 80.0
    now[0] += 10
    assert p.read([rank(10, 0)], "torchrun").per_pid[10].proc_util_pct == 0.0


def test_mixed_gpus_listed_side_by_side():
    devs = gpus(2)
    devs[1].name, devs[1].cc, devs[1].mem_total = "NVIDIA GeForce RTX 3090", (8, 6), 24 * GiB
    reading = probe(FakeNvml(devs)).read([rank(10, 0), rank(11, 1)], "torchrun")
    w = next(w for w in reading.warnings if w.startswith("mixed GPU"))
    assert "GPU 0 NVIDIA A100-SXM4-80GB cc 8.0 80 GiB (rank 0)" in w
    assert "GPU 1 NVIDIA GeForce RTX 3090 cc 8.6 24 GiB (rank 1)" in w


def test_same_gpus_not_mixed_and_unused_gpu_ignored():
    devs = gpus(3)
    devs[2].name = "NVIDIA T4"
    reading = probe(FakeNvml(devs)).read([rank(10, 0, cvd="0,1"), rank(11, 1, cvd="0,1")],
                                         "torchrun")
    assert not any(w.startswith("mixed GPU") for w in reading.warnings)


def test_plain_python_on_several_gpus():
    devs = gpus(2)
    devs[0].processes = [(10, GiB)]
    devs[1].processes = [(10, GiB)]
    single = RankProcess(pid=10, rank=None, env={})
    reading = probe(FakeNvml(devs)).read([single], "python")
    assert any("not started by a distributed launcher: started with plain python where "
               "torchrun/accelerate launch was needed" in w for w in reading.warnings)
    ok = probe(FakeNvml(gpus(2))).read([rank(10, 0)], "torchrun")
    assert not any("distributed launcher" in w for w in ok.warnings)


def test_throttle_and_ecc_warnings():
    devs = gpus(1)
    devs[0].clock_event_reasons = 0x40 | 0x80
    devs[0].ecc_uncorrected = 3
    devs[0].temperature_c = 91
    reading = probe(FakeNvml(devs)).read([rank(10, 0)], "torchrun")
    assert reading.host.gpus[0].throttle == ("hw-thermal", "power-brake")
    assert any("throttled at 91°C: hardware thermal slowdown, power brake (rank 0" in w
               for w in reading.warnings)
    assert any("3 uncorrected ECC errors" in w for w in reading.warnings)


def test_real_process_pid_maps_to_its_rank():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        devs = gpus(1)
        devs[0].processes = [(child.pid, 2 * GiB)]
        reading = GpuProbe(FakeNvml(devs), kmsg_path="/dev/null").read(
            [rank(child.pid, 0)], "torchrun")
        gpu_proc = reading.host.gpus[0].processes[0]
        from trainwatch.probes.read.gpus.gpu_map import proc_in_initial_pid_ns
        if proc_in_initial_pid_ns():
            assert gpu_proc.rank == 0 and reading.per_pid[child.pid].mem_used_bytes == 2 * GiB
        else:  # in a container the pid still agrees with the rank's device
            assert gpu_proc.rank == 0
    finally:
        child.kill()
        child.wait()


def test_read_is_safe_from_threads():
    devs = gpus(4)
    for i, d in enumerate(devs):
        d.processes = [(1000 + i, GiB)]
    p = probe(FakeNvml(devs))
    ranks = [rank(1000 + i, i) for i in range(4)]
    errors = []

    def work():
        try:
            for _ in range(20):
                assert p.read(ranks, "torchrun").per_pid[1003].index == 3
        except Exception as exc:  # noqa: BLE001 - pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.close()
    assert errors == []


def test_snapshot_round_trip_of_host_info():
    from trainwatch.probes.snapshot import Job, Snapshot
    devs = gpus(1)
    devs[0].processes = [(10, GiB)]
    reading = probe(FakeNvml(devs)).read([rank(10, 0)], "torchrun")
    snap = Snapshot(job=Job(launcher="torchrun", pid=1, host="h"), hosts=(reading.host,))
    assert Snapshot.from_json(snap.to_json()).hosts[0] == reading.host


def test_plain_python_single_gpu_script_is_fine():
    devs = gpus(2)
    devs[0].processes = [(10, GiB)]
    reading = probe(FakeNvml(devs)).read([RankProcess(pid=10, rank=None, env={})], "python")
    assert not any("distributed launcher" in w for w in reading.warnings)
    assert reading.per_pid[10].index == 0 and reading.per_pid[10].visible == (0, 1)


def test_plain_python_with_several_listed_gpus_and_a_context():
    devs = gpus(2)
    devs[0].processes = [(10, GiB)]
    single = RankProcess(pid=10, rank=None, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    reading = probe(FakeNvml(devs)).read([single], "python")
    assert any("pid 10 uses GPUs 0,1 but was not started by a distributed launcher" in w
               for w in reading.warnings)

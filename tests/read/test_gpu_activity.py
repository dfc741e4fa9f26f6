"""Power draw, power limit and GPM activity (Hopper and newer) through GpuProbe, against the pynvml fake."""

from __future__ import annotations

from fake_nvml import FakeGpu, FakeNvml
from trainwatch.probes.read.gpus.gpu import GpuProbe
from trainwatch.probes.read.processes.process import RankProcess
from trainwatch.probes.snapshot import HostInfo, Snapshot, Job

H100_GPM = {2: 87.5, 5: 61.25, 10: 43.0}  # SM active, any tensor active, DRAM bandwidth (metric ids)


def probe(fake: FakeNvml) -> GpuProbe:
    return GpuProbe(fake, kmsg_path="/dev/null", in_initial_pid_ns=True)


def one_rank() -> list[RankProcess]:
    return [RankProcess(pid=10, rank=0, local_rank=0, env={"RANK": "0", "LOCAL_RANK": "0"})]


def hopper(**kw) -> FakeGpu:
    facts = dict(name="NVIDIA H100 80GB HBM3", cc=(9, 0), power_mw=595_329, power_limit_mw=700_000,
                 gpm=dict(H100_GPM), processes=[(10, 2**30)])
    return FakeGpu(**{**facts, **kw})


def test_first_reading_has_power_and_gpm_from_two_samples():
    fake = FakeNvml([hopper()])
    reading = probe(fake).read(one_rank(), "torchrun")
    (gpu,) = reading.host.gpus
    assert (gpu.power_w, gpu.power_limit_w) == (595.329, 700.0)
    assert (gpu.sm_active_pct, gpu.tensor_active_pct, gpu.dram_bw_pct) == (87.5, 61.2, 43.0)
    assert fake.calls["nvmlGpmSampleGet"] == 2  # primed, then compared
    mine = reading.per_pid[10]  # the rank's own view of its device, for the detail pane
    assert (mine.power_w, mine.power_limit_w, mine.sm_active_pct, mine.tensor_active_pct, mine.dram_bw_pct) == \
        (595.329, 700.0, 87.5, 61.2, 43.0)


def test_later_readings_compare_with_the_previous_sample_and_free_it():
    fake = FakeNvml([hopper()])
    p = probe(fake)
    for _ in range(4):
        reading = p.read(one_rank(), "torchrun")
    assert reading.host.gpus[0].sm_active_pct == 87.5
    assert fake.calls["nvmlGpmSampleGet"] == 5 and fake.calls["nvmlGpmMetricsGet"] == 4
    assert fake.gpm_live == 1  # only the last sample is kept
    p.close()
    assert fake.gpm_live == 0


def test_pre_hopper_has_no_gpm_and_is_asked_once():
    fake = FakeNvml([FakeGpu(processes=[(10, 2**30)])])  # an A100: no GPM
    p = probe(fake)
    for _ in range(3):
        reading = p.read(one_rank(), "torchrun")
    gpu = reading.host.gpus[0]
    assert (gpu.sm_active_pct, gpu.tensor_active_pct, gpu.dram_bw_pct) == (None, None, None)
    assert gpu.power_limit_w == 400.0
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1 and "nvmlGpmSampleAlloc" not in fake.calls


def test_a_metric_the_device_lacks_is_none_and_the_others_stay():
    fake = FakeNvml([hopper()])
    del fake.gpus[0].gpm[5]
    gpu = probe(fake).read(one_rank(), "torchrun").host.gpus[0]
    assert (gpu.sm_active_pct, gpu.tensor_active_pct, gpu.dram_bw_pct) == (87.5, None, 43.0)


def test_unsupported_power_limit_and_old_pynvml_without_gpm_are_none():
    fake = FakeNvml([hopper(power_limit_mw=None)],
                    absent_functions=("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc"))
    p = probe(fake)
    for _ in range(2):
        gpu = p.read(one_rank(), "torchrun").host.gpus[0]
    assert (gpu.power_w, gpu.power_limit_w, gpu.sm_active_pct) == (595.329, None, None)
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 1


def test_gpm_failing_mid_way_is_none_never_an_exception():
    fake = FakeNvml([hopper(errors={"nvmlGpmSampleGet": "NVMLError_Unknown"})])
    gpu = probe(fake).read(one_rank(), "torchrun").host.gpus[0]
    assert gpu.sm_active_pct is None and gpu.util_pct == 0.0 and not gpu.lost
    assert fake.gpm_live == 0  # the failed sample was freed


def test_gpu_lost_during_gpm_is_marked_lost():
    fake = FakeNvml([hopper(errors={"nvmlGpmSampleGet": "NVMLError_GpuIsLost"})])
    gpu = probe(fake).read(one_rank(), "torchrun").host.gpus[0]
    assert gpu.lost and gpu.sm_active_pct is None


def test_new_fields_survive_json_and_old_snapshots_still_read():
    fake = FakeNvml([hopper()])
    host = probe(fake).read(one_rank(), "torchrun").host
    snap = Snapshot(job=Job("torchrun", 1, "h"), hosts=(host,))
    back = Snapshot.from_json(snap.to_json())
    assert back.hosts[0].gpus[0].tensor_active_pct == 61.2
    old = snap.to_dict()
    for key in ("power_limit_w", "sm_active_pct", "tensor_active_pct", "dram_bw_pct"):
        del old["hosts"][0]["gpus"][0][key]
    assert Snapshot.from_dict(old).hosts[0].gpus[0].sm_active_pct is None
    assert isinstance(back.hosts[0], HostInfo)


def test_a_probe_primed_earlier_waits_only_what_is_left_of_the_gap():
    import time
    fake = FakeNvml([hopper()])
    p = probe(fake)
    p.prime()  # as the live source does while py-spy runs
    time.sleep(0.12)  # the ranks' sampling, longer than GPM's gap
    start = time.monotonic()
    reading = p.read(one_rank(), "torchrun")
    assert time.monotonic() - start < 0.05, "waited for a gap that had already passed"
    assert reading.host.gpus[0].sm_active_pct == 87.5  # still two samples compared
    assert fake.calls["nvmlGpmSampleGet"] == 2
    fresh = probe(FakeNvml([hopper()]))
    start = time.monotonic()
    fresh.read(one_rank(), "torchrun")
    assert time.monotonic() - start >= 0.09  # unprimed: the whole gap, as before

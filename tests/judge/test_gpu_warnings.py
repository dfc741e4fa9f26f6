"""GPU diagnoses that feed the verdict summary."""

from __future__ import annotations

from trainwatch.probes.judge.gpu_warnings import gpu_phase_warnings
from trainwatch.probes.read.gpus.gpu_health import mixed_gpus, no_launcher
from trainwatch.probes.snapshot import GpuDevice, Rank, RankGpu


def r(n, phase, util, shared=(), proc=None):
    return Rank(rank=n, pid=100 + n, phase=phase,
                gpu=RankGpu(index=n, util_pct=util, proc_util_pct=proc, shared_with=shared))


def test_spinning_collective_versus_idle_rank():
    ranks = [r(0, "collective", 100.0), r(1, "collective", 100.0), r(2, "collective", 100.0),
             r(3, "dataloader", 0.0)]
    assert gpu_phase_warnings(ranks) == (
        "GPUs of ranks 0-2 spin at 100% in the collective; rank 3's GPU is idle",
    )


def test_only_spinning():
    ranks = [r(0, "collective", 97.0), r(1, "collective", 100.0)]
    assert gpu_phase_warnings(ranks) == ("GPUs of ranks 0-1 spin at 97-100% in the collective",)


def test_nothing_to_say():
    assert gpu_phase_warnings([r(0, "compute", 100.0), r(1, "compute", 0.0)]) == ()
    assert gpu_phase_warnings([r(0, "collective", None)]) == ()
    assert gpu_phase_warnings([Rank(rank=0, phase="collective")]) == ()


def test_shared_gpu_uses_process_share():
    ranks = [r(0, "collective", 100.0, shared=(1,), proc=99.0),
             r(1, "compute", 100.0, shared=(0,), proc=1.0),
             r(2, "collective", 100.0)]
    assert gpu_phase_warnings(ranks) == (
        "GPUs of ranks 0,2 spin at 99-100% in the collective; rank 1's GPU is idle",
    )


def test_several_idle():
    ranks = [r(0, "collective", 100.0), r(1, "compute", 0.0), r(2, "init", 2.0)]
    assert gpu_phase_warnings(ranks)[0].endswith("the GPUs of ranks 1-2 are idle")


def test_mixed_gpus_ignores_lost_and_same_models():
    a = GpuDevice(index=0, name="A100", compute_capability="8.0")
    assert mixed_gpus([a, GpuDevice(index=1, name="A100", compute_capability="8.0")], {}) is None
    assert mixed_gpus([a, GpuDevice(index=1, lost=True)], {}) is None


def test_no_launcher_rules():
    assert no_launcher("python", 1, {}, [0, 1], [0, 1])
    assert no_launcher("python", 1, {}, [0], [0, 1])  # several visible and a GPU context
    assert no_launcher("python", 1, {}, [], [0, 1]) is None  # no context yet
    assert no_launcher("python", 1, {}, [0], [0]) is None
    assert no_launcher("python", 1, {"RANK": "0"}, [0, 1], [0, 1]) is None
    assert no_launcher("torchrun", 1, {}, [0, 1], [0, 1]) is None

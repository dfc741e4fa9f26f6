"""What is wrong with a host's GPUs as read (mixed models, health, stray contexts), as sentences a
person can act on. Pure functions over the readings of ``read/gpus/gpu.py``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...snapshot import GpuDevice, compact_ranks

SERIOUS_THROTTLE = {
    "hw-slowdown": "hardware slowdown",
    "hw-thermal": "hardware thermal slowdown",
    "sw-thermal": "thermal slowdown",
    "power-brake": "power brake",
}


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.0f} GiB"


def _who(ranks: Sequence[int]) -> str:
    if not ranks:
        return "no rank"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"


def mixed_gpus(devices: Sequence[GpuDevice], ranks_on: Mapping[int, Sequence[int]]) -> str | None:
    """GPUs of different models or compute capabilities in one job, listed side by side."""
    kinds = {(d.name, d.compute_capability) for d in devices if not d.lost}
    if len(kinds) < 2:
        return None
    listing = "; ".join(
        f"GPU {d.index} {d.name or 'n/a'} cc {d.compute_capability or 'n/a'} "
        f"{_gib(d.mem_total_bytes)} ({_who(ranks_on.get(d.index, ()))})"
        for d in devices if not d.lost
    )
    return (
        "mixed GPU models or compute capabilities in one job (a known cause of multi-GPU "
        f"crashes such as SIGSEGV in NCCL/peer-to-peer): {listing}; CUDA numbers mixed GPUs "
        "fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so cuda:N may not be GPU N"
    )


def no_launcher(
    launcher: str, pid: int, env: Mapping[str, str], devices_with_memory: Sequence[int],
    visible: Sequence[int],
) -> str | None:
    """A plain-python process driving several GPUs where a distributed launcher was needed."""
    if launcher != "python" or "RANK" in env or "WORLD_SIZE" in env:
        return None
    several = len(devices_with_memory) > 1 or (len(visible) > 1 and len(devices_with_memory) > 0)
    if not several:
        return None
    gpus = devices_with_memory if len(devices_with_memory) > 1 else visible
    return (
        f"pid {pid} uses GPUs {','.join(str(i) for i in gpus)} but was not started by a "
        "distributed launcher: started with plain python where torchrun/accelerate launch "
        "was needed (fine only for nn.DataParallel)"
    )


def device_health(devices: Sequence[GpuDevice], ranks_on: Mapping[int, Sequence[int]]) -> list[str]:
    """Lost GPUs, uncorrected ECC errors and real throttling, naming the ranks affected."""
    out: list[str] = []
    for d in devices:
        who = _who(ranks_on.get(d.index, ()))
        label = f"GPU {d.index}" + (f" ({d.bus_id})" if d.bus_id else "")
        if d.lost:
            victims = f"{who} on it" if ranks_on.get(d.index) else "any process on it"
            out.append(
                f"{label} is lost (fell off the bus or needs a reset): {victims} will hang "
                "or crash; check Xid errors and nvidia-smi"
            )
            continue
        if d.ecc_errors:
            out.append(f"{label} has {d.ecc_errors} uncorrected ECC errors since driver load ({who})")
        serious = [SERIOUS_THROTTLE[t] for t in d.throttle if t in SERIOUS_THROTTLE]
        if serious:
            temp = f" at {d.temperature_c:.0f}°C" if d.temperature_c is not None else ""
            out.append(f"{label} is throttled{temp}: {', '.join(serious)} ({who} slowed down)")
    return out


def stray_contexts(stray: Mapping[int, Sequence[int]]) -> list[str]:
    """Ranks holding memory on a GPU other than their own (device index -> ranks)."""
    return [
        f"{_who(ranks)} also hold memory on GPU {index}, not their own: a stray CUDA context "
        "(call torch.cuda.set_device(local_rank) before any CUDA work)"
        for index, ranks in sorted(stray.items()) if ranks
    ]


def child_memory(rank: int | None, child_pid: int, index: int, used: int | None) -> str:
    amount = f"{used / 2**20:.0f} MiB" if used is not None else "memory"
    return (
        f"rank {rank}'s child process {child_pid} holds {amount} on GPU {index} (a DataLoader "
        "worker or helper with its own CUDA context)"
    )

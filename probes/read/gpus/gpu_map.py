"""Pure mapping between ranks and GPUs: visible devices, PID namespaces, device assignment.

No NVML and no I/O here except the small ``/proc`` reader at the bottom, so every rule is
testable with plain data.

PID rule (NVML reports PIDs of the initial, "host" PID namespace):

* When our ``/proc`` belongs to the initial namespace (``/proc/self/ns/pid`` is
  ``pid:[4026531836]``, the kernel's fixed ``PROC_PID_INIT_INO``), the PIDs we see *are*
  host PIDs: NVML PIDs map exactly.
* Inside a container the host PID of a process is not visible anywhere in ``/proc``. Then an
  NVML PID is accepted only when it equals a local rank PID *and* lies on a device that rank
  may use; everything else stays unmapped. A GPU process is never guessed onto a rank.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ...record import Record

PROC_PID_INIT_INO = 4026531836  # inode of the initial PID namespace (include/linux/proc_ns.h)


@dataclass(frozen=True, repr=False)
class DeviceId(Record):
    """What identifies one physical GPU, as read from NVML."""

    index: int
    uuid: str | None = None


@dataclass(frozen=True, repr=False)
class VisibleDevices(Record):
    """CUDA_VISIBLE_DEVICES resolved to NVML indices."""

    indices: tuple[int, ...]
    unresolved: tuple[str, ...] = ()  # entries we could not place (MIG ids, unknown UUIDs)


def parse_visible_devices(value: str | None, devices: Sequence[DeviceId]) -> VisibleDevices:
    """Resolve a CUDA_VISIBLE_DEVICES value the way the CUDA runtime reads it.

    Unset means every device. Entries are indices or (prefixes of) ``GPU-<uuid>``; like CUDA,
    reading stops at the first entry that names no device. ``MIG-GPU-<uuid>/gi/ci`` resolves to
    its parent GPU; the newer ``MIG-<uuid>`` form cannot be placed without MIG queries.
    """
    if value is None:
        return VisibleDevices(tuple(d.index for d in devices))
    indices: list[int] = []
    unresolved: list[str] = []
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            break
        index = _resolve_token(token, devices)
        if index is None:
            if token.startswith("MIG-"):
                unresolved.append(token)
                continue
            if not token.lstrip("-").isdigit():
                unresolved.append(token)
            break
        if index not in indices:
            indices.append(index)
    return VisibleDevices(tuple(indices), tuple(unresolved))


def _resolve_token(token: str, devices: Sequence[DeviceId]) -> int | None:
    if token.lstrip("-").isdigit():
        number = int(token)
        return number if any(d.index == number for d in devices) else None
    if token.startswith("MIG-GPU-"):
        token = token[len("MIG-"):].split("/", 1)[0]
    elif token.startswith("MIG-"):
        return None
    wanted = token if token.startswith("GPU-") else "GPU-" + token
    matches = [d.index for d in devices if d.uuid and d.uuid.lower().startswith(wanted.lower())]
    return matches[0] if len(matches) == 1 else None


def expected_device(visible: Sequence[int], local_rank: int | None) -> int | None:
    """The device a rank should use: ``visible[LOCAL_RANK]`` (torch.cuda.set_device convention)."""
    if len(visible) == 1:
        return visible[0]
    if local_rank is not None and 0 <= local_rank < len(visible):
        return visible[local_rank]
    return None


def pick_device(
    on_devices: dict[int, int | None], expected: int | None
) -> int | None:
    """Which device a rank runs on, given its memory per device (NVML is authoritative)."""
    if not on_devices:
        return expected
    if expected is not None and expected in on_devices:
        return expected
    return max(on_devices, key=lambda i: (on_devices[i] or 0, -i))


def sharing(index_by_rank: dict[int, int | None]) -> dict[int, tuple[int, ...]]:
    """For each rank, the other ranks placed on the same device."""
    result: dict[int, tuple[int, ...]] = {}
    for rank, index in index_by_rank.items():
        others = () if index is None else tuple(
            sorted(r for r, i in index_by_rank.items() if i == index and r != rank)
        )
        result[rank] = others
    return result


def proc_in_initial_pid_ns(link: str | None = None) -> bool:
    """Whether our /proc (and we) live in the initial PID namespace."""
    try:
        target = link if link is not None else os.readlink("/proc/self/ns/pid")
    except OSError:
        return False
    return target == f"pid:[{PROC_PID_INIT_INO}]"

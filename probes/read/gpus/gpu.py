"""Per-rank GPU facts from NVML: what each rank's GPU is doing, and GPU faults that kill jobs.

``GpuProbe.read`` is called once per snapshot tick, from any one thread at a time (a lock
serialises calls). Cost per tick: about ten NVML calls per healthy device (four more for GPM
on Hopper and newer; the first tick waits 0.1 s once for its second GPM sample), none for a
lost one, one non-blocking read of new kernel-log records and one short NVML event wait.
NVML calls into a *failing* GPU can block for seconds before it is reported lost; for a hard
bound, run ``read`` in a worker thread and wait on it with a timeout, reusing the previous
reading meanwhile (the probe stays usable after such a slow call).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import ModuleType

from . import gpu_health as gw
from .gpu_map import DeviceId, expected_device, parse_visible_devices, pick_device, proc_in_initial_pid_ns, sharing
from .gpu_nvml import GPM_FIRST_GAP_S, NvmlSession
from ..processes.process import RankProcess
from .xid import KmsgReader, NvmlXidListener, XidEvent, describe, normalize_bus
from ...snapshot import GpuDevice, GpuProcess, HostInfo, RankGpu
from ...record import Record

MAX_XIDS = 32
NAMESPACE_NOTE = (
    "trainwatch runs inside a PID namespace (container): NVML reports host PIDs, so GPU "
    "processes are matched to ranks only where PID and device agree; run it on the host or "
    "with --pid=host for exact per-rank GPU memory"
)


@dataclass(frozen=True, repr=False)
class GpuReading(Record):
    """One tick of the GPU probe: the host's GPUs and each rank's."""

    host: HostInfo
    per_pid: dict[int, RankGpu]  # rank main pid -> its GPU
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, repr=False)
class _Owner(Record):
    """The rank a GPU process belongs to (itself, or a child of it)."""

    rank: int | None
    rank_pid: int
    child: bool


class GpuProbe:
    """Reads this host's GPUs through NVML and ties them to the job's rank processes."""

    def __init__(
        self, nvml: ModuleType | None = None, kmsg_path: str = "/dev/kmsg",
        in_initial_pid_ns: bool | None = None,
    ) -> None:
        self._session = NvmlSession(nvml)
        self._kmsg = KmsgReader(kmsg_path)
        self._listener: NvmlXidListener | None = None
        self._xids: deque[XidEvent] = deque(maxlen=MAX_XIDS)
        self._exact_pids = in_initial_pid_ns
        self._primed_at: float | None = None  # when the first GPM samples were taken, until the first read
        self._lock = threading.Lock()

    def read(self, ranks: Sequence[RankProcess], launcher: str) -> GpuReading:
        with self._lock:
            return self._read(ranks, launcher)

    def prime(self) -> None:
        """Start NVML and take each device's first GPM sample now (from a thread, while the ranks
        are sampled): the first read then waits only what is left of the gap GPM needs between
        two samples, not all of it (0.1 s of every one-shot snapshot on a Hopper host)."""
        with self._lock:
            if self._session.start() and self._session.gpm_prime():
                self._primed_at = time.monotonic()

    def close(self) -> None:
        with self._lock:
            self._kmsg.close()
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            self._session.close()

    # -- one tick --------------------------------------------------------------------------

    def _read(self, ranks: Sequence[RankProcess], launcher: str) -> GpuReading:
        hostname = socket.gethostname()
        session = self._session
        if not session.start():
            return GpuReading(HostInfo(name=hostname), {}, (), (session.error or "NVML unavailable",))
        notes: list[str] = []
        if session.gpm_prime():  # a first reading: GPM compares two samples
            self._primed_at = time.monotonic()
        if self._primed_at is not None:
            time.sleep(max(0.0, self._primed_at + GPM_FIRST_GAP_S - time.monotonic()))
            self._primed_at = None
        devices = [session.read_device(i) for i in range(len(session.devices))]
        if not devices:
            notes.append("NVML: no NVIDIA GPU on this host")
        self._collect_xids(devices, notes)

        if self._exact_pids is None:
            self._exact_pids = proc_in_initial_pid_ns()
        if not self._exact_pids and ranks:
            notes.append(NAMESPACE_NOTE)
        ids = [DeviceId(d.index, d.uuid) for d in devices]
        visible: dict[int, tuple[int, ...]] = {}
        for rp in ranks:
            resolved = parse_visible_devices(rp.env.get("CUDA_VISIBLE_DEVICES"), ids)
            visible[rp.pid] = resolved.indices
            if resolved.unresolved:
                notes.append(
                    f"rank {rp.rank}: CUDA_VISIBLE_DEVICES entries {','.join(resolved.unresolved)} "
                    "do not name a GPU NVML lists (MIG instance or another host's UUID)"
                )

        devices, owners = self._attribute(devices, ranks, visible)
        per_pid, warnings = self._per_rank(devices, owners, ranks, visible, launcher)
        warnings.extend(self._xid_warnings(ranks))
        host = HostInfo(
            name=hostname,
            gpus=tuple(devices),
            driver_version=session.driver_version,
            cuda_driver_version=session.cuda_driver_version,
            nvml_version=session.nvml_version,
            xid_events=tuple(describe(e) for e in self._xids),
        )
        return GpuReading(host, per_pid, tuple(dict.fromkeys(warnings)), tuple(dict.fromkeys(notes)))

    def _attribute(
        self, devices: list[GpuDevice], ranks: Sequence[RankProcess],
        visible: dict[int, tuple[int, ...]],
    ) -> tuple[list[GpuDevice], dict[int, _Owner]]:
        """Fill ``local_pid``/``rank`` of each GPU process we can tie to a rank for sure."""
        owners: dict[int, _Owner] = {}
        for rp in ranks:
            for child in rp.children:
                owners.setdefault(child, _Owner(rp.rank, rp.pid, True))
            owners[rp.pid] = _Owner(rp.rank, rp.pid, False)
        out = []
        for device in devices:
            procs = []
            for proc in device.processes:
                owner = owners.get(proc.pid)
                if owner is not None and not self._exact_pids:
                    # same number in our namespace: believe it only on a device the rank may use
                    if device.index not in visible.get(owner.rank_pid, ()):
                        owner = None
                if owner is None:
                    procs.append(proc)
                else:
                    procs.append(replace(proc, local_pid=proc.pid, rank=owner.rank))
            out.append(replace(device, processes=tuple(procs)))
        return out, owners

    def _per_rank(
        self, devices: list[GpuDevice], owners: dict[int, _Owner],
        ranks: Sequence[RankProcess], visible: dict[int, tuple[int, ...]], launcher: str,
    ) -> tuple[dict[int, RankGpu], list[str]]:
        by_index = {d.index: d for d in devices}
        listed = {d.index for d in devices if self._session.process_list_ok.get(d.index)}
        warnings: list[str] = []
        index_of: dict[int, int | None] = {}
        stray: dict[int, list[int]] = {}
        job_devices: set[int] = set()
        mine: dict[int, dict[int, GpuProcess]] = {}  # rank pid -> device -> its process entry
        for device in devices:
            for proc in device.processes:
                if proc.local_pid is None:
                    continue
                owner = owners[proc.local_pid]
                job_devices.add(device.index)
                if owner.child:
                    warnings.append(gw.child_memory(owner.rank, proc.pid, device.index,
                                                    proc.mem_used_bytes))
                else:
                    mine.setdefault(owner.rank_pid, {})[device.index] = proc
        for rp in ranks:
            on = mine.get(rp.pid, {})
            index = pick_device({i: p.mem_used_bytes for i, p in on.items()},
                                expected_device(visible.get(rp.pid, ()), rp.local_rank))
            index_of[rp.pid] = index
            if index is not None:
                job_devices.add(index)
            for other in on:
                if other != index and rp.rank is not None:
                    stray.setdefault(other, []).append(rp.rank)
            listed_cvd = visible.get(rp.pid, ()) if "CUDA_VISIBLE_DEVICES" in rp.env else ()
            warning = gw.no_launcher(launcher, rp.pid, rp.env, sorted(on), listed_cvd)
            if warning:
                warnings.append(warning)
        shared = sharing({rp.rank: index_of[rp.pid] for rp in ranks if rp.rank is not None})
        per_pid: dict[int, RankGpu] = {}
        for rp in ranks:
            index = index_of[rp.pid]
            device = by_index.get(index) if index is not None else None
            proc = mine.get(rp.pid, {}).get(index) if index is not None else None
            if proc is None and device is not None and index in listed and self._exact_pids:
                mem, util = 0, 0.0  # listed exactly, and the rank has no context there
            else:
                mem = proc.mem_used_bytes if proc else None
                util = proc.util_pct if proc else None
            per_pid[rp.pid] = RankGpu(
                index=index,
                visible=visible.get(rp.pid, ()),
                util_pct=device.util_pct if device else None,
                proc_util_pct=util,
                mem_used_bytes=mem,
                mem_total_bytes=device.mem_total_bytes if device else None,
                shared_with=shared.get(rp.rank, ()) if rp.rank is not None else (),
                power_w=device.power_w if device else None,
                power_limit_w=device.power_limit_w if device else None,
                sm_active_pct=device.sm_active_pct if device else None,
                tensor_active_pct=device.tensor_active_pct if device else None,
                dram_bw_pct=device.dram_bw_pct if device else None,
            )

        if not job_devices:
            job_devices = {i for v in visible.values() for i in v} or set(by_index)
        used = [by_index[i] for i in sorted(job_devices) if i in by_index]
        ranks_on: dict[int, list[int]] = {}
        for rp in ranks:
            if index_of[rp.pid] is not None and rp.rank is not None:
                ranks_on.setdefault(index_of[rp.pid], []).append(rp.rank)
        mixed = gw.mixed_gpus(used, ranks_on)
        if mixed:
            warnings.append(mixed)
        warnings.extend(gw.device_health(used, ranks_on))
        warnings.extend(gw.stray_contexts({i: sorted(set(r)) for i, r in stray.items()}))
        if self._exact_pids and ranks:
            warnings.extend(self._foreign(used))
        return per_pid, warnings

    def _foreign(self, used: list[GpuDevice]) -> list[str]:
        """Processes of other jobs on the job's GPUs (only when PIDs map exactly)."""
        out = []
        for device in used:
            for proc in device.processes:
                if proc.local_pid is None:
                    amount = (f" ({proc.mem_used_bytes / 2**30:.1f} GiB)"
                              if proc.mem_used_bytes is not None else "")
                    out.append(f"GPU {device.index} is also used by pid {proc.pid}, which is not "
                               f"part of this job{amount}")
        return out

    # -- Xid -------------------------------------------------------------------------------

    def _collect_xids(self, devices: list[GpuDevice], notes: list[str]) -> None:
        kernel = self._kmsg.read()
        buses = {normalize_bus(d.bus_id): d.index for d in devices if d.bus_id}
        for event in kernel:
            self._xids.append(replace(event, gpu_index=buses.get(event.bus)))
        if self._kmsg.error:
            notes.append(self._kmsg.error)
        if self._listener is None:
            handles = [(i, s.handle) for i, s in enumerate(self._session.devices)
                       if s.handle is not None and not s.lost]
            self._listener = NvmlXidListener(self._session.nvml, handles)
            self._listener.start()
        nvml_events = self._listener.poll()
        if not self._kmsg.live:
            # the kernel log already carries every Xid when we can read it live
            for event in nvml_events:
                bus = next((d.bus_id for d in devices if d.index == event.gpu_index), None)
                self._xids.append(replace(event, bus=normalize_bus(bus)))
        if self._listener.error and self._kmsg.error:
            notes.append(self._listener.error)

    def _xid_warnings(self, ranks: Sequence[RankProcess]) -> list[str]:
        starts = [rp.create_time for rp in ranks if rp.create_time > 0]
        since = min(starts) - 60 if starts else time.time() - 3600
        return [describe(e) for e in self._xids if e.at is None or e.at >= since]

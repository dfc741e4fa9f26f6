"""Raw NVML reads: one session per probe, devices read field by field, never a traceback.

Every field that cannot be read is ``None``. "Not supported"-style answers are remembered per
device and field, so a field a GPU lacks costs one call per probe, not one per tick. A lost GPU
is marked lost and not called again: calls into a lost GPU can block for seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from ...snapshot import GpuDevice, GpuProcess
from .nvml_errors import nvml_errors
from ...record import Record

# Clock-event (throttle) reason bits, stable across NVML versions, with short names.
THROTTLE_NAMES = (
    (0x001, "idle"),
    (0x002, "app-clocks"),
    (0x004, "power-cap"),
    (0x008, "hw-slowdown"),
    (0x010, "sync-boost"),
    (0x020, "sw-thermal"),
    (0x040, "hw-thermal"),
    (0x080, "power-brake"),
    (0x100, "display-clock"),
)
UTIL_FRESH_S = 3.0  # reuse a process's last utilization sample for this long
# GPM (Hopper and newer): device activity between two samples, by NVML metric id
# (NVML_GPM_METRIC_SM_UTIL, _ANY_TENSOR_UTIL, _DRAM_BW_UTIL; ids are fixed in nvml.h).
GPM_METRICS = (("sm_active_pct", 2), ("tensor_active_pct", 5), ("dram_bw_pct", 10))
GPM_FIRST_GAP_S = 0.1  # a first reading takes its two samples this far apart
_PROCESS_FUNCS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)


class _Lost(Exception):
    """The device stopped answering (GPU is lost / needs a reset)."""


@dataclass(repr=False)
class _DeviceState(Record):
    """One device's NVML handle and what is known not to work on it."""

    handle: Any = None
    lost: bool = False
    static: dict[str, Any] = field(default_factory=dict)  # name, uuid, bus id, cc
    unsupported: set[str] = field(default_factory=set)
    last_seen_us: int = 0  # newest process-utilization sample timestamp seen
    util_cache: dict[int, tuple[float, float]] = field(default_factory=dict)  # pid -> (util, at)
    gpm_sample: Any = None  # the previous GPM sample (an NVML allocation, freed when replaced)


def throttle_names(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(name for bit, name in THROTTLE_NAMES if mask & bit)


def init_error_text(exc: BaseException, nvml: ModuleType | None) -> str:
    """One sentence saying why NVML cannot be used."""
    name = type(exc).__name__
    reasons = {
        "NVMLError_LibraryNotFound": NO_DRIVER,
        "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
        "NVMLError_LibRmVersionMismatch": (
            "NVIDIA driver/library version mismatch (driver upgraded without reboot or "
            "module reload)"
        ),
        "NVMLError_NoPermission": "no permission to open the NVIDIA devices",
        "NVMLError_FunctionNotFound": "libnvidia-ml.so.1 is too old for this nvidia-ml-py",
    }
    if isinstance(exc, ImportError):
        return "NVML unavailable: the nvidia-ml-py (pynvml) package is not installed"
    why = reasons.get(name) or str(exc) or name
    return f"NVML unavailable: {why}"


NO_DRIVER = "libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl")  # the loaded kernel module; its device in a container


def driver_present() -> bool:
    """Whether this host (or container) shows an NVIDIA driver. Without one NVML cannot start, and
    importing pynvml and loading its library to find that out costs every command 10 ms."""
    return any(os.path.exists(path) for path in DRIVER_PATHS)


class NvmlSession:
    """Lazily initialised NVML with cached handles. Not thread-safe: the probe holds a lock."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._started = False
        self.error: str | None = None
        self.driver_version: str | None = None
        self.cuda_driver_version: str | None = None
        self.nvml_version: str | None = None
        self.devices: list[_DeviceState] = []
        self.process_list_ok: dict[int, bool] = {}  # device -> process list read this tick
        self._process_func: str | None = None
        self.clock: Callable[[], float] = time.monotonic

    @property
    def nvml(self) -> ModuleType | None:
        return self._nvml

    def start(self) -> bool:
        """Initialise once; False (with :attr:`error` set) when NVML cannot be used."""
        if self._started:
            return self.error is None
        self._started = True
        if self._nvml is None and not driver_present():
            self.error = f"NVML unavailable: {NO_DRIVER}"
            return False
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except (ImportError, *nvml_errors(self._nvml)) as exc:  # no bindings, no library, no driver
            self.error = init_error_text(exc, self._nvml)
            return False
        nv = self._nvml
        self.driver_version = _text(self._system(nv, "nvmlSystemGetDriverVersion"))
        self.nvml_version = _text(self._system(nv, "nvmlSystemGetNVMLVersion"))
        cuda = self._system(nv, "nvmlSystemGetCudaDriverVersion")
        if cuda is None:
            cuda = self._system(nv, "nvmlSystemGetCudaDriverVersion_v2")
        if isinstance(cuda, int) and cuda > 0:
            self.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        count = self._system(nv, "nvmlDeviceGetCount")
        for index in range(count or 0):
            state = _DeviceState()
            try:
                state.handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nvml_errors(self._nvml) as exc:
                state.lost = _is_lost(exc)
                state.unsupported.add("*")  # no handle: nothing else can be read
            self.devices.append(state)
        return True

    def close(self) -> None:
        for state in self.devices:
            self._free_gpm(state)
        if self._started and self.error is None and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except nvml_errors(self._nvml):
                pass  # letting the library go: nothing read is lost
        self._started = False
        self.error = None
        self.devices = []

    def read_device(self, index: int) -> GpuDevice:
        """Everything shown about one device; processes carry host PIDs, ranks unset."""
        state = self.devices[index]
        self.process_list_ok[index] = False
        if state.lost or "*" in state.unsupported:
            return self._device_from_static(index, state, lost=state.lost)
        try:
            self._read_static(state)
            util = self._get(state, "util", "nvmlDeviceGetUtilizationRates")
            memory = self._get(state, "memory", "nvmlDeviceGetMemoryInfo")
            temp = self._get(state, "temp", "nvmlDeviceGetTemperature", 0)  # NVML_TEMPERATURE_GPU
            power_mw = self._get(state, "power", "nvmlDeviceGetPowerUsage")
            limit_mw = self._get(state, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")
            gpm = self._gpm(state)
            sm_clock = self._get(state, "sm_clock", "nvmlDeviceGetClockInfo", 1)  # NVML_CLOCK_SM
            reasons = self._throttle_mask(state)
            # uncorrected errors since the driver loaded (volatile counter)
            ecc = self._get(state, "ecc", "nvmlDeviceGetTotalEccErrors", 1, 0)
            processes = self._processes(index, state)
        except _Lost:
            state.lost = True
            return self._device_from_static(index, state, lost=True)
        return replace(
            self._device_from_static(index, state, lost=False),
            util_pct=_num(getattr(util, "gpu", None)),
            mem_util_pct=_num(getattr(util, "memory", None)),
            mem_used_bytes=getattr(memory, "used", None),
            mem_total_bytes=getattr(memory, "total", None) or state.static.get("mem_total"),
            temperature_c=_num(temp),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            sm_active_pct=gpm.get("sm_active_pct"),
            tensor_active_pct=gpm.get("tensor_active_pct"),
            dram_bw_pct=gpm.get("dram_bw_pct"),
            sm_clock_mhz=sm_clock,
            throttle=throttle_names(reasons),
            ecc_errors=ecc,
            processes=processes,
        )

    # -- fields ------------------------------------------------------------------------------

    def _read_static(self, state: _DeviceState) -> None:
        if state.static.get("done"):
            return
        state.static["name"] = _text(self._get(state, "name", "nvmlDeviceGetName"))
        state.static["uuid"] = _text(self._get(state, "uuid", "nvmlDeviceGetUUID"))
        pci = self._get(state, "pci", "nvmlDeviceGetPciInfo")
        state.static["bus_id"] = _text(getattr(pci, "busId", None))
        cc = self._get(state, "cc", "nvmlDeviceGetCudaComputeCapability")
        state.static["cc"] = f"{cc[0]}.{cc[1]}" if cc else None
        state.static["done"] = True

    # -- GPM ---------------------------------------------------------------------------------

    def gpm_prime(self) -> bool:
        """Take a first GPM sample on every device that has none, so the next read has two
        samples to compare; True when one was taken (the caller waits :data:`GPM_FIRST_GAP_S`)."""
        taken = False
        for state in self.devices:
            if state.gpm_sample is None and not state.lost and "*" not in state.unsupported:
                try:
                    state.gpm_sample = self._gpm_sample(state)
                except _Lost:
                    state.lost = True
                taken = taken or state.gpm_sample is not None
        return taken

    def _gpm(self, state: _DeviceState) -> dict[str, float | None]:
        """SM, tensor and DRAM activity since the previous sample; {} where GPM is not offered."""
        sample = self._gpm_sample(state)
        if sample is None:
            return {}
        previous, state.gpm_sample = state.gpm_sample, sample
        if previous is None:
            return {}
        nv = self._nvml
        try:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, sample
            for i, (_name, metric) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric
            nv.nvmlGpmMetricsGet(request)
        except nvml_errors(self._nvml) as exc:
            if _is_lost(exc):
                raise _Lost() from exc
            if _unsupported(exc) or isinstance(exc, AttributeError):
                state.unsupported.add("gpm")
            return {}
        finally:
            self._free(previous)
        return {name: (round(float(request.metrics[i].value), 1) if request.metrics[i].nvmlReturn == 0 else None)
                for i, (name, _metric) in enumerate(GPM_METRICS)}

    def _gpm_sample(self, state: _DeviceState) -> Any:
        """A fresh GPM sample of the device; None where GPM is not offered (asked once)."""
        if "gpm" in state.unsupported:
            return None
        nv = self._nvml
        if "gpm_ok" not in state.static:
            support = self._get(state, "gpm", "nvmlGpmQueryDeviceSupport")
            state.static["gpm_ok"] = bool(getattr(support, "isSupportedDevice", 0))
            if not state.static["gpm_ok"]:
                state.unsupported.add("gpm")
                return None
        sample = None
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(state.handle, sample)
            return sample
        except nvml_errors(self._nvml) as exc:
            self._free(sample)
            if _is_lost(exc):
                raise _Lost() from exc
            if _unsupported(exc) or isinstance(exc, AttributeError):
                state.unsupported.add("gpm")
            return None

    def _free(self, sample: Any) -> None:
        if sample is not None:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except nvml_errors(self._nvml):
                pass  # freeing a sample: nothing read is lost

    def _free_gpm(self, state: _DeviceState) -> None:
        sample, state.gpm_sample = state.gpm_sample, None
        self._free(sample)

    def _throttle_mask(self, state: _DeviceState) -> int | None:
        mask = self._get(state, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons")
        if "clock_events" in state.unsupported:  # drivers before 535 know only the old name
            mask = self._get(state, "throttle", "nvmlDeviceGetCurrentClocksThrottleReasons")
        return mask

    def _processes(self, index: int, state: _DeviceState) -> tuple[GpuProcess, ...]:
        raw = self._running_processes(state)
        self.process_list_ok[index] = raw is not None
        if raw is None:
            return ()
        memory: dict[int, int | None] = {}
        for info in raw:
            pid = int(info.pid)
            used = getattr(info, "usedGpuMemory", None)
            if pid in memory and memory[pid] is not None and used is not None:
                memory[pid] = memory[pid] + used  # one entry per MIG instance
            else:
                memory.setdefault(pid, used)
        utils = self._process_utils(state, memory)
        return tuple(
            GpuProcess(pid=pid, mem_used_bytes=used, util_pct=utils.get(pid))
            for pid, used in sorted(memory.items())
        )

    def _running_processes(self, state: _DeviceState) -> list[Any] | None:
        nv = self._nvml
        names = (self._process_func,) if self._process_func else _PROCESS_FUNCS
        for name in names:
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                result = fn(state.handle)
            except nvml_errors(self._nvml) as exc:
                if _is_lost(exc):
                    raise _Lost() from exc
                if _type_name(exc) in ("NVMLError_FunctionNotFound", "NVMLLibraryMismatchError"):
                    continue  # older driver: try the previous struct version
                return None
            self._process_func = name
            return list(result)
        return None

    def _process_utils(
        self, state: _DeviceState, pids: dict[int, int | None]
    ) -> dict[int, float]:
        """Per-process SM utilization since the last call on this device.

        NVML returns only samples newer than the timestamp we pass, and only for processes
        that were busy; so we pass the newest timestamp seen on this device (0 the first time),
        keep each process's last value a few seconds, and report 0 for a listed process with
        no sample at all.
        """
        if "proc_util" in state.unsupported or not pids:
            return {}
        now = self.clock()
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(state.handle, state.last_seen_us)
        except nvml_errors(self._nvml) as exc:
            if _is_lost(exc):
                raise _Lost() from exc
            if _type_name(exc) == "NVMLError_NotFound":
                samples = []  # no process was busy since last_seen
            else:
                if _unsupported(exc):
                    state.unsupported.add("proc_util")
                return {}
        newest: dict[int, tuple[int, float]] = {}
        for sample in samples:
            pid, stamp = int(sample.pid), int(sample.timeStamp)
            if pid not in newest or stamp >= newest[pid][0]:
                newest[pid] = (stamp, float(sample.smUtil))
            state.last_seen_us = max(state.last_seen_us, stamp)
        for pid, (_stamp, util) in newest.items():
            state.util_cache[pid] = (util, now)
        result: dict[int, float] = {}
        for pid in pids:
            cached = state.util_cache.get(pid)
            result[pid] = cached[0] if cached and now - cached[1] <= UTIL_FRESH_S else 0.0
        for pid in [p for p in state.util_cache if p not in pids]:
            del state.util_cache[pid]
        return result

    def _get(self, state: _DeviceState, key: str, func: str, *args: Any) -> Any:
        if key in state.unsupported:
            return None
        fn = getattr(self._nvml, func, None)
        if fn is None:
            state.unsupported.add(key)
            return None
        try:
            return fn(state.handle, *args)
        except nvml_errors(self._nvml) as exc:
            if _is_lost(exc):
                raise _Lost() from exc
            if _unsupported(exc):
                state.unsupported.add(key)
            return None

    def _system(self, nv: ModuleType, func: str) -> Any:
        fn = getattr(nv, func, None)
        if fn is None:
            return None
        try:
            return fn()
        except nvml_errors(nv):
            return None  # an unreadable version string: shown as NA

    def _device_from_static(self, index: int, state: _DeviceState, lost: bool) -> GpuDevice:
        return GpuDevice(
            index=index,
            name=state.static.get("name"),
            uuid=state.static.get("uuid"),
            bus_id=state.static.get("bus_id"),
            compute_capability=state.static.get("cc"),
            lost=lost,
        )


def _type_name(exc: BaseException) -> str:
    return type(exc).__name__


def _is_lost(exc: BaseException) -> bool:
    return _type_name(exc) in ("NVMLError_GpuIsLost", "NVMLError_ResetRequired")


def _unsupported(exc: BaseException) -> bool:
    return _type_name(exc) in (
        "NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission",
        "NVMLLibraryMismatchError", "NVMLError_InvalidArgument",
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip("\x00").strip() or None


def _num(value: Any) -> float | None:
    return None if value is None else float(value)

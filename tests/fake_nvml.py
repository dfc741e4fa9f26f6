"""A fake of the ``pynvml`` module boundary, for tests and benchmarks only.

It raises the real ``pynvml.NVMLError_*`` classes and returns the real ctypes structures
(``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``nvmlPciInfo_t``, process infos through
``nvmlStructToFriendlyObject``, ``c_nvmlProcessUtilizationSample_t``, ``c_nvmlEventData_t``),
built from the installed pynvml, so a change of those shapes breaks the tests instead of
drifting silently. ``FakeNvml.from_json`` loads readings recorded on a real GPU by
``tests/fixtures/nvml/record.py`` (schema in ``tests/fixtures/nvml/README.md``).
"""

from __future__ import annotations

import ctypes
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as real


@dataclass
class FakeGpu:
    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:07:00.0"
    cc: tuple[int, int] = (8, 0)
    util_gpu: int = 0
    util_mem: int = 0
    mem_total: int = 80 * 2**30
    mem_used: int = 0
    temperature_c: int = 40
    power_mw: int = 70_000
    power_limit_mw: int | None = 400_000  # None: not supported
    gpm: dict[int, float] | None = None  # GPM metric id -> value between two samples; None: no GPM (pre-Hopper)
    sm_clock_mhz: int = 1410
    clock_event_reasons: int = 0
    ecc_uncorrected: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (host pid, bytes)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timeStamp us, smUtil)
    supported_events: int = 0x8 | 0x4  # Xid | double-bit ECC
    errors: dict[str, str] = field(default_factory=dict)  # function -> NVMLError_* class name
    lost: bool = False
    lost_at_handle: bool = False


class FakeNvml:
    """Module-like: ``GpuProbe(FakeNvml([...]))``. Counts calls in :attr:`calls`."""

    def __init__(
        self, gpus: list[FakeGpu] | None = None, *, library_missing: bool = False,
        init_error: str | None = None, missing_functions: tuple[str, ...] = (),
        absent_functions: tuple[str, ...] = (), driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040, nvml_version: str = "12.550.54.15",
    ) -> None:
        self.gpus = list(gpus or [])
        self.library_missing = library_missing
        self.init_error = init_error
        self.missing = set(missing_functions)  # symbol absent from libnvidia-ml (old driver)
        self.absent = set(absent_functions)  # attribute absent from the Python module
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.nvml_version = nvml_version
        self.calls: dict[str, int] = {}
        self.events: deque[tuple[int, int]] = deque()  # (device index, xid)
        self.initialized = False
        self._structs = [real.struct_c_nvmlDevice_t() for _ in self.gpus]
        self._handles = [real.c_nvmlDevice_t(s) for s in self._structs]
        self._by_address = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}
        for name in dir(real):
            if name.startswith(("NVML_", "nvmlClocks", "nvmlEventType")) or name.startswith("NVMLError"):
                setattr(self, name, getattr(real, name))
        self.NVMLError = real.NVMLError
        self.c_nvmlGpmMetricsGet_t = real.c_nvmlGpmMetricsGet_t
        self._gpm_samples: dict[int, tuple[int, int]] = {}  # sample address -> (device index, sample order)
        self._gpm_keep: list[Any] = []
        self.gpm_live = 0  # samples allocated and not yet freed
        self._gpm_taken = 0
        self.NVMLLibraryMismatchError = real.NVMLLibraryMismatchError

    @classmethod
    def from_json(cls, path: str | Path) -> FakeNvml:
        """A fake that replays one recorded reading (see tests/fixtures/nvml/README.md)."""
        data = json.loads(Path(path).read_text())
        gpus = []
        for d in data["devices"]:
            gpus.append(FakeGpu(
                name=d["name"], uuid=d["uuid"], bus_id=d["bus_id"], cc=tuple(d["cc"]),
                util_gpu=d["util"]["gpu"], util_mem=d["util"]["memory"],
                mem_total=d["memory"]["total"], mem_used=d["memory"]["used"],
                temperature_c=d.get("temperature_c") or 0, power_mw=d.get("power_mw") or 0,
                sm_clock_mhz=d.get("sm_clock_mhz") or 0,
                clock_event_reasons=d.get("clock_event_reasons") or 0,
                ecc_uncorrected=d.get("ecc_uncorrected_volatile") or 0,
                processes=[(p["pid"], p["usedGpuMemory"]) for p in d.get("processes", [])],
                samples=[(s["pid"], s["timeStamp"], s["smUtil"])
                         for s in d.get("process_utilization", [])],
                supported_events=d.get("supported_events", 0),
                errors=dict(d.get("errors", {})),
                # absent from recordings made before they were recorded: replayed as not supported
                power_limit_mw=d.get("power_limit_mw"),
                gpm={int(k): float(v) for k, v in d["gpm"].items()} if d.get("gpm") is not None else None,
            ))
        return cls(
            gpus, driver_version=data.get("driver_version"),
            cuda_driver_version=data.get("cuda_driver_version") or 0,
            nvml_version=data.get("nvml_version"),
            missing_functions=tuple(data.get("missing_functions", ())),
        )

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "absent"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- plumbing ------------------------------------------------------------------------

    def _enter(self, func: str, handle: Any = None) -> FakeGpu | None:
        self.calls[func] = self.calls.get(func, 0) + 1
        if func in self.missing:
            raise real.NVMLError_FunctionNotFound()
        if not self.initialized and func != "nvmlInit":
            raise real.NVMLError_Uninitialized()
        if handle is None:
            return None
        gpu = self.gpus[self._index(handle)]
        if gpu.lost:
            raise real.NVMLError_GpuIsLost()
        if func in gpu.errors:
            raise getattr(real, gpu.errors[func])()
        return gpu

    def _index(self, handle: Any) -> int:
        return self._by_address[ctypes.addressof(handle.contents)]

    def lose(self, index: int) -> None:
        self.gpus[index].lost = True

    def xid(self, index: int, code: int) -> None:
        self.events.append((index, code))

    # -- system --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self.library_missing:
            raise real.NVMLError_LibraryNotFound()
        if self.init_error:
            raise getattr(real, self.init_error)()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if index >= len(self.gpus):
            raise real.NVMLError_InvalidArgument()
        if self.gpus[index].lost_at_handle:
            raise real.NVMLError_GpuIsLost()
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex")
        return self._index(handle)

    # -- device --------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        info = real.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._enter("nvmlDeviceGetCudaComputeCapability", handle).cc

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        return real.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        return real.c_nvmlMemory_t(
            total=gpu.mem_total, free=gpu.mem_total - gpu.mem_used, used=gpu.mem_used
        )

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == real.NVML_TEMPERATURE_GPU
        return self._enter("nvmlDeviceGetTemperature", handle).temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        assert clock == real.NVML_CLOCK_SM
        return self._enter("nvmlDeviceGetClockInfo", handle).sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert error_type == real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == real.NVML_VOLATILE_ECC
        return self._enter("nvmlDeviceGetTotalEccErrors", handle).ecc_uncorrected

    def _process_infos(self, gpu: FakeGpu) -> list[Any]:
        out = []
        for pid, used in gpu.processes:
            raw = real.c_nvmlProcessInfo_v3_t(
                pid=pid, usedGpuMemory=real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                if used is None else used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF,
            )
            obj = real.nvmlStructToFriendlyObject(raw)
            if obj.usedGpuMemory == real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None  # what pynvml does for "not available"
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._process_infos(self._enter("nvmlDeviceGetComputeRunningProcesses_v3", handle))

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._process_infos(self._enter("nvmlDeviceGetComputeRunningProcesses_v2", handle))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        # the real unversioned wrapper calls v3 and turns FunctionNotFound into this
        if "nvmlDeviceGetComputeRunningProcesses_v3" in self.missing:
            self.calls["nvmlDeviceGetComputeRunningProcesses"] = 1
            raise real.NVMLLibraryMismatchError("use a versioned function")
        return self._process_infos(self._enter("nvmlDeviceGetComputeRunningProcesses", handle))

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen: int) -> list[Any]:
        gpu = self._enter("nvmlDeviceGetProcessUtilization", handle)
        fresh = [s for s in gpu.samples if s[1] > last_seen]
        if not fresh:
            raise real.NVMLError_NotFound()
        return [real.c_nvmlProcessUtilizationSample_t(pid=p, timeStamp=t, smUtil=u, memUtil=0)
                for p, t, u in fresh]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        gpu = self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        if gpu.power_limit_mw is None:
            raise real.NVMLError_NotSupported()
        return gpu.power_limit_mw

    # -- GPM -----------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._enter("nvmlGpmQueryDeviceSupport", handle)
        return real.c_nvmlGpmSupport_t(version=real.NVML_GPM_SUPPORT_VERSION,
                                       isSupportedDevice=int(gpu.gpm is not None))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        body = real.struct_c_nvmlGpmSample_t()
        self._gpm_keep.append(body)
        self.gpm_live += 1
        return real.c_nvmlGpmSample_t(body)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._enter("nvmlGpmSampleGet", handle)
        if gpu.gpm is None:
            raise real.NVMLError_NotSupported()
        self._gpm_taken += 1
        self._gpm_samples[ctypes.addressof(sample.contents)] = (self._index(handle), self._gpm_taken)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        assert request.version == real.NVML_GPM_METRICS_GET_VERSION
        first = self._gpm_samples[ctypes.addressof(request.sample1.contents)]
        second = self._gpm_samples[ctypes.addressof(request.sample2.contents)]
        if first[0] != second[0] or first[1] >= second[1]:
            raise real.NVMLError_InvalidArgument()  # two samples of one device, older first
        values = self.gpus[first[0]].gpm or {}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in values:
                metric.value, metric.nvmlReturn = values[metric.metricId], real.NVML_SUCCESS
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._gpm_samples.pop(ctypes.addressof(sample.contents), None)
        self.gpm_live -= 1

    # -- events --------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return real.c_nvmlEventSet_t()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: Any) -> None:
        gpu = self._enter("nvmlDeviceRegisterEvents", handle)
        if not mask & gpu.supported_events:
            raise real.NVMLError_NotSupported()

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait")
        if not self.events:
            raise real.NVMLError_Timeout()
        index, code = self.events.popleft()
        return real.c_nvmlEventData_t(
            device=self._handles[index], eventType=real.nvmlEventTypeXidCriticalError,
            eventData=code,
        )

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree")

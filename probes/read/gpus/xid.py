"""Xid errors: the NVIDIA driver's own reports of GPU faults.

Two sources: the kernel log (``/dev/kmsg``, read non-blocking and bounded, kept open so each
tick reads only new records; ``dmesg`` once when the device node is missing) and NVML's event
set (``nvmlEventTypeXidCriticalError``), polled with a short timeout while attached.
"""

from __future__ import annotations

import errno
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..logs.kmsg import KmsgRecords
from .nvml_errors import nvml_errors
from ...record import Record

XID_EVENT_MASK = 0x8  # nvmlEventTypeXidCriticalError

# The Xids most often behind a dead or hanging multi-GPU job.
XID_MEANING = {
    13: "graphics engine exception (often an out-of-range access in a kernel)",
    31: "GPU memory page fault (illegal address in a kernel)",
    43: "GPU stopped processing (the faulting application was killed)",
    45: "preemptive cleanup after a fault",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error (GPU needs a reset)",
    119: "GSP RPC timeout",
    120: "GSP error",
}

_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (\d+),?\s*(.*)")
_PID_RE = re.compile(r"pid=(\d+)")
_NAME_RE = re.compile(r"name=([^,]+)")
_DMESG_RE = re.compile(r"^\[\s*(\d+\.\d+)\]\s*(.*)$")


@dataclass(frozen=True, repr=False)
class XidEvent(Record):
    """One Xid error, from the kernel log or NVML's event set."""

    code: int
    bus: str | None = None  # "0000:3b:00", normalised lower-case domain:bus:device
    gpu_index: int | None = None
    pid: int | None = None
    process: str | None = None
    text: str = ""
    at: float | None = None  # unix time
    source: str = "kernel"  # kernel | nvml


def parse_xid_message(message: str, at: float | None = None) -> XidEvent | None:
    """An ``NVRM: Xid (PCI:...): N, ...`` kernel message, or None for any other line."""
    match = _XID_RE.search(message)
    if not match:
        return None
    bus, code, rest = match.group(1), int(match.group(2)), match.group(3).strip()
    pid = _PID_RE.search(rest)
    name = _NAME_RE.search(rest)
    text = re.sub(r"(pid=[^,]*|name=[^,]*|channel=[^,]*),?\s*", "", rest).strip(" ,.")
    return XidEvent(
        code=code, bus=normalize_bus(bus), pid=int(pid.group(1)) if pid else None,
        process=name.group(1).strip() if name else None, text=text, at=at,
    )


def parse_kmsg_record(record: str, boot_time: float) -> XidEvent | None:
    """One /dev/kmsg record: ``prio,seq,usec,flags;message``."""
    head, sep, message = record.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    try:
        at = boot_time + int(fields[2]) / 1e6
    except (IndexError, ValueError):
        at = None
    return parse_xid_message(message, at)


def parse_dmesg_line(line: str, boot_time: float) -> XidEvent | None:
    match = _DMESG_RE.match(line)
    if match:
        return parse_xid_message(match.group(2), boot_time + float(match.group(1)))
    return parse_xid_message(line)


def normalize_bus(bus: str | None) -> str | None:
    """``00000000:3B:00.0`` and ``0000:3b:00`` -> ``0000:3b:00`` (domain:bus:device)."""
    if not bus:
        return None
    parts = bus.lower().split(".")[0].split(":")
    if len(parts) != 3:
        return bus.lower()
    try:
        domain, bus_no, dev = (int(p, 16) for p in parts)
    except ValueError:
        return bus.lower()
    return f"{domain:04x}:{bus_no:02x}:{dev:02x}"


def describe(event: XidEvent) -> str:
    """``Xid 79 on GPU 2 (0000:3b:00) at 2025-01-31 12:03:04: GPU has fallen off the bus (pid 1234 python)``.

    The time is absolute so the line stays the same from tick to tick.
    """
    where = f"GPU {event.gpu_index}" if event.gpu_index is not None else "GPU"
    if event.bus:
        where += f" ({event.bus})"
    when = ""
    if event.at is not None:
        when = " at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
    meaning = XID_MEANING.get(event.code) or event.text or "see NVIDIA's Xid catalog"
    who = ""
    if event.pid is not None:
        who = f" (pid {event.pid}{' ' + event.process if event.process else ''})"
    return f"Xid {event.code} on {where}{when}: {meaning}{who}"


def boot_time() -> float:
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            return time.time() - float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time() - time.monotonic()


class KmsgReader:
    """Reads new Xid lines from the kernel log, bounded per call; never blocks."""

    def __init__(self, path: str = "/dev/kmsg", max_records: int = 20000) -> None:
        self.path = path
        self.error: str | None = None
        self._records = KmsgRecords(path, max_records)
        self._opened = False
        self._boot = boot_time()
        self.live = False  # reading the live kernel log device, which carries every Xid

    def read(self) -> list[XidEvent]:
        """Xid events logged since the previous call (the whole ring buffer the first time)."""
        if not self._opened:
            self._opened = True
            failure = self._records.open()
            if failure is not None:
                if failure.errno == errno.ENOENT and self.path == "/dev/kmsg":
                    return self._dmesg_once(failure)
                self.error = _unreadable(self.path, failure)
                return []
            self.live = self._records.live
        lines = self._records.new_lines()
        if self._records.failure is not None and self.error is None:
            self.error, self.live = _unreadable(self.path, self._records.failure), False
        return self._parse(lines)

    def _parse(self, lines: Sequence[str]) -> list[XidEvent]:
        found = []
        for line in lines:
            if not line or line.startswith(" "):  # continuation lines carry key=value props
                continue
            event = parse_kmsg_record(line, self._boot)
            if event is not None:
                found.append(event)
        return found

    def _dmesg_once(self, first: OSError) -> list[XidEvent]:
        try:
            proc = subprocess.run(
                ["dmesg"], capture_output=True, timeout=2.0, check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.error = f"{_unreadable(self.path, first)}; dmesg: {exc}"
            return []
        if proc.returncode != 0:
            why = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["failed"]
            self.error = f"{_unreadable(self.path, first)}; dmesg: {why[0]}"
            return []
        text = proc.stdout[: 4 << 20].decode("utf-8", "replace")
        return [e for e in (parse_dmesg_line(ln, self._boot) for ln in text.splitlines()) if e]

    def close(self) -> None:
        self._records.close()


def _unreadable(path: str, exc: OSError) -> str:
    if exc.errno in (errno.EPERM, errno.EACCES):
        why = "permission denied (kernel.dmesg_restrict=1: needs root or CAP_SYSLOG)"
    elif exc.errno == errno.ENOENT:
        why = "no such device (common in containers)"
    else:
        why = exc.strerror or str(exc)
    return f"kernel log unreadable: {path}: {why}"


class NvmlXidListener:
    """NVML Xid events for the devices given, drained with a short wait on each poll."""

    def __init__(self, nvml: ModuleType, handles: Sequence[tuple[int, Any]]) -> None:
        self._nvml = nvml
        self._handles = list(handles)
        self._set: Any = None
        self.error: str | None = None
        self._started = False

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        nv = self._nvml
        try:
            self._set = nv.nvmlEventSetCreate()
        except nvml_errors(self._nvml) as exc:
            self.error = f"NVML Xid events unavailable: {exc or type(exc).__name__}"
            return
        registered, why = 0, ""
        for _index, handle in self._handles:
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
                if not supported & XID_EVENT_MASK:
                    why = "not supported by this GPU"
                    continue
                nv.nvmlDeviceRegisterEvents(handle, XID_EVENT_MASK, self._set)
                registered += 1
            except nvml_errors(self._nvml) as exc:
                why = str(exc) or type(exc).__name__
        if self._handles and not registered:
            self.error = f"NVML Xid events unavailable: {why}"
            self.close()

    def poll(self, timeout_ms: int = 1, max_events: int = 16) -> list[XidEvent]:
        if self._set is None:
            return []
        events: list[XidEvent] = []
        for _ in range(max_events):
            try:
                data = self._nvml.nvmlEventSetWait(self._set, timeout_ms)
            except nvml_errors(self._nvml) as exc:
                if type(exc).__name__ != "NVMLError_Timeout":
                    self.error = f"NVML Xid events stopped: {exc or type(exc).__name__}"
                break
            if not int(data.eventType) & XID_EVENT_MASK:
                continue
            events.append(XidEvent(
                code=int(data.eventData), gpu_index=self._index_of(data.device),
                at=time.time(), source="nvml",
            ))
        return events

    def _index_of(self, device: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except nvml_errors(self._nvml):
            return None  # the event is still reported, without its GPU's index

    def close(self) -> None:
        if self._set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._set)
            except nvml_errors(self._nvml):
                pass  # letting the event set go: nothing read is lost
            self._set = None

"""Collect one rank's evidence for the bundle, in memory; every step bounded, none fatal.

The bundle writes (and redacts) the files later, once every rank's environment is known.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import rundir
from ..errors import TrainwatchError
from ..read.collectives import hookclient, nccl_state
from ..read.processes import procfacts, procfs
from ..read.stacks import pyspy
from ..read.stacks.stack_text import thread_order
from ..read.logs import ranklog
from ..snapshot import ThreadStack
from ..record import Record

FAULTHANDLER_NOT_ARMED = "faulthandler not armed: start the job with `trainwatch run` to get these"
LOG_TAIL_BYTES = 256 * 1024


@dataclass(repr=False)
class RankEvidence(Record):
    """What was collected for one rank: files (bundle-relative under ranks/<rank>/) and notes."""

    rank: int | None
    pid: int
    files: dict[str, bytes | str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what could not be collected, and why
    worked: list[str] = field(default_factory=list)  # sources that gave something
    env: dict[str, str] | None = None
    cmdline: tuple[str, ...] = ()
    faulthandler: str | None = None  # "collected" or why not
    versions: dict[str, str] = field(default_factory=dict)
    stacks: list[ThreadStack] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def note(self, text: str) -> None:
        self.notes.append(f"{self.label}: {text}")


def bounded(fn: Callable[[], Any], timeout: float) -> tuple[Any, str | None]:
    """Run ``fn`` in a daemon thread; (result, None), or (None, why) on error or timeout."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except TrainwatchError as exc:
            box["error"] = exc.message
        except Exception as exc:  # noqa: BLE001 - a probe bug must not abort the dump
            box["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=target, daemon=True, name="trainwatch-bundle-step")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, f"gave up after {timeout:g}s"
    return box.get("result"), box.get("error")


EARLY_HEADER = "# read at the job's first death, before the launcher tore the job down\n"


def format_stacks(stacks: list[ThreadStack]) -> str:
    """py-spy's view as plain text, innermost frame first; the main thread first, trainwatch's last."""
    out = []
    for thread in sorted(stacks, key=lambda t: thread_order(t.name, t.is_main)):
        flags = [f for f, on in (("main", thread.is_main), ("active", thread.active), ("gil", thread.owns_gil)) if on]
        out.append(f"Thread {thread.tid} ({thread.name})" + (f" [{', '.join(flags)}]" if flags else ""))
        for frame in thread.frames:
            where = f"{frame.file}:{frame.line}" if frame.line else frame.file
            out.append(f"    {frame.function} ({where}){' [native]' if frame.native else ''}")
        out.append("")
    return "\n".join(out)


@dataclass(frozen=True, repr=False)
class RankPlan(Record):
    """How to collect one rank: the job-wide facts each step needs."""

    pid: int
    rank: int | None
    host: str
    launcher_pid: int | None = None
    run_dir: Path | None = None
    hook_socket: Path | None = None
    log_path: str | None = None
    native: bool = True
    fault_signal: int | None = None  # the user's --signal (accepting the risk)
    debug_url: str | None = None  # dump_traceback of its torch.distributed.debug server
    step_timeout: float = 6.0
    native_timeout: float = 12.0
    early_stacks: tuple[ThreadStack, ...] = ()  # read at the job's first death (watch), before its teardown


def collect_rank(plan: RankPlan) -> RankEvidence:
    ev = RankEvidence(rank=plan.rank, pid=plan.pid)
    _proc(plan, ev)
    _stacks(plan, ev)
    _hook(plan, ev)
    _faulthandler(plan, ev)
    _debug_traceback(plan, ev)
    _settings_and_logs(plan, ev)
    return ev


def _proc(plan: RankPlan, ev: RankEvidence) -> None:
    facts = procfacts.proc_facts(plan.pid)
    if facts is None:
        ev.note(f"process {plan.pid} is gone: no /proc facts")
        return
    ev.files["proc.txt"] = facts
    ev.files["fds.txt"] = procfacts.fds_summary(plan.pid) or "unreadable\n"
    ev.env = procfacts.read_environ(plan.pid)
    ev.cmdline = procfacts.read_cmdline(plan.pid) or ()
    if ev.env is None:
        ev.note("environment unreadable (/proc/PID/environ)")


def _stacks(plan: RankPlan, ev: RankEvidence) -> None:
    stacks, why = bounded(lambda: pyspy.dump_stacks(plan.pid, native=False, timeout=plan.step_timeout),
                          plan.step_timeout + 2)
    if stacks is not None:
        ev.stacks = list(stacks)
        ev.files["stacks.txt"] = format_stacks(ev.stacks)
        ev.worked.append("py-spy")
    elif plan.early_stacks:
        ev.stacks = list(plan.early_stacks)
        ev.files["stacks.txt"] = EARLY_HEADER + format_stacks(ev.stacks)
        ev.worked.append("py-spy at the first death")
        ev.note(f"Python stacks (py-spy): {why}; these are the ones read at the job's first death")
    else:
        ev.note(f"Python stacks (py-spy): {why}")
    ev.versions = procfacts.job_versions(plan.pid, [f.file for t in ev.stacks for f in t.frames])
    if not plan.native:
        return
    native, why = bounded(lambda: pyspy.dump_stacks(plan.pid, native=True, timeout=plan.native_timeout),
                          plan.native_timeout + 2)
    if native is not None:
        ev.files["stacks-native.txt"] = format_stacks(list(native))
        ev.worked.append("py-spy --native")
    else:
        ev.note(f"native stacks (py-spy --native): {why}")


def _hook(plan: RankPlan, ev: RankEvidence) -> None:
    """Every thread's stack from the armed hook (its Flight Recorder is a collective source)."""
    if plan.hook_socket is None:
        return
    reply = hookclient.request(plan.hook_socket, "stacks", timeout=plan.step_timeout)
    if reply.ok:
        ev.files["hook-stacks.txt"] = reply.text
        ev.worked.append("hook stacks")
    else:
        ev.note(f"all-thread stacks from the hook: {reply.error}")


def _debug_traceback(plan: RankPlan, ev: RankEvidence) -> None:
    """Every thread's stack from the rank's torch.distributed.debug server, where it runs one."""
    if not plan.debug_url:
        return
    found = nccl_state.fetch_debug_handler(plan.debug_url, "dump_traceback", timeout=plan.step_timeout)
    if found.data is None:
        ev.note(f"torch.distributed.debug dump_traceback: {found.note}")
    else:
        ev.files["debug-server-traceback.txt"] = found.data
        ev.worked.append("debug-server dump_traceback")


def _faulthandler(plan: RankPlan, ev: RankEvidence) -> None:
    """Signal the rank only when it catches the signal and it is known to be faulthandler's."""
    signal_no, out_file = None, None
    if plan.run_dir is not None:
        signal_no = hookclient.faulthandler_signal(plan.run_dir)
        registered = _registered_by_hook(plan)
        if registered is not None:  # this rank's own record wins over the run-wide setting
            signal_no = registered or None
            if not registered:
                ev.faulthandler = ("not sent: this rank's hook did not register faulthandler "
                                   "(the job handles that signal itself)")
                return
        if signal_no is not None and plan.rank is not None:
            out_file = hookclient.faulthandler_file(plan.run_dir, plan.rank)
    if signal_no is None and plan.fault_signal is not None:
        signal_no = plan.fault_signal
        target = procfs.fd_target(plan.pid, 2)
        out_file = Path(target) if target and os.path.isfile(target) else None
        if out_file is None:
            ev.faulthandler = "not sent: the rank's stderr is not a regular file, the traces could not be read"
    if signal_no is None:
        ev.faulthandler = FAULTHANDLER_NOT_ARMED
    if ev.faulthandler is not None or out_file is None:
        ev.faulthandler = ev.faulthandler or "faulthandler output file unknown: not sent"
        return
    if plan.pid == plan.launcher_pid:
        ev.faulthandler = "not sent: this process is the launcher"
        return
    if signal_no not in procfs.caught_signals(plan.pid):
        ev.faulthandler = f"not sent: the rank does not catch {procfs.signal_name(signal_no)} (SigCgt)"
        return
    ev.faulthandler = _signal_and_read(plan.pid, signal_no, out_file, ev)


def _registered_by_hook(plan: RankPlan) -> int | None:
    """The signal this very process registered for faulthandler, per its hook.json: a number,
    0 when its hook registered none, None when there is no record for this PID."""
    if plan.rank is None:
        return None
    record = rundir.read_json(rundir.hook_json(plan.run_dir, plan.rank)) or {}
    if record.get("pid") != plan.pid:
        return None
    return int(record.get("faulthandler_signal") or 0)


def _signal_and_read(pid: int, signal_no: int, out_file: Path, ev: RankEvidence, wait_s: float = 3.0) -> str:
    try:
        start = out_file.stat().st_size
    except OSError:
        start = 0
    try:
        os.kill(pid, signal_no)
    except OSError as exc:
        return f"could not signal PID {pid}: {exc.strerror}"
    deadline, last, stable_since = time.monotonic() + wait_s, start, None
    while time.monotonic() < deadline:
        time.sleep(0.1)
        size = out_file.stat().st_size if out_file.exists() else 0
        if size > start and size == last:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since >= 0.3:
                break
        else:
            stable_since = None
        last = size
    if last <= start:
        return f"sent {procfs.signal_name(signal_no)} but nothing was written to {out_file} within {wait_s:g}s"
    with open(out_file, "rb") as handle:
        handle.seek(start)
        ev.files["faulthandler.txt"] = handle.read(4 * 1024 * 1024)
    ev.worked.append("faulthandler")
    return "collected"


def _settings_and_logs(plan: RankPlan, ev: RankEvidence) -> None:
    env = ev.env or {}
    ev.files["nccl-settings.txt"] = "".join(f"{k}={v}\n" for k, v in nccl_state.settings(env).items()) or \
        "(no NCCL_*, TORCH_NCCL_*, TORCH_FR_* or CUDA_* settings)\n"
    for found in nccl_state.nccl_debug_files(env, plan.pid, plan.host):
        if found.data is None:
            ev.note(found.note or "NCCL_DEBUG_FILE unreadable")
        else:
            ev.files[f"nccl-debug-{Path(found.origin or 'log').name}"] = found.data
    log = plan.log_path
    if log is None and plan.run_dir is not None and plan.rank is not None:
        candidate = hookclient.rank_log_file(plan.run_dir, plan.rank)
        log = str(candidate) if candidate.exists() else None
    if log is None:
        ev.note("no log file known (stdout/stderr is not a regular file)")
        return
    try:
        raw = nccl_state.read_capped(Path(log), LOG_TAIL_BYTES, tail=True)
    except OSError as exc:
        ev.note(f"log {log}: {exc.strerror}")
        return
    # log-tail.txt reads like the live view (no warnings, banners, NumPy complaint); the raw
    # tail is kept beside it. Both are bounded here and redacted when written.
    ev.files["log-raw.txt"] = raw
    quiet = ranklog.without_noise(raw.decode(errors="replace").splitlines())
    ev.files["log-tail.txt"] = "".join(f"{line}\n" for line in quiet)

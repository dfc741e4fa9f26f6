"""The words for values every view shows: one formatter per concept, for the live screens, the
plain ``snapshot`` table and ``summary.md`` alike (an unreadable value is always ``n/a``)."""

from __future__ import annotations

from .snapshot import FILE_SYSCALLS, ExitInfo, Job, KernelState, LogActivity, age_text

NA = "n/a"


# C0 controls, DEL and C1 controls: a newline in a peer's command line would split a one-line
# output in two, an escape sequence would drive the reader's terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))}
_CONTROLS.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def one_line(text: str) -> str:
    """``text`` with every control character escaped (``\\n``, ``\\x1b``...): one line, inert in a terminal."""
    return text.translate(_CONTROLS)


def na(value: object | None) -> str:
    """``value`` as text, or ``n/a`` when it is unknown (None or empty)."""
    return NA if value is None or value == "" else str(value)


def job_title(job: Job) -> str:
    """What the job is and where: ``torchrun pid 4046 on vm``; a ``--k8s`` job by its pods (their
    PIDs are each pod's own): ``torchrun in pods llm-master-0, llm-worker-0, llm-worker-1``."""
    if not job.pods:
        return f"{job.launcher} pid {job.pid} on {job.host}"
    names = [p.name for p in job.pods]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    what = "Kubernetes job" if job.launcher == "kubernetes" else job.launcher
    return f"{what} in pod{'s' if len(names) > 1 else ''} {shown}"


def duration(seconds: float | None) -> str:
    """``75`` -> ``1m15s``; compact enough for a table cell."""
    if seconds is None:
        return NA
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def size(num: int | None) -> str:
    """Bytes in binary units with one decimal at most: ``1.5G``."""
    if num is None:
        return NA
    value = float(num)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit in ("B", "K") or value >= 100 else f"{value:.1f}{unit}"
        value /= 1024
    return NA  # unreachable


def pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def how_ended(info: ExitInfo, alive: bool = False, short: bool = False) -> str:
    """How a rank ended. Long (sentences): ``killed by SIGSEGV``, ``exit code 1``, ``exit status
    not seen``; short (a table cell): ``SIGSEGV``, ``exit 1``, ``exited``. ``alive``: it raised an
    uncaught exception but a non-daemon thread keeps the process (``raised``)."""
    if alive:
        return "raised" if short else "raised an uncaught exception; the process is still alive"
    if info.signal:
        return info.signal if short else f"killed by {info.signal}"
    if info.code is not None:
        return f"exit {info.code}" if short else f"exit code {info.code}"
    return "exited" if short else "exit status not seen"


def log_activity(log: LogActivity | None) -> str | None:
    """``last output 19 min ago; it wrote every 10 s``, from the growth of a rank's log file
    (None when no log file is known)."""
    if log is None or log.age_s is None:
        return None
    text = f"last output {age_text(max(0.0, log.age_s))} ago"
    if log.every_s is not None:
        text += f"; it wrote every {age_text(log.every_s)}"
    elif log.bar_s is not None:
        rate = f"{log.bar_s:.3g} s/it" if log.bar_s >= 1 else f"{1 / log.bar_s:.3g} it/s"
        text += f"; its progress bar ran at {rate}"
    return text if log.own else text + " (a shared log)"


KERNEL_LETTERS = {"R": "running", "S": "sleeping", "D": "uninterruptible wait (D)", "T": "stopped (T)",
                  "t": "stopped by a tracer (t)", "Z": "zombie"}


def kernel_words(kernel: KernelState | None) -> str | None:
    """``sleeping in newfstatat() on /mnt/x (fuse on /mnt), wchan request_wait_answer`` when the
    kernel's view says something worth reading (a stop, a tracer, D, a file call); else None."""
    if kernel is None:
        return None
    notable = kernel.letter in ("D", "T", "t") or kernel.tracer or kernel.syscall in FILE_SYSCALLS
    if not notable:
        return None
    text = KERNEL_LETTERS.get(kernel.letter or "", kernel.letter or "?")
    if kernel.syscall:
        text += f" in {kernel.syscall}()" + (f" on {kernel.target}" if kernel.target else "")
    if kernel.wchan:
        text += f", wchan {kernel.wchan}"
    if kernel.tracer:
        text += f", traced by {kernel.tracer}"
    return text

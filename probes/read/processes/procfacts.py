"""Facts about one process from /proc, as text for the evidence bundle, plus the job's versions.

Every reader returns text or None; a process that exits mid-read is not an error here.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

from . import procfs

_VERSION_LINE = re.compile(r"""^(\w+)\s*(?::\s*\w+)?\s*=\s*['"]([^'"]*)['"]""", re.M)


def read_environ(pid: int) -> dict[str, str] | None:
    """The full environment the process started with; None when unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return procfs.parse_environ(raw)


def read_cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")) if raw else ()


def threads(pid: int) -> list[tuple[int, str, str | None, str | None]]:
    """(tid, name, state letter, wchan) of every thread."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    rows = []
    for tid in tids:
        name = (procfs.read_text(f"/proc/{pid}/task/{tid}/comm") or "?").strip()
        stat = procfs.read_text(f"/proc/{pid}/task/{tid}/stat")
        state = stat.rsplit(")", 1)[1].split()[0] if stat else None
        rows.append((tid, name, state, procfs.wchan(pid, tid)))
    return rows


def _socket_inodes(pid: int | None = None) -> dict[str, str]:
    """socket inode -> "tcp 127.0.0.1:29500 -> 127.0.0.1:41234 ESTABLISHED" for TCP, UDP and unix,
    in the network namespace of ``pid`` (a container's may be its own; default: ours)."""
    net = f"/proc/{pid}/net" if pid is not None else "/proc/net"
    states = {"01": "ESTABLISHED", "02": "SYN_SENT", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "0A": "LISTEN"}
    found: dict[str, str] = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        text = procfs.read_text(f"{net}/{proto}") or ""
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10:
                continue
            local, remote, state, inode = _addr(parts[1]), _addr(parts[2]), parts[3], parts[9]
            found[inode] = f"{proto} {local} -> {remote} {states.get(state, state)}"
    for line in (procfs.read_text(f"{net}/unix") or "").splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 7:
            found[parts[6]] = f"unix {parts[7] if len(parts) > 7 else '(unnamed)'}"
    return found


def socket_description(inode: str, pid: int | None = None) -> str | None:
    """``tcp 127.0.0.1:29500 -> 127.0.0.1:41234 ESTABLISHED`` for a socket inode of ``pid``, where known."""
    return _socket_inodes(pid).get(inode)


def _addr(hexaddr: str) -> str:
    host, _, port = hexaddr.partition(":")
    try:
        if len(host) == 8:
            ip = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
        else:
            ip = f"[{host}]"
        return f"{ip}:{int(port, 16)}"
    except ValueError:
        return hexaddr


def fds_summary(pid: int, limit: int = 200) -> str | None:
    """Counts of open fds by kind, then each socket, pipe and file (first ``limit``)."""
    try:
        fds = sorted(os.listdir(f"/proc/{pid}/fd"), key=int)
    except OSError as exc:
        return None if exc.errno == 2 else f"unreadable: {exc.strerror}"
    sockets = _socket_inodes(pid)
    kinds: Counter[str] = Counter()
    lines = []
    for fd in fds:
        target = procfs.fd_target(pid, int(fd)) or "?"
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        kinds[kind] += 1
        if target.startswith("socket:["):
            target = f"{target} {sockets.get(target[8:-1], '')}".rstrip()
        if len(lines) < limit:
            lines.append(f"{fd:>5} {target}")
    head = f"{len(fds)} open: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    more = [f"... {len(fds) - limit} more"] if len(fds) > limit else []
    return "\n".join([head, "", *lines, *more])


def proc_facts(pid: int) -> str | None:
    """status, wchan, threads, limits: one text file; None when the process is gone."""
    status = procfs.read_text(f"/proc/{pid}/status")
    if status is None:
        return None
    parts = [f"# /proc/{pid}/status", status.rstrip(), "",
             f"# wchan: {procfs.wchan(pid) or 'n/a'}", "",
             "# threads (tid, name, state, wchan)"]
    parts += [f"{tid:>8} {name:<20} {state or '?'} {wchan or '-'}" for tid, name, state, wchan in threads(pid)]
    limits = procfs.read_text(f"/proc/{pid}/limits")
    parts += ["", f"# /proc/{pid}/limits", (limits or "unreadable").rstrip()]
    return "\n".join(parts) + "\n"


def _maps_paths(pid: int) -> list[str]:
    text = procfs.read_text(f"/proc/{pid}/maps") or ""
    return sorted({line.split(None, 5)[5] for line in text.splitlines() if len(line.split(None, 5)) == 6})


def job_versions(pid: int, frame_files: list[str] | None = None) -> dict[str, str]:
    """Python, torch, CUDA (torch build) and NCCL versions of the process, read from its files.

    Never imports torch: the torch package is found from the libraries it has mapped (or
    the files of its stack frames) and its ``version.py`` is read as text.
    """
    found: dict[str, str] = {}
    paths = _maps_paths(pid)
    exe = None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        pass  # a kernel thread or gone: the mapped files still say
    for path in [exe or "", *paths, *(frame_files or [])]:
        match = re.search(r"python(\d+\.\d+)", path)
        if match:
            found["python"] = match.group(1)
            break
    torch_dir = None
    for path in [*paths, *(frame_files or [])]:
        match = re.match(r"(.*/torch)/(lib/libtorch|_C|__init__|distributed/)", path)
        if match and Path(match.group(1), "version.py").is_file():
            torch_dir = Path(match.group(1))
            break
    if torch_dir is not None:
        values = dict(_VERSION_LINE.findall(procfs.read_text(str(torch_dir / "version.py")) or ""))
        if values.get("__version__"):
            found["torch"] = values["__version__"]
        if values.get("cuda"):
            found["torch CUDA"] = values["cuda"]
        if values.get("git_version"):
            found["torch git"] = values["git_version"][:12]
        found["torch path"] = str(torch_dir)
    nccl = _nccl_version(paths, torch_dir)
    if nccl:
        found["NCCL"] = nccl
    return found


def loaded_nccl(pid: int) -> tuple[bool, str | None]:
    """Whether the process has libnccl mapped, and its version where the file name or the wheel
    beside it says (``libnccl.so.2.21.5``; ``nvidia_nccl_cu12-2.21.5.dist-info``)."""
    maps = procfs.read_maps(pid) or b""
    if b"/libnccl" not in maps:  # most lines of a rank's map are torch's: look only at NCCL's
        return False, None
    lines = (line.split(None, 5) for line in maps.splitlines() if b"/libnccl" in line)
    mapped = sorted({fields[5].decode(errors="replace") for fields in lines if len(fields) == 6})
    return bool(mapped), (_nccl_version(mapped, None) if mapped else None)


def _nccl_version(paths: list[str], torch_dir: Path | None) -> str | None:
    """From a mapped ``libnccl.so.2.21.5``, or the nvidia-nccl wheel's dist-info next to torch."""
    for path in paths:
        match = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)", path)
        if match:
            return match.group(1)
    roots = {str(Path(p).parents[3]) for p in paths if "/nvidia/nccl/lib/" in p}
    if torch_dir is not None:
        roots.add(str(torch_dir.parent))
    for root in roots:
        for info in Path(root).glob("nvidia_nccl_cu*-*.dist-info"):
            return info.name.removesuffix(".dist-info").split("-")[1]  # "nvidia_nccl_cu13-2.28.9.dist-info"
    return None

"""Whether a folder can take trainwatch's output, checked before any sampling, with the real reason.

``mkdir`` alone says "File exists" for a file given as the folder and "No such file or directory"
for ``/proc/x``, and only once the work is done. Here: the path, or the nearest part of it that
exists, is looked at without creating anything: a file where a folder is wanted, a kernel
filesystem (proc, sysfs, …) that takes no folders, a read-only mount, no permission.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from .errors import OutputError

MOUNTINFO = "/proc/self/mountinfo"
# Filesystems the kernel makes up: nothing of ours can be written there.
KERNEL_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs",
                                "pstore", "bpf", "configfs", "fusectl", "mqueue", "efivarfs", "binfmt_misc"})


def check_out_dir(path: Path | str, option: str = "--out", action: str = "write the bundle into") -> Path:
    """``path`` as an absolute folder that exists or can be made, and written into; raises
    :class:`OutputError` saying why not ("cannot {action} {path}: {why}"). Creates nothing."""
    path = Path(path).expanduser().absolute()
    why = _why_not(path)
    if why:
        raise OutputError(f"cannot {action} {path}: {why}", f"pass a writable folder as {option}")
    return path


def _why_not(path: Path) -> str | None:
    existing = path
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    try:
        mode = existing.stat().st_mode  # follows a link: where it points is what is written
    except OSError as exc:
        return f"{existing}: {exc.strerror}"
    if not stat.S_ISDIR(mode):
        kind = "a file" if stat.S_ISREG(mode) else "not a folder"
        return f"it is {kind}, not a folder" if existing == path else f"{existing} is {kind}, not a folder"
    fs_type = filesystem_type(existing)
    if fs_type in KERNEL_FILESYSTEMS:
        return f"{existing} is in the kernel's {fs_type} filesystem, which holds no files of ours"
    try:
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return f"{existing} is on a read-only filesystem" + (f" ({fs_type})" if fs_type else "")
    except OSError:
        pass  # statvfs refused: the access check below still tells
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"no permission to write in {existing} ({_owner(existing)})"
    return None


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` lies on (its longest mount point), from mountinfo."""
    real = os.path.realpath(path)
    best, fs_type = "", None
    try:
        with open(MOUNTINFO) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fs_type = point, right.split()[0]
    return fs_type


def _owner(path: Path) -> str:
    info = path.stat()
    try:
        name = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        name = str(info.st_uid)
    return f"owned by {name}, mode {stat.S_IMODE(info.st_mode):o}"

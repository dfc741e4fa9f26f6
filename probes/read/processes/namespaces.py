"""A process in namespaces of its own (a container: docker, podman, containerd, a Kubernetes pod,
``unshare``), seen from here.

The kernel gives such a process one PID per PID namespace it belongs to: ``NSpid`` in
``/proc/PID/status`` lists them from the namespace of the /proc mounted here down to its own. py-spy
names threads by the ID the thread has in its own namespace (``native_thread_id``), and the process
writes its own ``getpid()`` into its files: both are the innermost value. Paths the process names
(its log behind fd 1, its source files, its run directory) are in its mount namespace: from another
one they are reached through ``/proc/PID/root``.
"""

from __future__ import annotations

import os
import re
import time


_tids: dict[int, dict[int, int]] = {}  # pid -> {thread ID in its namespace: ID here}, for foreign ones
_KEPT = 4096  # processes remembered (a week-long watch of restarting jobs must not grow this forever)


def ns_ids(pid: int, tid: int | None = None) -> tuple[int, ...]:
    """The IDs of ``pid`` (or its thread ``tid``) in each PID namespace from ours inwards; () when gone."""
    field = _nspid(f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status")
    if not field:
        return ()
    return tuple(int(part) for part in field.split() if part.isdigit())


def inner_pid(pid: int) -> int | None:
    """``pid``'s PID inside its own PID namespace (what a person in its container sees), when that
    namespace is not ours; None in our namespace, or when unreadable."""
    ids = ns_ids(pid)
    return ids[-1] if len(ids) > 1 else None


def tids_here(pid: int, inner_tids: list[int | None]) -> list[int | None]:
    """The IDs here of threads of ``pid`` named by their IDs in its own PID namespace (py-spy's
    ``os_thread_id``): unchanged where the process shares our namespace; its tasks are read again
    only when a thread is new."""
    if inner_pid(pid) is None:
        return list(inner_tids)
    known = _tids.get(pid) or {}
    if any(t is not None and t not in known for t in inner_tids):
        known = _map_tasks(pid)
    return [known.get(t, t) if t is not None else None for t in inner_tids]


def _map_tasks(pid: int) -> dict[int, int]:
    mapped: dict[int, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return mapped  # gone: its threads are too
    for task in tasks:
        field = _nspid(f"/proc/{pid}/task/{task}/status")
        ids = [int(part) for part in field.split() if part.isdigit()] if field else []
        if ids:
            mapped[ids[-1]] = ids[0]
    if len(_tids) >= _KEPT:
        _tids.clear()
    _tids[pid] = mapped
    return mapped


def _nspid(status_path: str) -> str | None:
    """The ``NSpid`` field of a status file (read with the OS's own calls: once per rank per dump)."""
    try:
        fd = os.open(status_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 1 << 16).decode("ascii", "replace")
        finally:
            os.close(fd)
    except OSError:
        return None
    start = text.find("\nNSpid:\t")
    if start < 0:
        return None
    end = text.find("\n", start + 8)
    return text[start + 8:end if end >= 0 else None]


def namespace(pid: int | str, kind: str) -> str | None:
    """``pid``'s namespace of ``kind`` (``pid``, ``mnt``, ``net``, ``uts``) as the kernel names it
    (``pid:[4026531836]``); None when unreadable. ``pid`` may be ``self``."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


_FOREIGN_KEPT_S = 10.0  # a process's mount namespace is read again after this (setns is rare; PIDs are reused)
_foreign: dict[int, tuple[bool, float]] = {}


def foreign_mounts(pid: int) -> bool:
    """Whether ``pid`` sees another filesystem than we do (its own mount namespace or root)."""
    now = time.monotonic()
    known = _foreign.get(pid)
    if known is not None and now - known[1] < _FOREIGN_KEPT_S:
        return known[0]
    theirs, ours = namespace(pid, "mnt"), namespace("self", "mnt")
    foreign = theirs is not None and ours is not None and theirs != ours
    if not foreign:
        try:
            root, here = os.stat(f"/proc/{pid}/root"), os.stat("/")
            foreign = (root.st_dev, root.st_ino) != (here.st_dev, here.st_ino)
        except OSError:
            foreign = False  # gone, or not ours to look at: its paths are taken as they are
    if len(_foreign) >= _KEPT:
        _foreign.clear()
    _foreign[pid] = (foreign, now)
    return foreign


_paths: dict[tuple[int, str], tuple[str, float]] = {}
_roots: dict[str, int] = {}  # mount namespace -> the process its paths are reached through


def path_here(pid: int, path: str) -> str:
    """A path as ``pid`` names it, openable from here: unchanged where it leads to the same file
    here (our own filesystem, or one the container shares), else through ``/proc/N/root`` of one
    process of that container (the same N for all its processes, so one file keeps one name)."""
    if not path.startswith("/") or path.startswith("/proc/") or not foreign_mounts(pid):
        return path
    now = time.monotonic()
    known = _paths.get((pid, path))
    if known is not None and now - known[1] < _FOREIGN_KEPT_S:
        return known[0]
    theirs = f"/proc/{pid}/root{path}"
    try:
        there, here = os.stat(theirs), os.stat(path)
        same = (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)
    except OSError:
        same = False  # not here (or not there): only their side can name it
    if same:
        found = path
    else:
        mnt = namespace(pid, "mnt") or str(pid)
        root = _roots.get(mnt)
        if root is None or namespace(root, "mnt") != mnt:  # the one we used has gone
            root = _roots[mnt] = pid
        found = f"/proc/{root}/root{path}"
    if len(_paths) >= _KEPT:
        _paths.clear()
    _paths[(pid, path)] = (found, now)
    return found


_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def own_pod_uid() -> str | None:
    """The UID of the Kubernetes pod this process runs in, from its cgroup path (the kubelet names
    each pod's cgroup after it: ``kubepods/burstable/pod<uid>/…``, or with systemd
    ``kubepods-burstable-pod<uid with _>.slice``); None outside a pod."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as handle:
            found = _POD_UID.search(handle.read())
    except OSError:
        return None
    return found.group(1).replace("_", "-") if found else None


def boot_id() -> str | None:
    """This kernel's boot ID: the same in every container of one machine, different on another."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def node_identity(pid: int | str = "self") -> str | None:
    """What the part of a job rooted at ``pid`` is, whatever the host name of where it runs: the
    kernel's boot ID, its PID namespace, and its PID there. A pod reached twice (from inside it and
    through ``kubectl exec``) is the same; two pods of one node (a hostNetwork pod bears its node's
    name), or two jobs' launchers on one machine, are not."""
    boot, pidns = boot_id(), namespace(pid, "pid")
    if boot is None or pidns is None:
        return None
    own = os.getpid() if pid == "self" else (inner_pid(int(pid)) or int(pid))
    return f"{boot}/{pidns.removeprefix('pid:').strip('[]')}/{own}"

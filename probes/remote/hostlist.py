"""Which nodes a job spans: ``--hosts`` lists, hostfiles and SLURM nodelists, as plain names.

SLURM nodelists (``node[01-04,07],gpu-a[1-2]``) are expanded here without SLURM; when
``scontrol`` is installed, :func:`slurm_hostnames` asks it instead, since it knows every
corner of the syntax.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from ..errors import TrainwatchError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(TrainwatchError):
    """A host list, hostfile or nodelist that cannot be read."""


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``[...]``."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body: str, spec: str) -> list[str]:
    """``01-03,07`` -> ``["01", "02", "03", "07"]``, keeping zero padding."""
    values: list[str] = []
    for piece in body.split(","):
        match = _RANGE.match(piece.strip())
        if not match:
            raise HostlistError(f"bad range {piece!r} in nodelist {spec!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(first), int(last)
        if hi < lo:
            raise HostlistError(f"backwards range {piece!r} in nodelist {spec!r}")
        if hi - lo > 100_000:
            raise HostlistError(f"range {piece!r} in nodelist {spec!r} is too large")
        width = len(first) if first.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _expand_one(name: str, spec: str) -> list[str]:
    """Expand every bracket group of one name (``r[1-2]n[1-2]`` gives four names)."""
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.find("]", open_at)
    head, body, tail = name[:open_at], name[open_at + 1:close_at], name[close_at + 1:]
    return [head + value + rest for value in _expand_ranges(body, spec) for rest in _expand_one(tail, spec)]


def expand_nodelist(spec: str) -> list[str]:
    """Expand a SLURM-style nodelist: ``node[01-04,07],login`` -> names in order, no duplicates."""
    names: list[str] = []
    for part in split_top_level(spec):
        names.extend(_expand_one(part, spec))
    return unique(names)


def unique(names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    return [n for n in names if not (n in seen or seen.add(n))]


def parse_hosts(values: Iterable[str]) -> list[str]:
    """``--hosts`` values: comma-separated names, each possibly a nodelist; repeatable."""
    names: list[str] = []
    for value in values:
        names.extend(expand_nodelist(value))
    return unique(names)


def parse_hostfile_text(text: str) -> list[str]:
    """Hosts from a hostfile, in order.

    Reads one host per line in the formats people already have: plain names, DeepSpeed and
    Open MPI (``host slots=8``, ``max_slots=``), MPICH (``host:8``). ``#`` starts a comment.
    """
    names: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        host = fields[0]
        for extra in fields[1:]:
            key, sep, value = extra.partition("=")
            if not sep or not value or key not in ("slots", "max_slots", "max-slots"):
                raise HostlistError(f"hostfile line {number}: cannot read {extra!r} in {raw.strip()!r}")
        if ":" in host and not host.startswith("[") and host.count(":") == 1:
            host, _, slots = host.partition(":")  # MPICH "host:slots"
            if not slots.isdigit():
                raise HostlistError(f"hostfile line {number}: bad slot count in {raw.strip()!r}")
        names.extend(expand_nodelist(host))
    return unique(names)


def read_hostfile(path: str | Path) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise HostlistError(f"cannot read hostfile {path}: {exc.strerror or exc}") from exc
    names = parse_hostfile_text(text)
    if not names:
        raise HostlistError(f"hostfile {path} lists no hosts")
    return names


def slurm_hostnames(nodelist: str, timeout: float = 10.0) -> list[str]:
    """Expand a nodelist with ``scontrol show hostnames`` when present, else by ourselves."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                                  text=True, timeout=timeout, check=False)
            if done.returncode == 0 and done.stdout.strip():
                return unique(done.stdout.split())
        except (OSError, subprocess.TimeoutExpired):
            pass  # no answer from scontrol: expanded here instead
    return expand_nodelist(nodelist)


def slurm_job_nodelist(job_id: str, timeout: float = 10.0) -> str:
    """The NodeList of a SLURM job, from ``scontrol show job`` or, failing that, ``squeue``."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HostlistError(f"scontrol show job {job_id} failed: {exc}") from exc
        nodelist = parse_scontrol_job(done.stdout)
        if done.returncode == 0 and nodelist:
            return nodelist
        if done.returncode != 0:
            raise HostlistError(f"SLURM job {job_id}: {done.stderr.strip() or 'scontrol failed'}")
    squeue = shutil.which("squeue")
    if squeue:
        try:
            done = subprocess.run([squeue, "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HostlistError(f"squeue -j {job_id} failed: {exc}") from exc
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.split()[0]
        raise HostlistError(f"SLURM job {job_id}: {done.stderr.strip() or 'not found by squeue'}")
    raise HostlistError(f"cannot list the nodes of SLURM job {job_id}: neither scontrol nor squeue is installed",
                        remedy="run trainwatch on a node of the job, or pass --hosts")


def parse_scontrol_job(text: str) -> str | None:
    """``NodeList=node[01-02]`` from ``scontrol show job -o`` output (None when unassigned)."""
    match = re.search(r"(?:^|\s)NodeList=(\S+)", text)
    if not match or match.group(1) in ("(null)", ""):
        return None
    return match.group(1)


def slurm_running_jobs(node: str, timeout: float = 10.0) -> list[str]:
    """Ids of the running SLURM jobs that include ``node`` (``squeue -w NODE``); [] without squeue."""
    squeue = shutil.which("squeue")
    if not squeue:
        return []
    try:
        done = subprocess.run([squeue, "-h", "-t", "RUNNING", "-w", node, "-o", "%i"], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostlistError(f"squeue -w {node} failed: {exc}") from exc
    if done.returncode != 0:
        raise HostlistError(f"squeue -w {node}: {done.stderr.strip() or 'failed'}")
    return unique(done.stdout.split())

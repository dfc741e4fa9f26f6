"""Which names the job's torch reads its Flight Recorder settings under, found without importing torch.

torch 2.13 (checked in its c10d headers, FlightRecorder.hpp) reads ``TORCH_FR_BUFFER_SIZE`` and
``TORCH_FR_DUMP_TEMP_FILE`` and warns once per rank ("Environment variable
TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use TORCH_FR_BUFFER_SIZE instead") when it finds the
old ``TORCH_NCCL_*`` name set; older torch reads only the old names. So each setting is given under
exactly one name: the new one when the installed torch library holds that name, else the old one.

The job's interpreter is asked, in a bounded subprocess, where torch is installed and its version
(``importlib``: torch is located, never imported); the library file is then searched for the name.
Only the standard library is used.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .record import Record

# (the name newer torch reads, the older name it still accepts with a warning)
RENAMED = (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
           ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
PROBE_TIMEOUT_S = 10.0
LIBRARIES = ("lib/libtorch_cpu.so", "lib/libtorch_cpu.dylib", "lib/torch_cpu.dll")

_FIND_TORCH = """\
import importlib.metadata, importlib.util, json
spec = importlib.util.find_spec("torch")
try:
    version = importlib.metadata.version("torch")
except importlib.metadata.PackageNotFoundError:
    version = None
print(json.dumps({"dir": list(spec.submodule_search_locations)[0] if spec else None, "version": version}))
"""


@dataclass(frozen=True, repr=False)
class TorchInstall(Record):
    """What was found of the job's torch; ``reads_new`` maps each new name to whether torch reads it
    (None: could not tell)."""

    python: str | None = None
    version: str | None = None
    directory: str | None = None
    reads_new: dict[str, bool | None] = field(default_factory=dict)
    reason: str | None = None  # why nothing could be found

    def name_for(self, new: str, old: str) -> str:
        """The one name to set: the old one only when torch is known not to read the new one."""
        return old if self.reads_new.get(new) is False else new


def job_python(command: list[str], env: dict[str, str]) -> str | None:
    """The interpreter the command will run: itself when it is a python, else its script's
    ``#!`` line (torchrun, accelerate, deepspeed are scripts), else this interpreter."""
    if not command:
        return None
    path = shutil.which(command[0], path=env.get("PATH"))
    if path is None:
        return None
    if Path(path).name.startswith("python"):
        return path
    try:
        with open(path, "rb") as script:
            first = script.readline(512)
    except OSError:
        return sys.executable
    if not first.startswith(b"#!"):
        return sys.executable
    words = first[2:].decode(errors="replace").split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        words[:1] = [shutil.which(words[0], path=env.get("PATH")) or words[0]] if words else []
    if words and Path(words[0]).name.startswith("python"):
        return words[0]
    return sys.executable


def find_torch(python: str | None, env: dict[str, str], timeout: float = PROBE_TIMEOUT_S) -> TorchInstall:
    """Ask ``python`` where torch lives (bounded; never imports torch), then which names it reads."""
    if python is None:
        return TorchInstall(reason="no interpreter found for the command")
    clean = {k: v for k, v in env.items() if not k.startswith("TRAINWATCH_")}
    try:
        out = subprocess.run([python, "-c", _FIND_TORCH], env=clean, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        found = None
    if not found or not found.get("dir"):
        return TorchInstall(python=python, reason="torch not found by the job's interpreter")
    directory = found["dir"]
    reads = library_names(directory, [new for new, _old in RENAMED])
    return TorchInstall(python=python, version=found.get("version"), directory=directory, reads_new=reads)


def library_names(torch_dir: str, names: list[str]) -> dict[str, bool | None]:
    """For each setting name, whether torch's C++ library holds it (None: no library to look in).
    One pass over the mapped file (~0.5 s for a 400 MB library)."""
    pattern = re.compile(b"(" + b"|".join(re.escape(n.encode()) for n in names) + b")\0")
    for rel in LIBRARIES:
        path = os.path.join(torch_dir, rel)
        try:
            with open(path, "rb") as lib, mmap.mmap(lib.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found = {m.group(1).decode() for m in pattern.finditer(data)}
        except (OSError, ValueError):
            continue  # not in this torch build (or empty): the next library may name them
        return {name: name in found for name in names}
    return dict.fromkeys(names)

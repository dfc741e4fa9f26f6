"""`trainwatch snapshot` starts quickly: a command loads only what it uses (tests/bench/bench_snapshot.py
measures the time; here, what is loaded). A one-shot snapshot of a local job must not load the bundle
writer, the remote machinery, the TUI, or urllib; `trainwatch --help` still lists every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from trainwatch.probes.read.gpus.gpu_nvml import driver_present

# Loaded by a local `snapshot` before this work, none of it used by one: ~170 ms of start-up in all.
NOT_FOR_A_SNAPSHOT = ("trainwatch.probes.evidence.bundle", "trainwatch.probes.evidence.watcher",
                      "trainwatch.probes.remote.nodes", "trainwatch.probes.remote.streams",
                      "trainwatch.tui.commands.watch", "trainwatch.tui.commands.attach", "textual",
                      "urllib.request", "importlib.metadata")
# Loaded for one function or one rare case (issue 26): statistics' fractions and decimal for a median,
# pickle for the rare pickled trace, platform for the machine's name, the IDNA codec for an ASCII
# host name, psutil for a few reads of /proc; without an NVIDIA driver, NVML's bindings and ctypes.
NOR_THESE = ("statistics", "fractions", "decimal", "pickle", "platform", "encodings.idna",
             "psutil",  # discovery reads /proc itself (read/processes/proc.py); RAS's addresses load it
             "trainwatch.probes.evidence.crash_catcher")  # a one-shot snapshot watches for no death
WITHOUT_A_DRIVER = ("pynvml", "ctypes")

PROBE = """
import json, sys
from trainwatch.tui import cli
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded_by(*argv: str) -> tuple[int, set[str], str, str]:
    """The command's status, every module loaded when it returned, its stdout and its other stderr."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TRAINWATCH_EXIT_EVENTS": "0"})
    *said, last = done.stderr.strip().splitlines()
    report = json.loads(last)
    return report["code"], set(report["modules"]), done.stdout, "\n".join(said)


def test_a_snapshot_of_a_rank_loads_only_what_a_snapshot_uses():
    # a one-rank "job" (a process with torchrun's variables), sampled for real: py-spy, /proc, judgement
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        code, modules, out, said = loaded_by("snapshot", str(rank.pid), "--window", "0", "--json")
    finally:
        rank.kill()
        rank.wait()
    assert code == 0, said
    assert [r["pid"] for r in json.loads(out)["ranks"]] == [rank.pid], out
    assert "trainwatch.probes.live" in modules
    assert not modules & set(NOT_FOR_A_SNAPSHOT), sorted(modules & set(NOT_FOR_A_SNAPSHOT))
    unused = {*NOR_THESE, *(() if driver_present() else WITHOUT_A_DRIVER)}
    assert not modules & unused, sorted(modules & unused)


def test_help_still_lists_every_command():
    done = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    for command in ("snapshot", "attach", "demo", "dump", "open", "run", "watch"):
        assert f"    {command}" in done.stdout, done.stdout
    version = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "--version"], capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("trainwatch "), version

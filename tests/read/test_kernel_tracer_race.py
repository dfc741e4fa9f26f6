"""The kernel's view of a rank another shell keeps dumping with py-spy (a real process here).

Each ``py-spy dump`` stops every thread for milliseconds. A read that caught the stop (state ``t``)
but found the tracer already gone, or gone before its name was read, once made a healthy rank
"stopped by a tracer" and the job's culprit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainwatch.probes.read.processes.kernel_view import kernel_state

PY_SPY = Path(sys.executable).with_name("py-spy")


@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy not installed")
def test_a_passing_py_spy_dump_is_never_read_as_a_stopped_rank():
    # Forty idle threads: py-spy stops and lets go of each, which widens the moments a read can split.
    rank = subprocess.Popen([sys.executable, "-c", "import threading, time\nfor _ in range(40): threading.Thread("
                             "target=time.sleep, args=(120,), daemon=True).start()\nwhile True: time.sleep(0.002)"])
    stop = threading.Event()

    def dump() -> None:
        while not stop.is_set():
            subprocess.run([str(PY_SPY), "dump", "--pid", str(rank.pid)], capture_output=True, timeout=20)

    onlookers = [threading.Thread(target=dump, daemon=True) for _ in range(2)]  # two shells, one after the other
    try:
        time.sleep(0.5)
        for onlooker in onlookers:
            onlooker.start()
        seen = []
        deadline = time.monotonic() + 5  # the old reads went wrong in 2 of 3 runs of this test
        while time.monotonic() < deadline:
            state = kernel_state(rank.pid)
            seen.append((state.letter, state.tracer))
        # Held by py-spy when every look found it so is right; stopped with no tracer, or by one
        # with no name, is a read split across two moments.
        wrong = [s for s in seen if (s[0] in ("t", "T") and not (s[1] or "").startswith("py-spy"))
                 or (s[1] or "").startswith("?")]
        assert not wrong, f"{len(wrong)} of {len(seen)} reads: {wrong[:5]}"
    finally:
        stop.set()
        for onlooker in onlookers:
            onlooker.join(30)
        rank.kill()
        rank.wait(10)

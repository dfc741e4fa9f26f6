"""A rank whose own code handles the faulthandler signal is never sent it, whatever run.json says."""

from __future__ import annotations

import subprocess
import sys
import time

from trainwatch.probes import rundir
from trainwatch.probes.evidence.bundle_rank import RankEvidence, RankPlan, _faulthandler
from trainwatch.probes.read.processes import procfs

OWN_HANDLER = """
import signal, sys, time
def handler(signum, frame):
    open(sys.argv[1], "w").write("signalled")
signal.signal(signal.SIGRTMIN + 3, handler)
time.sleep(30)
"""


def test_signal_the_job_handles_itself_is_not_sent(tmp_path):
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", OWN_HANDLER, str(marker)])
    try:
        time.sleep(0.5)
        signal_no = rundir.FAULTHANDLER_SIGNAL
        assert signal_no in procfs.caught_signals(proc.pid)  # SigCgt alone would say "go"
        run_dir = tmp_path / "run"
        rundir.rank_dir(run_dir, 0).mkdir(parents=True)
        rundir.write_json(rundir.run_json(run_dir), {"faulthandler": {"signal": signal_no}})
        rundir.faulthandler_file(run_dir, 0).write_text("")
        # The hook found the signal taken and registered nothing for this PID.
        rundir.write_json(rundir.hook_json(run_dir, 0), {"rank": 0, "pid": proc.pid, "faulthandler_signal": None})
        ev = RankEvidence(rank=0, pid=proc.pid)
        _faulthandler(RankPlan(pid=proc.pid, rank=0, host="h", run_dir=run_dir), ev)
        time.sleep(0.3)
        assert not marker.exists()
        assert ev.faulthandler is not None and "did not register faulthandler" in ev.faulthandler
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()

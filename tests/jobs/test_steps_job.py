"""Steps on a real planted gloo job (`skipstep`): rank 2 does not count one step, runs on in
lockstep one behind, then stalls at its step 40 while ranks 0-1 wait in all_reduce at step 41.
Its loop also holds a secret-looking string and an int under names that are not step names."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainwatch.probes.live import LocalSource
from trainwatch.probes.read.stacks.pyspy import find_pyspy
from trainwatch.tui.planted import STALL_STEP

pytestmark = pytest.mark.job

STEP_S = 0.25
SECRETS = ("sk-secret-tw-5f3a9c", "987654321987")  # step_token and api_key in tui/planted.py
NOTE = f"rank 2 is at step {STALL_STEP} while ranks 0-1 are at step {STALL_STEP + 1}"


def snapshot_json(pid: int) -> tuple[str, str]:
    """`trainwatch snapshot --json` as a user runs it: (stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "snapshot", str(pid), "--json",
                           "--window", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout, proc.stderr


def test_steps_period_and_the_rank_left_behind(planted):
    job = planted("skipstep", nproc=3, step_s=STEP_S)
    source = LocalSource(job.pid, window=1.0, gpu=False)
    try:
        periods: list[float] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = source.poll()
            periods += [r.step_period_s for r in snap.ranks if r.step_period_s and r.step < STALL_STEP]
            # (the look that catches the stall itself may still blame the wrong side: the next one settles)
            if snap.verdict.kind == "straggler" and snap.verdict.culprits == (2,) and NOTE in snap.verdict.summary \
                    and snap.warnings:
                break
            time.sleep(0.5)
        ranks = {r.rank: r for r in snap.ranks}
        assert [ranks[n].step for n in (0, 1, 2)] == [STALL_STEP + 1, STALL_STEP + 1, STALL_STEP], snap.ranks
        assert snap.verdict.culprits == (2,) and NOTE in snap.verdict.summary, snap.verdict
        # Time per step while the job ran: the planted sleep plus a little work and all_reduce (the
        # band allows for reads timed to a few tens of ms; not dividing by the steps between reads
        # would give 2x and more).
        assert periods, "no step period was measured before the stall"
        assert all(0.6 * STEP_S <= p <= 1.6 * STEP_S for p in periods), periods
        assert all(0.6 * STEP_S <= ranks[n].step_period_s <= 1.6 * STEP_S for n in (0, 1, 2))
        slow = [w for w in snap.warnings if w.startswith(f"rank 2: step {STALL_STEP} has taken ")]
        assert slow and "its usual" in slow[0], snap.warnings
        assert not any(w.startswith(("rank 0:", "rank 1:")) for w in snap.warnings), snap.warnings
    finally:
        source.close()

    # The CLI, on the stalled job: per-rank steps in the JSON, and no other local anywhere in it.
    out, err = snapshot_json(job.pid)
    data = json.loads(out)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert [ranks[n]["step"] for n in (0, 1, 2)] == [STALL_STEP + 1, STALL_STEP + 1, STALL_STEP], data["ranks"]
    assert NOTE in data["verdict"]["summary"], data["verdict"]
    raw = subprocess.run([find_pyspy(), "dump", "--locals", "--pid", str(job.rank_pids()[0])],  # all ranks hold them
                         capture_output=True, text=True, timeout=30).stdout
    assert all(secret in raw for secret in SECRETS), "control: py-spy itself shows the planted locals"
    assert not any(secret in out + err for secret in SECRETS)

"""`trainwatch open` on the layouts real dead jobs leave: Flight Recorder dumps beside torchrun's
`--log-dir` folders (`--redirects`) or its `--tee`'d output, and two runs' dumps in one folder.
The rank the others waited for that left nothing (SIGTERMed by torchrun before it could dump)
is the culprit; the odd rank varies, rank 0 included. Files of two runs are refused, each run's
files named."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from real_jobs import PLANTED, TORCHRUN, free_port
from watching import TRAINWATCH

pytestmark = [pytest.mark.job, pytest.mark.slow]
FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}


def run_to_its_end(workdir: Path, launcher_args: list[str], job_args: list[str], dumps: Path,
                   nproc: int = 4, timeout: float = 120) -> Path:
    """A planted job under torchrun, run until it dies; torchrun's own output goes to launcher.log."""
    shutil.copy(PLANTED, workdir / "train.py")
    dumps.mkdir(parents=True, exist_ok=True)
    cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), *launcher_args,
           str(workdir / "train.py"), "--deadline", "60", *job_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **FR_ENV,
           "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "nccl_trace_rank_")}
    log = workdir / "launcher.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return log


def opened(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAINWATCH, "open", *map(str, paths), "--json"], capture_output=True, text=True,
                          timeout=60)


def verdict_of(*paths: Path) -> dict:
    out = opened(*paths)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["verdict"]


STRAGGLER = ["--scenario", "straggler", "--timeout", "6", "--dump-on-error"]


def test_dumps_beside_a_log_dir_folder_name_rank_0_which_left_nothing(tmp_path):
    """Rank 0 sleeps in its own work; ranks 1-2 time out in all_reduce and dump; torchrun SIGTERMs
    rank 0. Its own logs lie in logs/<run id>/attempt_0/0/ and say nothing of where it was."""
    run_to_its_end(tmp_path, ["--log-dir", str(tmp_path / "logs"), "--redirects", "3"], [*STRAGGLER, "--culprit", "0"],
                   dumps=tmp_path, nproc=3)
    assert sorted(p.name for p in tmp_path.glob("nccl_trace_rank_*")) == [f"nccl_trace_rank_{n}" for n in (1, 2)]
    found = verdict_of(tmp_path)
    assert found["kind"] == "straggler" and found["culprits"] == [0], found
    assert found["summary"].startswith("rank 0 left no record of where it was"), found


def test_dumps_in_a_folder_beside_teed_output_name_the_rank_that_left_nothing(tmp_path):
    """`--tee 3`: the ranks' lines are in torchrun's own output, `[default<N>]:` first."""
    log = run_to_its_end(tmp_path, ["--log-dir", str(tmp_path / "logs"), "--tee", "3"], [*STRAGGLER, "--culprit", "2"],
                         dumps=tmp_path / "dumps", nproc=3)
    assert "[default1]:" in log.read_text()
    found = verdict_of(log, tmp_path / "dumps")
    assert found["kind"] == "straggler" and found["culprits"] == [2], found
    assert verdict_of(tmp_path)["culprits"] == [2]  # the whole folder: the same logs twice over, one run


def test_two_runs_dumps_in_one_folder_are_refused_and_each_judged_alone(tmp_path):
    """Run a runs ~12 s of collectives; run b starts 4 s later. Their dumps' spans overlap, their
    world size and groups are the same: at one moment they were hundreds of collectives apart."""
    args = ["--scenario", "straggler", "--fail-step", "300", "--step-s", "0.02", "--timeout", "10",
            "--dump-on-error", "--culprit", "2"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = threading.Thread(target=run_to_its_end, args=(tmp_path / "a", [], args, tmp_path / "a"),
                            kwargs={"nproc": 3})
    done.start()
    time.sleep(4.0)
    run_to_its_end(tmp_path / "b", [], args, tmp_path / "b", nproc=3)
    done.join(120)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("nccl_trace_rank_0", "nccl_trace_rank_1"):
        shutil.copy(tmp_path / "a" / name, mixed / name)
    shutil.copy(tmp_path / "b" / "nccl_trace_rank_1", mixed / "nccl_trace_rank_2")
    out = opened(mixed)
    assert out.returncode == 7 and "Traceback" not in out.stderr, out.stderr
    assert "2 different runs" in out.stderr and "nccl_trace_rank_2" in out.stderr and "nccl_trace_rank_0" in out.stderr
    for run in ("a", "b"):
        found = verdict_of(tmp_path / run)
        assert found["culprits"] == [2], (run, found)

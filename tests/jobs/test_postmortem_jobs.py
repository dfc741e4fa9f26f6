"""`trainwatch open` on what real dead jobs left: dumps, logs, a `trainwatch run` directory.

Each job is a real torchrun gloo job that dies by itself (a collective timeout, an exception, a
`timeout` kill); its files are then judged like a live job, and PyTorch's own analyser
(`torchfrtrace`) is run on the same dumps, both answers printed side by side.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_jobs import PLANTED, TORCHRUN, default_signals, free_port

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
pytestmark = pytest.mark.job


def planted_cmd(workdir: Path, scenario: str, *extra: str, nproc: int = 3, deadline: float = 40) -> list[str]:
    shutil.copy(PLANTED, workdir / "train.py")
    return [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), str(workdir / "train.py"),
            "--scenario", scenario, "--deadline", str(deadline), *extra]


def run_dead(workdir: Path, cmd: list[str], env: dict[str, str] | None = None, timeout: float = 90) -> Path:
    """Run a job to its end; its output goes to job.log (as `torchrun … > job.log 2>&1`)."""
    import os

    log = workdir / "job.log"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return log


def tw_open(*paths: Path, fmt: str = "--json") -> subprocess.CompletedProcess:
    return subprocess.run([*TRAINWATCH, "open", *map(str, paths), fmt], capture_output=True, text=True, timeout=60)


def verdict_of(*paths: Path) -> dict:
    out = tw_open(*paths)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def side_by_side(name: str, snapshot: dict, dumps: Path | list[Path]) -> None:
    from anchor import run_torchfrtrace  # tests/anchor.py: PyTorch's own analyser, run as a user would

    anchor = run_torchfrtrace(dumps)
    verdict = snapshot["verdict"]
    print(f"\n[{name}] trainwatch: {verdict['kind']} culprits {verdict['culprits']}: {verdict['summary']}")
    print(f"[{name}] {anchor.line()}")


def last_words_dumps(run_dir: Path, into: Path) -> list[Path]:
    """Each rank's generic Flight Recorder from its last words, as the JSON dump files it holds
    (what torchfrtrace can be given)."""
    into.mkdir(parents=True, exist_ok=True)
    files = []
    for path in sorted(run_dir.glob("ranks/*/last-words.json")):
        words = json.loads(path.read_text())
        fr = json.loads(words["fr"]) if words.get("fr") else {}
        if fr.get("generic"):
            files.append(into / f"rank_{words['rank']}.json")
            files[-1].write_text(fr["generic"])
    return files


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory) -> Path:
    """Rank 2 calls all_gather where ranks 0-1 call all_reduce; gloo times out after 5 s, each rank
    dumps its generic Flight Recorder (as NCCL does on a timeout) and dies; torchrun tears down."""
    workdir = tmp_path_factory.mktemp("mismatch")
    dumps = workdir / "dumps"
    dumps.mkdir()
    run_dead(workdir, planted_cmd(workdir, "mismatch", "--timeout", "5", "--dump-on-error"),
             env={"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "nccl_trace_rank_")})
    assert sorted(p.name for p in dumps.iterdir()) == [f"nccl_trace_rank_{n}" for n in range(3)]
    return workdir


def test_mismatch_from_dumps_and_logs(mismatch):
    found = verdict_of(mismatch)
    assert found["verdict"]["kind"] == "mismatch" and found["verdict"]["culprits"] == [2], found["verdict"]
    assert "rank 2 enqueued all_gather #" in found["verdict"]["summary"]
    assert "ranks 0-1 enqueued all_reduce" in found["verdict"]["summary"]
    side_by_side("mismatch", found, mismatch / "dumps")


def test_mismatch_from_the_dumps_alone(mismatch):
    found = verdict_of(mismatch / "dumps")
    assert (found["verdict"]["kind"], found["verdict"]["culprits"]) == ("mismatch", [2]), found["verdict"]


def test_mismatch_from_the_log_alone(mismatch, tmp_path):
    """No dump at all: each rank's traceback (the timeout it died of) shows where it waited."""
    shutil.copy(mismatch / "job.log", tmp_path / "job.log")
    found = verdict_of(tmp_path / "job.log")
    assert (found["verdict"]["kind"], found["verdict"]["culprits"]) == ("mismatch", [2]), found["verdict"]
    assert "all_gather" in found["verdict"]["summary"] and "sync_metrics" in found["verdict"]["summary"]


def test_rank_zero_innocent_is_not_named(mismatch, tmp_path):
    """The first file torchfrtrace reads is its reference; trainwatch takes no rank as the reference.
    The same real dumps, renumbered so that the odd rank is rank 0."""
    for old, new in ((2, 0), (0, 1), (1, 2)):
        shutil.copy(mismatch / "dumps" / f"nccl_trace_rank_{old}", tmp_path / f"nccl_trace_rank_{new}")
    found = verdict_of(tmp_path)
    assert (found["verdict"]["kind"], found["verdict"]["culprits"]) == ("mismatch", [0]), found["verdict"]
    for old, new in ((0, 0), (1, 1), (2, 2)):
        shutil.copy(mismatch / "dumps" / f"nccl_trace_rank_{old}", tmp_path / f"nccl_trace_rank_{new}")
    found = verdict_of(tmp_path)
    assert 0 not in found["verdict"]["culprits"] and found["verdict"]["culprits"] == [2], found["verdict"]


def test_two_jobs_mixed_are_refused(mismatch, tmp_path):
    """Dumps of this run beside the recorded gloo dumps of another: refused, the files named."""
    for n in range(3):
        shutil.copy(mismatch / "dumps" / f"nccl_trace_rank_{n}", tmp_path / f"nccl_trace_rank_{n}")
    shutil.copy(Path(__file__).parents[1] / "fixtures/fr/gloo-2.13/mismatch/rank0.pkl", tmp_path / "old_rank_5.pkl")
    out = tw_open(tmp_path)
    assert out.returncode == 7 and "Traceback" not in out.stderr, out.stderr
    assert "different runs" in out.stderr and "old_rank_5.pkl" in out.stderr and "nccl_trace_rank_0" in out.stderr


def test_damaged_dump_is_named_and_the_rest_judged(mismatch, tmp_path):
    """Rank 1's dump cut in half: it is named, and with one rank on each side of the disagreement
    left, nobody is blamed (never a coin toss)."""
    for n in range(3):
        data = (mismatch / "dumps" / f"nccl_trace_rank_{n}").read_bytes()
        (tmp_path / f"nccl_trace_rank_{n}").write_bytes(data[: len(data) // 2] if n == 1 else data)
    found = verdict_of(tmp_path)
    assert any("rank 1's Flight Recorder dump" in n and "damaged" in n for n in found["notes"]), found["notes"]
    assert (found["verdict"]["kind"], found["verdict"]["culprits"]) == ("mismatch", []), found["verdict"]
    assert "ranks disagree at #" in found["verdict"]["summary"]


@pytest.fixture(scope="module")
def early_exit(tmp_path_factory) -> Path:
    """Rank 2 raises at step 3; torchrun tears the others down with SIGTERM."""
    workdir = tmp_path_factory.mktemp("raise")
    run_dead(workdir, planted_cmd(workdir, "raise"))
    return workdir


def test_rank_that_exits_early_and_the_teardown(early_exit):
    found = verdict_of(early_exit / "job.log")
    verdict = found["verdict"]
    assert (verdict["kind"], verdict["culprits"]) == ("crashed", [2]), verdict
    assert "RuntimeError: planted failure at step 3" in verdict["summary"]
    by_rank = {r["rank"]: r for r in found["ranks"]}
    assert by_rank[0]["exit"]["signal"] == "SIGTERM" and by_rank[2]["exit"]["code"] == 1


def test_h100_on_timeout_dump_is_read():
    """A real NCCL on-timeout dump (H100, torch 2.11, one rank): its pending all_reduce is named."""
    found = verdict_of(Path(__file__).parents[1] / "fixtures/fr/h100/on-timeout-dump-rank0.pickle")
    assert found["verdict"]["kind"] == "hang" and "all_reduce #785" in found["verdict"]["summary"], found["verdict"]
    side_by_side("h100 on-timeout", found, [Path(__file__).parents[1] / "fixtures/fr/h100/on-timeout-dump-rank0.pickle"])


def test_h100_watchdog_log_is_read():
    """A real NCCL watchdog timeout in a rank's output (H100, torch 2.11): the collective and its number."""
    found = verdict_of(Path(__file__).parents[1] / "fixtures/logs/nccl-watchdog-timeout-rank0-output.log")
    verdict = found["verdict"]
    assert verdict["kind"] == "hang" and "all_reduce #861" in verdict["summary"], verdict
    assert "NCCL watchdog timeout" in verdict["summary"] and "pending" not in verdict["summary"], verdict


def test_bad_input(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tw_open(empty)
    assert out.returncode == 7 and "nothing a training job leaves was found" in out.stderr
    assert "Traceback" not in out.stderr
    missing = tw_open(tmp_path / "nope")
    assert missing.returncode == 7 and "no such file or folder" in missing.stderr
    many = tmp_path / "many"
    for n in range(100):
        folder = many / f"d{n}"
        folder.mkdir(parents=True)
        for m in range(100):
            (folder / f"notes_{m}.txt").write_text("nothing to see here\n")
    started = time.monotonic()
    out = tw_open(many)
    took = time.monotonic() - started
    assert out.returncode == 7 and "among 10,100 files" in out.stderr, out.stderr
    assert took < 20, took


@pytest.fixture(scope="module")
def killed_straggler(tmp_path_factory) -> Path:
    """Armed by `trainwatch run`: rank 2 sleeps at step 3 while ranks 0-1 wait in all_reduce; then
    the job is stopped as a launcher or SLURM does (SIGTERM to `trainwatch run`, passed on to
    torchrun, which SIGTERMs its ranks). Returns the run directory."""
    from real_jobs import rank_stuck_at

    workdir = tmp_path_factory.mktemp("killed")
    run_dir = workdir / "run"
    cmd = [*TRAINWATCH, "run", "--out", str(run_dir), "--", *planted_cmd(workdir, "straggler")]
    stop_once_hung(workdir, cmd, lambda: rank_stuck_at(workdir / "train.py", "# stuck in its own work"),
                   "the straggler", settle_s=1.0)  # the others are in all_reduce 1 s later
    return run_dir


def stop_once_hung(workdir: Path, cmd: list[str], hung, what: str, settle_s: float = 0.0) -> None:
    """Run ``cmd`` (output to job.log) until ``hung()`` holds, then SIGTERM it, as a launcher, SLURM
    or `timeout` does, and wait for its end; whatever is left is killed."""
    import os

    from real_jobs import wait_until

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(workdir / "job.log", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=default_signals)
        try:
            wait_until(hung, 60, what)
            time.sleep(settle_s)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_straggler_killed_by_sigterm_from_its_last_words(killed_straggler):
    for rank in range(3):
        words = json.loads((killed_straggler / "ranks" / str(rank) / "last-words.json").read_text())
        assert words["trigger"] == "SIGTERM", words
    found = verdict_of(killed_straggler)
    verdict = found["verdict"]
    assert (verdict["kind"], verdict["culprits"]) == ("straggler", [2]), verdict
    assert "rank 2 is in sleep" in verdict["summary"] and "all_reduce" in verdict["summary"], verdict
    assert "killed by SIGTERM" in verdict["summary"]
    side_by_side("straggler, SIGTERM", found, last_words_dumps(killed_straggler, killed_straggler.parent / "fr"))
    summary = tw_open(killed_straggler, fmt="--summary").stdout
    groups = summary.split("## Stack groups", 1)[1].split("###", 1)[0]
    # Each rank grouped by where its last words put it; only the straggler's group is the culprit.
    assert "- ranks 0-1: SIGTERM in all_reduce (exited) at `train.py:" in groups, groups
    assert groups.count("(culprit") == 1 and "- rank 2: SIGTERM in sleep (exited)" in groups, groups
    stack = summary.split("### Stack of culprit rank 2", 1)[1].split("```")[1]
    headers = [line for line in stack.splitlines() if "(most recent call first)" in line]
    assert '"MainThread"' in headers[0] and all('"trainwatch-' not in h for h in headers[:2]), stack  # job first
    assert '"trainwatch-' in headers[-1], stack


def test_the_rank_that_never_dumped_is_named(killed_straggler, tmp_path):
    """The usual NCCL case: the culprit left nothing. The others' last words say the job had 3
    ranks and both wait in all_reduce: the missing rank is the one they waited for."""
    copy = tmp_path / "run"
    shutil.copytree(killed_straggler, copy, ignore=shutil.ignore_patterns("*.sock"))
    shutil.rmtree(copy / "ranks" / "2")
    found = verdict_of(copy)
    verdict = found["verdict"]
    assert (verdict["kind"], verdict["culprits"]) == ("straggler", [2]), verdict
    assert "rank 2 is missing" in verdict["summary"], verdict
    assert any("rank 2 left nothing here" in note for note in found["notes"]), found["notes"]
    side_by_side("culprit left nothing", found, last_words_dumps(copy, tmp_path / "fr"))


def test_a_job_killed_by_timeout_leaves_every_ranks_last_words(tmp_path):
    """`timeout -s TERM … trainwatch run -- torchrun … mismatch`: the whole job is stopped while hung.
    The stop comes once rank 2 sits in its all_gather (GNU timeout passes the SIGTERM it gets on to
    its command, as when it fires): a fixed 15 s stopped a job still starting on a loaded machine."""
    from real_jobs import rank_stuck_at

    run_dir = tmp_path / "run"
    cmd = ["timeout", "-s", "TERM", "60", *TRAINWATCH, "run", "--out", str(run_dir), "--",
           *planted_cmd(tmp_path, "mismatch", deadline=60)]
    stop_once_hung(tmp_path, cmd, lambda: rank_stuck_at(tmp_path / "train.py", "dist.all_gather(gathered, loss.detach())"),
                   "rank 2 in its all_gather")
    for rank in range(3):
        words = json.loads((run_dir / "ranks" / str(rank) / "last-words.json").read_text())
        assert words["trigger"] == "SIGTERM" and "Thread" in words["stacks"], rank
    found = verdict_of(run_dir)
    assert (found["verdict"]["kind"], found["verdict"]["culprits"]) == ("mismatch", [2]), found["verdict"]
    assert "all_gather" in found["verdict"]["summary"]
    side_by_side("mismatch, killed by timeout", found, last_words_dumps(run_dir, tmp_path / "fr"))

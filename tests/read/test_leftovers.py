"""Finding what a dead job left: layouts, damaged files, bounds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainwatch.probes.errors import BadLeftovers
from trainwatch.probes.read.logs.leftovers import read_leftovers

DEAD = Path(__file__).parents[1] / "fixtures" / "dead" / "gloo-2.13-mismatch"


def test_dumps_and_a_shared_log_by_rank():
    found = read_leftovers([DEAD])
    assert sorted(found.ranks) == [0, 1, 2] and found.world_size == 3
    assert all(len(found.ranks[n].dumps) == 1 for n in range(3))
    assert any("Timed out" in line for line in found.ranks[2].lines)
    assert found.launcher_pid == 28260 and {f.rank for f in found.failures} == {0, 1, 2}


def test_log_dir_layout_and_error_files(tmp_path):
    """torchrun --log-dir: attempt_0/<local rank>/stderr.log is that rank's own log; error.json its error."""
    folder = tmp_path / "run-id" / "attempt_0" / "1"
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text("Traceback (most recent call last):\n  File \"/job/t.py\", line 3, in f\n"
                                       "RuntimeError: boom\n")
    (folder / "error.json").write_text(json.dumps({"message": {"message": "RuntimeError: boom"}}))
    found = read_leftovers([tmp_path])
    assert found.ranks[1].own_log and found.ranks[1].error_file == "RuntimeError: boom"


def test_a_json_file_that_is_not_a_dump_is_not_called_damaged(tmp_path):
    (tmp_path / "config_3.json").write_text('{"lr": 0.1}')
    shutil.copy(DEAD / "nccl_trace_rank_0", tmp_path)
    found = read_leftovers([tmp_path])
    assert sorted(found.ranks) == [0] and not found.ranks[0].notes


def test_bounded_walk_says_it_stopped(tmp_path):
    for n in range(50):
        (tmp_path / f"f{n}.bin").write_bytes(b"\0")
    shutil.copy(DEAD / "nccl_trace_rank_0", tmp_path / "z_nccl_trace_rank_0")
    with pytest.raises(BadLeftovers, match=r"among 21 files .*stopped looking after 20 files"):
        read_leftovers([tmp_path], max_entries=20)


def test_srun_labelled_output_is_split_by_task(tmp_path):
    """`srun --label` prefixes each line with its task number (written here, not recorded)."""
    (tmp_path / "slurm-4242.out").write_text(
        "0: step 10\n1: step 10\n1: Traceback (most recent call last):\n"
        '1:   File "/job/train.py", line 9, in main\n1: RuntimeError: boom\n0: step 11\n')
    found = read_leftovers([tmp_path])
    assert sorted(found.ranks) == [0, 1]
    assert found.ranks[1].lines[-1] == "RuntimeError: boom" and "step 11" in found.ranks[0].lines


def test_a_fatal_signal_dump_in_a_shared_log_gives_the_ranks_last_stack(tmp_path):
    """faulthandler's output in the job's log (`python -X faulthandler`, torchrun's `[rank2]:` prefix):
    the rank's last stack is where it crashed."""
    from trainwatch.probes.evidence.postmortem import PostMortemSource

    dump = ["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f0000000002 (most recent call first):",
            '  File "/job/train.py", line 116 in train', '  File "/job/train.py", line 143 in main', ""]
    (tmp_path / "job.log").write_text("".join(f"[rank2]:{line}\n" for line in dump)
                                      + "[rank0]:step 3\n[rank1]:step 3\n")
    snapshot = PostMortemSource([tmp_path]).snapshot
    crashed = snapshot.rank(2)
    assert crashed.where == "train.py:116 train" and crashed.exit.signal == "SIGSEGV", crashed
    assert snapshot.verdict.kind == "crashed" and snapshot.verdict.culprits == (2,), snapshot.verdict


LOG_DIR = Path(__file__).parents[1] / "fixtures" / "dead" / "gloo-2.13-log-dir-straggler"


def test_dumps_beside_a_log_dir_folder_are_read_with_each_ranks_own_lines():
    """torchrun --log-dir --redirects: each rank's own stderr (its [rankN]: traceback, prefix
    stripped), the dumps beside it, the launcher's failure summary; rank 3 left only its empty logs."""
    found = read_leftovers([LOG_DIR])
    assert sorted(found.ranks) == [0, 1, 2, 3] and found.world_size == 4
    assert [len(found.ranks[n].dumps) for n in range(4)] == [1, 1, 1, 0]
    assert found.ranks[0].own_log.endswith("attempt_0/0/stderr.log") or found.ranks[0].own_log.endswith("stdout.log")
    assert any(line.startswith("Traceback (most recent call last):") for line in found.ranks[0].lines)
    assert not any(line.startswith("[rank") for line in found.ranks[0].lines)


def test_two_torchrun_run_folders_are_two_runs(tmp_path):
    for run in ("run-a", "run-b"):
        folder = tmp_path / run / "attempt_0" / "0"
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text("[rank0]: Traceback (most recent call last):\n[rank0]: RuntimeError: x\n")
    with pytest.raises(BadLeftovers) as refused:
        read_leftovers([tmp_path])
    assert "2 different torchrun runs" in str(refused.value) and "run-a" in str(refused.value)


def trace(first_s: float, count: int, period_s: float) -> dict:
    """A generic Flight Recorder trace of ``count`` all_reduces, one every ``period_s`` from ``first_s``."""
    entries = [{"record_id": n, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": n + 1,
                "profiling_name": "gloo:all_reduce", "time_created_ns": int((first_s + n * period_s) * 1e9),
                "input_sizes": [[4]], "input_dtypes": ["Float"], "state": "scheduled", "retired": True,
                "is_p2p": False} for n in range(count)]
    return {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
            "pg_status": {"0": {"last_enqueued_collective": count, "last_completed_collective": count - 1}},
            "entries": entries}


def write_dumps(folder: Path, traces: dict[int, dict]) -> None:
    import pickle
    folder.mkdir(parents=True, exist_ok=True)
    for rank, body in traces.items():
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(body))


def test_overlapping_dumps_of_two_runs_are_told_apart_by_their_numbering(tmp_path):
    """Both runs busy between 1.7e9+10 s and +20 s, same size and group: at one moment one run
    had enqueued hundreds of collectives more than the other."""
    start = 1.7e9
    write_dumps(tmp_path, {0: trace(start, 600, 0.03), 1: trace(start, 600, 0.03), 2: trace(start + 5, 600, 0.03)})
    with pytest.raises(BadLeftovers) as refused:
        read_leftovers([tmp_path])
    text = str(refused.value)
    assert "2 different runs" in text and "nccl_trace_rank_2" in text and "had enqueued collective #" in text


def test_two_runs_that_began_their_collectives_apart(tmp_path):
    start = 1.7e9
    write_dumps(tmp_path, {0: trace(start, 20, 5.0), 1: trace(start + 60, 20, 5.0)})  # slow steps, 60 s apart
    with pytest.raises(BadLeftovers) as refused:
        read_leftovers([tmp_path])
    assert "began its first collective" in str(refused.value)


def test_one_runs_ranks_a_step_apart_are_one_run(tmp_path):
    start = 1.7e9
    write_dumps(tmp_path, {0: trace(start, 600, 0.03), 1: trace(start + 0.02, 599, 0.03), 2: trace(start, 600, 0.03)})
    found = read_leftovers([tmp_path])
    assert sorted(found.ranks) == [0, 1, 2]


def test_a_restarted_runs_attempts_are_read_in_order(tmp_path):
    """attempt_10 after attempt_9 after attempt_1: the rank's latest words are its last attempt's."""
    for attempt in (1, 9, 10):
        folder = tmp_path / "run-id" / f"attempt_{attempt}" / "2"
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(f"[rank2]: Traceback (most recent call last):\n[rank2]:   File "
                                           f"\"/job/t.py\", line 3, in f\n[rank2]: ValueError: attempt {attempt}\n")
    from trainwatch.probes.read.logs.ranklog import reason_of
    found = read_leftovers([tmp_path])
    assert reason_of(found.ranks[2].lines).message == "ValueError: attempt 10"


def test_two_launchers_giving_one_rank_two_processes_are_two_runs(tmp_path):
    text = (DEAD / "job.log").read_text()
    (tmp_path / "job.log").write_text(text)
    pids = sorted(set(__import__("re").findall(r"\(pid: (\d+)\)", text)))
    for pid in pids:
        text = text.replace(pid, str(int(pid) + 1000))
    (tmp_path / "job-requeued.log").write_text(text)
    with pytest.raises(BadLeftovers) as refused:
        read_leftovers([tmp_path])
    assert "2 different runs" in str(refused.value) and "job-requeued.log" in str(refused.value)

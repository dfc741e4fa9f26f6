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

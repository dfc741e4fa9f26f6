"""A rank's own lines in a log, and why they say it died: on real logs recorded on an H100."""

from __future__ import annotations

from pathlib import Path

from trainwatch.probes.read.logs import ranklog
from trainwatch.probes.read.logs.ranklog import RankLogs, rank_lines, reason_of, split_prefix, telling_tail

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
ASSERT_LOG = LOGS / "device-side-assert-torchrun-2ranks.log"  # torchrun ... > log 2>&1, two ranks
DUPLICATE_LOG = LOGS / "nccl-duplicate-gpu-2ranks.log"
WATCHDOG_LOG = LOGS / "nccl-watchdog-timeout-rank0-output.log"  # one rank's own output


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_prefixes_name_the_rank():
    assert split_prefix("[rank1]: Traceback (most recent call last):") == (1, None, "Traceback (most recent call last):")
    assert split_prefix("[rank0]:[W1122 12:22:33.27 ProcessGroupNCCL.cpp:1575] Warning") == \
        (0, None, "[W1122 12:22:33.27 ProcessGroupNCCL.cpp:1575] Warning")
    assert split_prefix("[default3]:step 10") == (None, 3, "step 10")  # torchrun --tee: role + local rank
    assert split_prefix("[trainer1]:[rank9]: boom") == (9, 1, "boom")  # stacked: tee, then torch
    assert split_prefix("[12]:hello") == (12, None, "hello")  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[${rank}]:
    assert split_prefix("[W1122 12:19:42.392000 1109 torch/distributed/run.py:851] x")[:2] == (None, None)
    assert split_prefix("step 20") == (None, None, "step 20")


def test_unprefixed_lines_belong_to_a_rank_only_in_its_own_file():
    lines = ["step 1", "[rank1]: Traceback (most recent call last):", "[default0]:hello", "[rank0]: x"]
    assert rank_lines(lines, 1, 1, own=False) == ["Traceback (most recent call last):"]
    assert rank_lines(lines, 1, 1, own=True) == ["step 1", "Traceback (most recent call last):"]
    assert rank_lines(lines, 0, 0, own=False) == ["hello", "x"]
    assert rank_lines(lines, 5, 1, own=False, unprefixed=True) == ["step 1"]


def test_device_side_assert_is_rank_1s_and_not_rank_0s():
    lines = lines_of(ASSERT_LOG)
    found = reason_of(rank_lines(lines, 1, 1, own=False))
    assert found.reason == "CUDA device-side assert" and found.raised
    assert found.message == "torch.AcceleratorError: CUDA error: device-side assert triggered"
    assert found.frame == "job/gpujob.py:60 main"
    # rank 0 has its own traceback in the file: its reason is its own (the peer went away) ...
    zero = reason_of(rank_lines(lines, 0, 0, own=False))
    assert zero.reason == "a peer rank closed its connection" and "Connection closed by peer" in zero.message
    # ... and without lines of its own, rank 0 gets nothing of rank 1's (nor torchrun's) words
    without_rank0 = [line for line in lines if not line.startswith("[rank0]")]
    assert reason_of(rank_lines(without_rank0, 0, 0, own=False)) is None


def test_torchruns_own_traceback_is_never_a_ranks_exception():
    # A one-rank job whose file also holds torchrun's ChildFailedError report.
    lines = [line for line in lines_of(ASSERT_LOG) if not line.startswith("[rank")]
    assert reason_of(rank_lines(lines, 0, 0, own=True)) is None


def test_duplicate_gpu_is_classified():
    lines = lines_of(DUPLICATE_LOG)
    for rank in (0, 1):
        found = reason_of(rank_lines(lines, rank, rank, own=False))
        assert found.reason == "NCCL: duplicate GPU (two ranks on one device)", found
        assert found.message.startswith(f"Duplicate GPU detected : rank {rank} and rank {1 - rank}")


def test_watchdog_timeout_is_classified():
    found = reason_of(rank_lines(lines_of(WATCHDOG_LOG), 0, 0, own=True))
    assert found.reason == "NCCL watchdog timeout" and not found.raised
    assert "Watchdog caught collective operation timeout" in found.message and "SeqNum=861" in found.message


def test_generic_exception_is_the_last_uncaught_one_of_the_main_thread():
    lines = [
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 3, in <module>',
        "ValueError: an early one, printed and handled",
        "Exception in thread uploader:",
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 9, in upload',
        "OSError: a thread's, not the main thread's",
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 20, in <module>',
        "    main()",
        '  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads',
        "    return _default_decoder.decode(s)",
        "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        "step 99 (another thread still prints)",
    ]
    found = reason_of(lines)
    assert found.reason == "json.decoder.JSONDecodeError" and found.raised
    assert found.message == "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    assert found.frame == "w/train.py:20 <module>"  # the innermost frame in the user's code
    assert reason_of(["step 1", "step 2"]) is None


def test_fatal_signal_without_traceback_names_the_frame():
    lines = ["step 3", "Fatal Python error: Segmentation fault", "",
             "Current thread 0x00007f0000000002 (most recent call first):",
             '  File "/job/train.py", line 116 in train', '  File "/job/train.py", line 143 in main']
    found = reason_of(lines)
    assert (found.reason, found.raised, found.frame) == ("segmentation fault", False, "job/train.py:116 train")


def test_telling_tail_leads_with_the_error_and_drops_noise():
    lines = [
        "W1122 12:19:42.392000 1109 torch/distributed/run.py:851] *****************************************",
        "/venv/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: UserWarning: "
        "Failed to initialize NumPy: No module named 'numpy'",
        "  cpu = _conversion_method_template(device=torch.device(\"cpu\"))",
        *[f"step {i}" for i in range(50)],
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 5, in <module>',
        "RuntimeError: boom",
        "[W1122 12:22:33.27 ProcessGroupNCCL.cpp:1575] Warning: destroy_process_group() was not called",
    ]
    tail = telling_tail(lines, reason_of(lines), count=5)
    assert tail[:4] == ("── error ──", "Traceback (most recent call last):", '  File "/w/train.py", line 5, in <module>',
                        "RuntimeError: boom")
    assert tail[4] == "── last output ──" and tail[5:] == tuple(f"step {i}" for i in range(45, 50))
    assert not any("NumPy" in line or "_conversion_method_template" in line or "****" in line for line in tail)
    assert telling_tail(["step 1", "step 2"], None) == ("step 1", "step 2")


def test_logs_are_read_bounded_and_again_only_when_they_change(tmp_path, monkeypatch):
    log = tmp_path / "rank.log"
    log.write_text("x" * 500_000 + "\n" + "".join(f"step {i}\n" for i in range(1000)))
    reads = []
    real = ranklog.read_tail
    monkeypatch.setattr(ranklog, "read_tail", lambda *a, **k: reads.append(a) or real(*a, **k))
    logs = RankLogs(lines=100, max_bytes=4096)
    logs.note_writer(10, str(log))
    first = logs.read(str(log))
    assert len(first) <= 100 and first[-1] == "step 999" and len(reads) == 1
    assert logs.reason(str(log), 0, 0) is None and logs.reason(str(log), 0, 0) is None
    assert len(reads) == 1  # unchanged file: not read again
    with open(log, "a") as handle:
        handle.write("Traceback (most recent call last):\n  File \"/w/t.py\", line 1, in f\nKeyError: 'lr'\n")
    assert logs.reason(str(log), 0, 0).message == "KeyError: 'lr'" and len(reads) == 2
    logs.note_writer(11, str(log))  # a second writer: the file is shared, its plain lines nobody's
    assert logs.reason(str(log), 0, 0) is None
    assert logs.read(str(tmp_path / "missing")) is None and logs.tail(str(tmp_path / "missing"), 0, 0) is None


# mp.spawn's parent, as torch 2.13 printed it for a real 2-rank gloo job whose rank 1 raised
# (the child prints nothing; paths shortened).
SPAWN_PARENT = """\
[rank 0] step 3
W1123 13:35:40.719000 15218 torch/multiprocessing/spawn.py:165] Terminating process 15854 via signal SIGTERM
Traceback (most recent call last):
  File "/tmp/job/spawn_raise.py", line 16, in <module>
    mp.spawn(worker, args=(29755,), nprocs=2)
  File "/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 211, in join
    raise ProcessRaisedException(msg, error_index, failed_process.pid)
torch.multiprocessing.spawn.ProcessRaisedException: 

-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 87, in _wrap
    fn(i, *args)
  File "/tmp/job/spawn_raise.py", line 12, in worker
    raise RuntimeError("boom")
RuntimeError: boom
""".splitlines()


def test_mp_spawn_parents_report_is_the_failed_ranks():
    mine = rank_lines(SPAWN_PARENT, 1, 1, own=False)
    assert mine[0] == "-- Process 1 terminated with the following error:" and mine[-1] == "RuntimeError: boom"
    found = reason_of(mine)
    assert found is not None and found.raised
    assert (found.reason, found.message, found.frame) == ("RuntimeError", "RuntimeError: boom",
                                                          "job/spawn_raise.py:12 worker")
    assert reason_of(rank_lines(SPAWN_PARENT, 0, 0, own=False)) is None  # rank 0 was torn down
    # Read as the parent's own file, its ProcessRaisedException is never taken for a rank's error.
    parent = reason_of(rank_lines(SPAWN_PARENT, None, None, own=True))
    assert parent is None or "ProcessRaisedException" not in parent.reason

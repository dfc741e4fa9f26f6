"""Fatal-message classification and faulthandler parsing (no processes started)."""

from trainwatch.probes.read.logs import crashlog

SEGV = '''=== trainwatch: rank 2 pid 77 started 2026-01-01T00:00:00
Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/job/train.py", line 30 in _expire

Current thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/job/train.py", line 116 in train
  File "/job/train.py", line 143 in main

Extension modules: torch._C (total: 1)
'''


def test_segfault_trace_names_signal_and_user_frame():
    trace = crashlog.parse_faulthandler(SEGV)
    assert trace.signal == "SIGSEGV"
    assert trace.function == "string_at"
    assert crashlog.user_frame(trace) == "job/train.py:116 train"


def test_dump_before_a_restart_is_stale():
    text = SEGV + "=== trainwatch: rank 2 pid 78 started 2026-01-01T00:01:00\n"
    assert crashlog.parse_faulthandler(text) is None
    assert crashlog.parse_faulthandler("=== trainwatch: rank 0 pid 1 started x\n") is None


def test_classify_known_fatal_messages():
    cases = {
        "RuntimeError: CUDA error: device-side assert triggered": "CUDA device-side assert",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "CUDA out of memory",
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)": "NCCL watchdog timeout",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970": "NCCL error",
        "Fatal Python error: Segmentation fault": "segmentation fault",
        "RuntimeError: CUDA error: an illegal memory access was encountered": "CUDA error",
        "step 40 loss 0.12": None,
    }
    for text, reason in cases.items():
        assert crashlog.classify(text) == reason, text


def test_tail_of_missing_and_long_files(tmp_path):
    assert crashlog.tail(tmp_path / "nope") == ""
    log = tmp_path / "log"
    log.write_text("\n".join(str(i) for i in range(1000)))
    assert crashlog.tail(log, 3) == "997\n998\n999"


def test_spawn_reports_span_the_header_the_traceback_and_the_message():
    lines = ["torch.multiprocessing.spawn.ProcessRaisedException: ", "",
             "-- Process 2 terminated with the following error:", "Traceback (most recent call last):",
             '  File "train.py", line 9, in worker', "    raise ValueError('bad\\nshape')",
             "ValueError: bad", "shape", "", "later output"]
    assert crashlog.spawn_reports(lines) == [(2, 2, 8)]
    assert crashlog.spawn_reports(["-- Process 1 terminated with signal SIGSEGV"]) == []

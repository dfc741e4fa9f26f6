"""Stacks written as text (faulthandler, the hook's last words, tracebacks) read back as threads."""

from __future__ import annotations

from trainwatch.probes.read.stacks.stack_text import faulthandler_threads, traceback_thread

LAST_WORDS = '''Thread 0x00007f0000000002 "trainwatch-hook" (most recent call first):
  File "/usr/lib/python3.11/socket.py", line 294 in accept

Thread 0x00007f0000000001 "MainThread" (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/job/train.py", line 76 in sync_gradients
'''

FATAL = '''=== trainwatch: rank 1 pid 7 started 2026-11-25T08:00:00
Fatal Python error: Segmentation fault

Thread 0x00007f0000000003 (most recent call first):
  File "/venv/threading.py", line 320 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 116 in train
  File "/job/train.py", line 300 in main

Extension modules: torch._C (total: 1)
'''


def test_named_threads_the_main_one_by_name():
    threads = faulthandler_threads(LAST_WORDS)
    assert [(t.name, t.is_main) for t in threads] == [("trainwatch-hook", False), ("MainThread", True)]
    assert [f.label() for f in threads[1].frames] == ["distributed_c10d.py:3252 all_reduce",
                                                      "train.py:76 sync_gradients"]


def test_unnamed_threads_the_last_is_main_and_text_around_is_skipped():
    threads = faulthandler_threads(FATAL)
    assert [t.is_main for t in threads] == [False, True]
    assert threads[1].frames[0].label() == "train.py:116 train"


def test_the_hooks_own_frames_and_threads_are_not_the_jobs():
    from trainwatch.probes.read.stacks.stack_text import without_hook_frames

    text = LAST_WORDS.replace('  File "/venv/torch/distributed/distributed_c10d.py"',
                              '  File "/venv/site-packages/trainwatch/probes/hook/__init__.py", line 560 in all_stacks\n'
                              '  File "/venv/torch/distributed/distributed_c10d.py"')
    threads = without_hook_frames(faulthandler_threads(text))
    assert [t.name for t in threads] == ["MainThread"]
    assert threads[0].frames[0].function == "all_reduce"


def test_traceback_innermost_first():
    lines = ["Traceback (most recent call last):", '  File "/job/train.py", line 9, in main', "    step()",
             '  File "/job/train.py", line 3, in step', "    boom()", "RuntimeError: boom"]
    thread = traceback_thread(lines)
    assert thread is not None and [f.function for f in thread.frames] == ["step", "main"]
    assert traceback_thread(["no traceback here"]) is None


def test_a_dump_is_shown_main_thread_first_and_trainwatch_s_threads_last():
    """faulthandler writes the newest thread first: a person reading the culprit's stack in
    summary.md meets the hook's threads before the job's. Shown: MainThread, the job's, ours."""
    from trainwatch.probes.read.stacks.stack_text import main_thread_first

    text = ("Fatal Python error: Aborted\n\n"
            'Thread 0x1 "trainwatch-hook" (most recent call first):\n  File "/tw/hook.py", line 5 in accept\n\n'
            'Thread 0x2 "loader" (most recent call first):\n  File "/job/data.py", line 9 in fetch\n\n'
            'Current thread 0x3 "MainThread" (most recent call first):\n  File "/job/train.py", line 3 in main\n')
    shown = main_thread_first(text)
    headers = [line.split('"')[1] for line in shown.splitlines() if "most recent call first" in line]
    assert headers == ["MainThread", "loader", "trainwatch-hook"]
    assert shown.startswith("Fatal Python error: Aborted\n\n") and shown.endswith("line 5 in accept\n")
    assert faulthandler_threads(shown) == tuple(sorted(faulthandler_threads(text), key=lambda t: t.tid, reverse=True))
    # Without names the last thread is the main one (faulthandler's order): it goes first.
    plain = ("Thread 0x1 (most recent call first):\n  File \"/a.py\", line 1 in a\n\n"
             "Current thread 0x2 (most recent call first):\n  File \"/m.py\", line 2 in m\n")
    assert main_thread_first(plain).splitlines()[0].startswith("Current thread 0x2")

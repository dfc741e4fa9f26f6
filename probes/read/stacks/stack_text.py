"""Stacks written as text, read back as threads: faulthandler dumps, the hook's last words, tracebacks.

Three shapes, all Python's own:

* faulthandler (and the hook's ``all_stacks``, which adds thread names)::

      Thread 0x00007f… "MainThread" (most recent call first):
        File "/job/train.py", line 88 in step

  faulthandler lists the newest thread first, so without names the last thread is the main one;
* a traceback (``Traceback (most recent call last):`` then ``File "…", line N, in f`` pairs):
  the stack of the thread that raised, outermost first.

Frames come out innermost first, as py-spy gives them.
"""

from __future__ import annotations

import re

from ...snapshot import Frame, ThreadStack

# The one definition of each line shape (crashlog.py and ranklog.py read them too).
THREAD_HEADER = re.compile(r'^(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-f]+)(?: "(?P<name>[^"]*)")? '
                           r'\(most recent call first\):')
FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+|\?\?\?) in (?P<func>.+)$')
TRACEBACK_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
TRACEBACK = "Traceback (most recent call last):"


def _frame(match: re.Match[str]) -> Frame:
    line = match.group("line")
    return Frame(function=match.group("func"), file=match.group("file"), line=int(line) if line.isdigit() else None)


def faulthandler_threads(text: str) -> tuple[ThreadStack, ...]:
    """Every thread of the last dump in ``text`` (a file may hold several: the last one counts)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if THREAD_HEADER.match(line)]
    if not starts:
        return ()
    # The last dump: walk back from its last header over headers, frames and blank lines.
    first = starts[-1]
    while first > 0 and _in_dump(lines[first - 1]):
        first -= 1
    threads: list[ThreadStack] = []
    current: dict | None = None
    for line in lines[first:]:
        header = THREAD_HEADER.match(line)
        if header:
            current = {"name": header.group("name") or "", "tid": int(header.group("tid"), 16), "frames": []}
            threads.append(current)  # type: ignore[arg-type]
            continue
        found = FAULTHANDLER_FRAME.match(line)
        if found and current is not None:
            current["frames"].append(_frame(found))
        elif current is not None and line.strip() and not line.startswith("  "):
            current = None  # the dump ended
    named = any(t["name"] for t in threads)  # type: ignore[index]
    out = []
    for n, t in enumerate(threads):
        main = t["name"] == "MainThread" if named else n == len(threads) - 1  # type: ignore[index]
        out.append(ThreadStack(name=t["name"] or ("MainThread" if main else "thread"),  # type: ignore[index]
                               tid=t["tid"], frames=tuple(t["frames"]), is_main=main))  # type: ignore[index]
    return tuple(out)


# The hook's own frames on top of a stack it wrote from a signal handler (trainwatch's, not the job's).
_HOOK_FILES = ("probes/hook/__init__.py", "trainwatch/probes/hook/")


def without_hook_frames(threads: tuple[ThreadStack, ...]) -> tuple[ThreadStack, ...]:
    """Each thread without the hook's frames above the job's, and without the hook's own threads
    (``trainwatch-…``): where the job was when it was told to stop."""
    out = []
    for thread in threads:
        if thread.name.startswith("trainwatch-"):
            continue
        frames = thread.frames
        while frames and any(frames[0].file.endswith(h) or h in frames[0].file for h in _HOOK_FILES):
            frames = frames[1:]
        out.append(ThreadStack(thread.name, thread.tid, frames, thread.active, thread.owns_gil, thread.is_main)
                   if frames is not thread.frames else thread)
    return tuple(out)


def thread_order(name: str, is_main: bool) -> int:
    """Where a thread goes when a stack is shown to a person: the main thread first, the job's other
    threads next, trainwatch's own (``trainwatch-…``) last."""
    return 0 if is_main else 2 if name.startswith("trainwatch-") else 1


def main_thread_first(text: str) -> str:
    """``text`` (a faulthandler dump, possibly after other lines) with the threads of its last dump
    in :func:`thread_order`: faulthandler writes the newest thread first and the main one last."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if THREAD_HEADER.match(line)]
    if len(starts) < 2:
        return text
    first = starts[-1]
    while first > 0 and _in_dump(lines[first - 1]):
        first -= 1
    end = starts[-1] + 1
    while end < len(lines) and _in_dump(lines[end]):
        end += 1
    ours = [i for i in starts if i >= first]
    blocks = [lines[a:b] for a, b in zip(ours, [*ours[1:], end])]
    names = [THREAD_HEADER.match(block[0]).group("name") or "" for block in blocks]  # type: ignore[union-attr]
    named = any(names)
    order = sorted(range(len(blocks)), key=lambda n: thread_order(
        names[n], names[n] == "MainThread" if named else n == len(blocks) - 1))
    body: list[str] = []
    for n in order:
        block = blocks[n]
        while block and not block[-1].strip():
            block = block[:-1]
        body += [*block, ""]
    out = [*lines[:ours[0]], *body[:-1], *lines[end:]]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _in_dump(line: str) -> bool:
    return not line.strip() or bool(THREAD_HEADER.match(line) or FAULTHANDLER_FRAME.match(line)) or line.startswith("  <")


def traceback_thread(lines: list[str] | tuple[str, ...], name: str = "MainThread") -> ThreadStack | None:
    """The stack of the last traceback in ``lines``, as the thread that raised it."""
    start = max((i for i, line in enumerate(lines) if line.strip() == TRACEBACK), default=None)
    if start is None:
        return None
    frames = []
    for line in lines[start + 1:]:
        found = TRACEBACK_FRAME.match(line)
        if found:
            frames.append(_frame(found))
        elif not line.startswith(" "):
            break
    if not frames:
        return None
    return ThreadStack(name=name, frames=tuple(reversed(frames)), is_main=name == "MainThread")

"""Errors a person can act on: each carries the message shown and the exit status.

Exit statuses of the ``trainwatch`` command (docs/cli.md "Exit status" has the same table):

====  ==========================================================================
0     done: the command did what was asked
1     failed for another reason (a tool it runs failed or timed out, ...)
2     usage: bad arguments (unknown option, missing or invalid PID, bad value,
      ``attach`` without a terminal)
3     no such process
4     not a training job (trainwatch itself, its shell, a process with no job)
5     permission denied
6     py-spy (or another tool) missing or unable to read the job
7     not a trainwatch bundle, or a damaged one; files of a dead job with nothing
      to judge, or from two jobs mixed
8     cannot write the output (full disk, read-only, permissions)
9     partial: some node of the job could not be read; the rest is shown
10    ``watch``: a hang-type problem was seen (and bundled)
11    ``watch``: a rank crashed
130   interrupted (Ctrl-C)
141   stdout closed early (broken pipe)
====  ==========================================================================
"""

from __future__ import annotations

PARTIAL_EXIT = 9  # some node could not be read; the command showed the rest


class TrainwatchError(Exception):
    """A failure with a clear message for the user; the CLI prints it without a traceback."""

    exit_code = 1

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.remedy}" if self.remedy else self.message


class UsageError(TrainwatchError):
    """The command line asks for something that cannot be done as asked."""

    exit_code = 2


class NoSuchProcess(TrainwatchError):
    exit_code = 3


class NotAJob(TrainwatchError):
    exit_code = 4


class JobNotStarted(NotAJob):
    """A wrapper (``trainwatch run``) whose job has not started yet: a one-off look says so;
    ``watch`` waits for it."""


class AccessDenied(TrainwatchError):
    exit_code = 5


class ToolMissing(TrainwatchError):
    """py-spy (or another external tool) is absent or cannot read the target."""

    exit_code = 6


class BadBundle(TrainwatchError):
    exit_code = 7


class BadLeftovers(TrainwatchError):
    """Files a dead job left that cannot be judged: nothing of a job's there, or two jobs mixed."""

    exit_code = 7


class OutputError(TrainwatchError):
    """Cannot write where asked (full disk, read-only, permissions)."""

    exit_code = 8

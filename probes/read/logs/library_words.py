"""What a collective library said as it failed a rank, read as evidence of the collective that failed.

Three libraries speak when a collective goes wrong, each in its own words (read from their source,
torch 2.13 and the gloo it bundles):

* gloo checks the size of every chunk that arrives against the receiving call's buffer; a bigger
  one is an ``EnforceNotMet`` thrown on gloo's own thread, which ends the receiving rank by
  ``std::terminate`` (SIGABRT)::

      terminate called after throwing an instance of 'gloo::EnforceNotMet'
        what():  [enforce fail at …/gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes.
        10 vs 8. Received data size doesn't match expected size. Is there a distributed collective
        mismatch in your code?

  ``GLOO_ENFORCE_LE(a, b)`` prints ``a vs b``: the bytes that arrived, then the bytes this rank's
  call expected. The rank it kills is the one that *received* the odd size, not the one that sent it.
* c10d (``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wraps every group in ``ProcessGroupWrapper``, which
  compares the ranks' fingerprints before each collective) raises on every rank::

      RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective:
      CollectiveFingerPrint(SequenceNumber=3, OpType=ALLGATHER, TensorShape=[4], TensorDtypes=Float, …),
      but Rank 2 is running collective: CollectiveFingerPrint(SequenceNumber=3, OpType=ALLGATHER,
      TensorShape=[5], …).Collectives differ in the following aspects: …

  Each message names two ranks' calls; together the ranks' messages name every rank's.
* NCCL's errors, as ProcessGroupNCCL words them: the error NCCL itself returned (``ncclInvalidUsage``,
  ``ncclRemoteError``, ``ncclSystemError``, …), else the work that failed
  (``WorkNCCL(SeqNum=5, OpType=ALLGATHER, NumelIn=5, …)``: its sizes are read with the watchdog's
  lines, per process group, by ``read/collectives/sources/watchdog.py``). Their words are kept;
  they say nothing of which rank's call differs.

Only reading: which rank's call is the odd one out is judged across ranks (``judge/aborts.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...snapshot import CollectiveCall, LibraryError, RankCollective

MAX_TEXT = 64 * 1024  # the lines looked at: the end of a rank's output, where a failure is said
GLOO_WORDS = "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?"
_GLOO_SIZE = re.compile(r"(?:(\d{1,18}) vs (\d{1,18})\.\s*)?Received data size doesn't match expected size\.?"
                        r"(?: Is there a distributed collective mismatch in your code\?)?")
_ABORT = re.compile(r"terminate called after throwing an instance of '(?P<what>[\w:]+)'")
_C10D = re.compile(r"Detected mismatch between collectives on ranks\.")
_FINGERPRINT = re.compile(r"Rank (?P<rank>\d{1,9}) is running collective: CollectiveFingerPrint\("
                          r"(?P<body>.*?)(?=, but Rank \d|\)\.Collectives differ|\)\.\s*$|$)")
_FIELD = {name: re.compile(rf"\b{name}=(?P<v>[^,()\[\]]+|\[[^\]]*\])")
          for name in ("SequenceNumber", "OpType", "TensorShape", "TensorDtypes")}
_ASPECTS = re.compile(r"Collectives differ in the following aspects:\s*(?P<what>.*)$")
_WORK = re.compile(r"WorkNCCL\((?P<body>[^()]*(?:\([^()]*\)[^()]*)*)\)")
_NCCL_ERROR = re.compile(r"\b(nccl(?:InvalidUsage|InvalidArgument|RemoteError|SystemError|InternalError|"
                         r"UnhandledCudaError)\b[^\n]*)")
# NCCL's and c10d's op names that differ from torch's own (and the Flight Recorder's)
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "REDUCE_SCATTER": "reduce_scatter",
        "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all_single", "_ALLGATHER_BASE": "_allgather_base",
        "_REDUCE_SCATTER_BASE": "_reduce_scatter_base"}


def op_name(optype: str) -> str:
    """``ALLGATHER`` -> ``all_gather``: the op as torch and its Flight Recorder name it."""
    return _OPS.get(optype.upper(), optype.lower())


def library_error(lines: Sequence[str]) -> LibraryError | None:
    """What a collective library said in these lines (one rank's, or an exception's text), the
    most telling first: a mismatch the library saw (gloo's size check, c10d's fingerprints), else
    an NCCL error naming its work; None when no library said anything about a collective."""
    text = _bounded(lines)
    if not text:
        return None
    return _gloo(text) or _c10d(text) or _nccl(text)


def abort_lines(lines: Sequence[str]) -> list[str]:
    """A C++ abort's lines in a file several processes share (unprefixed: C++ writes no rank
    prefix): ``terminate called after throwing …`` and the ``what():`` line after it. Only the
    last such block; the caller decides whose it is (the one rank that died of SIGABRT)."""
    found: list[str] = []
    for n, line in enumerate(lines):
        if _ABORT.search(line):
            block = [line]
            if n + 1 < len(lines) and "what():" in lines[n + 1]:
                block.append(lines[n + 1])
            found = block
    return found


def _bounded(lines: Sequence[str]) -> str:
    text, size = [], 0
    for line in reversed(lines):
        size += len(line) + 1
        if size > MAX_TEXT:
            break
        text.append(line)
    return "\n".join(reversed(text))


def _gloo(text: str) -> LibraryError | None:
    found = None
    for found in _GLOO_SIZE.finditer(text):
        pass  # the last one: the latest word on the rank's end
    if found is None:
        return None
    received, expected = found.group(1), found.group(2)
    return LibraryError(library="gloo", words=GLOO_WORDS, mismatch=True,
                        received_bytes=int(received) if received else None,
                        expected_bytes=int(expected) if expected else None)


def _c10d(text: str) -> LibraryError | None:
    """c10d's fingerprint check: every rank's call the message names, in a group of their own."""
    lines = [line for line in text.splitlines() if _C10D.search(line)]
    if not lines:
        return None
    line = lines[-1]
    rows: dict[int, RankCollective] = {}
    for match in _FINGERPRINT.finditer(line):
        fields = {name: m.group("v").strip() for name, pattern in _FIELD.items() if (m := pattern.search(match["body"]))}
        seq = fields.get("SequenceNumber", "")
        if not seq.isdigit() or "OpType" not in fields:
            continue
        call = CollectiveCall(int(seq), op_name(fields["OpType"]), _shape(fields.get("TensorShape")),
                              fields.get("TensorDtypes") or "?")
        rows.setdefault(int(match["rank"]), RankCollective(rank=int(match["rank"]), pg="c10d", last_enqueued=call.seq,
                                                           op=call.op, sizes=call.sizes, dtype=call.dtype,
                                                           calls=(call,)))
    aspects = _ASPECTS.search(line)
    words = "Detected mismatch between collectives on ranks"
    if aspects:
        words += f"; collectives differ in: {' '.join(aspects['what'].split())[:160]}"
    return LibraryError(library="c10d", words=words, mismatch=True, calls=tuple(rows[r] for r in sorted(rows)))


def _shape(value: str | None) -> str:
    """c10d's ``[4]`` or ``[2, 3]`` as the Flight Recorder's sizes are written (``[4]``, ``[2x3]``)."""
    if not value:
        return "?"
    dims = [d.strip() for d in value.strip("[]").split(",") if d.strip()]
    return "[" + "x".join(dims) + "]" if all(d.isdigit() for d in dims) else "?"


def _nccl(text: str) -> LibraryError | None:
    """An NCCL error: NCCL's own error name and words, else the work ProcessGroupNCCL names."""
    errors = _NCCL_ERROR.findall(text)
    works = list(_WORK.finditer(text))
    if not errors and not works:
        return None
    # The work is named in its process group's numbering, which the line does not always say:
    # its sizes are judged with the watchdog's lines (read/collectives/sources/watchdog.py), by group.
    words = errors[-1].strip() if errors else f"WorkNCCL({works[-1]['body']})"
    return LibraryError(library="NCCL", words=words[:300])

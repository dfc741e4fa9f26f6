"""PyTorch's own Flight Recorder analyser (``torchfrtrace``), run as a user would, as an anchor for
trainwatch's post-mortem answers.

What torchfrtrace (torch 2.13, ``torch.distributed.flight_recorder.fr_trace``) does, read from its source
and checked on the dumps in tests/fixtures/fr (tests/read/test_anchor.py):

* reads every file under the directory whose name contains ``<prefix>`` (``--prefix``, else inferred from
  names ending in digits), rank = what follows the prefix; pickles only (a JSON dump fails to unpickle);
* takes the first file ``os.walk`` lists (directory order, not rank order) as the reference and names
  every other rank whose collective differs: ``error msg: Culprit rank N; Error type: ...``; a rank
  lacking the collective: ``missing ranks: {N}``;
* a rank without a dump: ``AssertionError: Missing dump files from ranks {N}`` (exit 1), or with
  ``--allow-incomplete-ranks`` "cannot decide ... missed FR dumps from ranks ({N})", naming nobody;
* fails with a traceback and exit 1; prints nothing at all when everything matches.

The runner stages the dumps as ``rank_<N>`` pickles in a temporary directory (JSON converted) and
never raises: every failure is the answer's ``error``.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MODULE = "torch.distributed.flight_recorder.fr_trace"
PREFIX = "rank_"
OUTPUT_CAP = 8192
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$")
_ERROR_LINE = re.compile(r"^[\w.]*(?:Error|Exception|Interrupt)\b.*$")


@dataclass(frozen=True)
class AnchorAnswer:
    """What torchfrtrace said about one set of dumps."""

    command: tuple[str, ...]
    returncode: int | None
    output: str  # stdout + stderr, capped to ~8 KB
    named_ranks: tuple[int, ...]  # ranks it names at fault ("Culprit rank N", "missing ranks: {N}")
    error: str | None  # one line: why it gave no answer
    missing_dumps: tuple[int, ...] = ()  # "missed FR dumps from ranks ({N})" (--allow-incomplete-ranks)
    read_order: tuple[int, ...] = ()  # ranks in the order it reads them; the first is its reference

    def line(self) -> str:
        """One human line: whom it names and where, or why it gave no answer."""
        if self.error:
            return f"torchfrtrace: no answer ({self.error})"
        where = _first_finding(self.output)
        if self.named_ranks:
            s = "s" if len(self.named_ranks) > 1 else ""
            return f"torchfrtrace: names rank{s} {_join(self.named_ranks)}" + (f" ({where})" if where else "")
        if self.missing_dumps:
            return f"torchfrtrace: names no rank (cannot decide: no dumps from ranks {_join(self.missing_dumps)})"
        return "torchfrtrace: names no rank (no mismatch found)"


def run_torchfrtrace(
    dumps: Path | Sequence[Path], timeout: float = 60.0, allow_incomplete: bool = True
) -> AnchorAnswer:
    """Run torchfrtrace on a directory of per-rank dumps (or a list of dump files)."""
    with tempfile.TemporaryDirectory(prefix="torchfrtrace-") as tmp:
        try:
            _stage(dumps, Path(tmp))
        except Exception as exc:  # noqa: BLE001 - every failure becomes the answer's error
            return AnchorAnswer((), None, "", (), f"{type(exc).__name__}: {exc}")
        read_order = tuple(int(name[len(PREFIX):]) for name in next(os.walk(tmp))[2])
        command = (sys.executable, "-m", MODULE, tmp, "--prefix", PREFIX)
        command += ("--allow-incomplete-ranks",) if allow_incomplete else ()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            output = _text(exc.stdout) + _text(exc.stderr)
            return AnchorAnswer(command, None, _cap(output), (), f"timed out after {timeout:g}s", (), read_order)
        except OSError as exc:
            return AnchorAnswer(command, None, "", (), f"{type(exc).__name__}: {exc}", (), read_order)
    output = done.stdout + done.stderr
    error = None
    if done.returncode != 0:
        lines = [ln.strip() for ln in output.splitlines() if _ERROR_LINE.match(ln.strip())]
        error = lines[-1] if lines else f"exit code {done.returncode}"
    return AnchorAnswer(command, done.returncode, _cap(output), _named(output), error,
                        _ranks_after(r"missed FR dumps from ranks \(\{([\d, ]*)\}\)", output), read_order)


def _stage(dumps: Path | Sequence[Path], into: Path) -> None:
    """Write each rank's dump as ``into/rank_<N>``, a pickle; a rank's pickle is preferred over its JSON."""
    files = sorted(p for p in Path(dumps).iterdir() if p.is_file()) if isinstance(dumps, (str, Path)) else dumps
    chosen: dict[int, tuple[Path, dict | None]] = {}
    for path in map(Path, files):
        m = _RANK_IN_NAME.search(path.name)
        if not m:
            continue
        rank, data = int(m.group(1)), path.read_bytes()
        try:
            as_json = json.loads(data)
        except ValueError:
            as_json = None  # a pickle (or junk): torchfrtrace judges it
        else:
            if not (isinstance(as_json, dict) and "entries" in as_json):
                continue  # JSON, but not a dump with entries
        if rank in chosen:
            if (chosen[rank][1] is None) == (as_json is None):
                raise ValueError(f"two dumps for rank {rank}: {chosen[rank][0].name}, {path.name}")
            if as_json is not None:
                continue  # keep the pickle already chosen
        chosen[rank] = (path, as_json)
    if not chosen:
        raise FileNotFoundError(f"no Flight Recorder dumps (names ending in a rank) in {dumps}")
    for rank, (path, as_json) in sorted(chosen.items()):
        target = into / f"{PREFIX}{rank}"
        if as_json is None:
            shutil.copyfile(path, target)
        else:  # the pickle form has process_group as a tuple
            for entry in as_json["entries"]:
                if isinstance(entry.get("process_group"), list):
                    entry["process_group"] = tuple(entry["process_group"])
            target.write_bytes(pickle.dumps(as_json))


def _named(output: str) -> tuple[int, ...]:
    culprits = {int(r) for r in re.findall(r"Culprit rank (\d+)", output)}
    return tuple(sorted(culprits | set(_ranks_after(r"missing ranks: \{([\d, ]*)\}", output))))


def _ranks_after(pattern: str, output: str) -> tuple[int, ...]:
    return tuple(sorted({int(r) for group in re.findall(pattern, output) for r in re.findall(r"\d+", group)}))


def _first_finding(output: str) -> str | None:
    """``mismatch at collective #5 all_reduce`` from the first finding it printed."""
    m = re.search(r"^(?:Collective sequence number: (\d+) has errors|Not all ranks joining collective, "
                  r"sequence number: (\d+))\n(?:.*\n)*?collective: (?:\w+:)?(\S+)", output, re.MULTILINE)
    if not m:
        return None
    kind = "mismatch" if m.group(1) else "not all ranks joined"
    return f"{kind} at collective #{m.group(1) or m.group(2)} {m.group(3)}"


def _join(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def _cap(output: str) -> str:
    if len(output) <= OUTPUT_CAP:
        return output
    half = OUTPUT_CAP // 2
    return f"{output[:half]}\n[... {len(output) - OUTPUT_CAP} characters left out ...]\n{output[-half:]}"

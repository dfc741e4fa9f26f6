"""Read an evidence bundle back (directory or ``.tar.gz``) as a read-only snapshot source."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tarfile
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import BadBundle
from ..source import OneNodeSource
from .bundle import BUNDLE_FORMAT
from ..read.logs.ranklog import RankLogs
from ..snapshot import Rank, Snapshot, SnapshotError

MAX_MEMBER_BYTES = 512 * 1024 * 1024


def _extract(archive: Path) -> tuple[Path, Path]:
    """Unpack into a private temp dir; returns (temp dir, bundle root). Refuses unsafe members."""
    try:
        is_tar = tarfile.is_tarfile(archive)
    except OSError as exc:
        raise BadBundle(f"cannot read {archive}: {exc.strerror or exc}") from None
    except (EOFError, tarfile.TarError, ValueError):  # a compressed stream cut short
        raise BadBundle(f"{archive}: damaged bundle archive (it ends early)",
                        "was it copied completely? try `tar tzf` on it") from None
    if not is_tar:
        raise BadBundle(f"{archive} is not a trainwatch bundle (not a tar archive)",
                        "open a directory or .tar.gz written by `trainwatch dump`")
    tmp = Path(tempfile.mkdtemp(prefix="trainwatch-open-"))
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                if not (member.isfile() or member.isdir()) or member.size > MAX_MEMBER_BYTES:
                    raise BadBundle(f"{archive}: unexpected member {member.name!r}")
            tar.extractall(tmp, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # tarfile's reasons run to lines
        raise BadBundle(f"{archive}: damaged bundle archive ({why})",
                        "was it copied completely? try `tar tzf` on it") from None
    except BadBundle:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    roots = [p for p in tmp.iterdir() if p.is_dir()]
    return tmp, roots[0] if len(roots) == 1 else tmp


class BundleSource(OneNodeSource):
    """``poll()`` returns the bundle's snapshot (``source="bundle:<path>"``), log tails inside it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._tmp: Path | None = None
        if self.path.is_dir():
            self.root = self.path
        elif self.path.is_file():
            self._tmp, self.root = _extract(self.path)
        else:
            raise BadBundle(f"no bundle at {self.path}")
        try:
            self.manifest = self._manifest()
            self.snapshot = self._load_snapshot()
        except BadBundle:
            self.close()
            raise

    def _manifest(self) -> dict:
        try:
            data = json.loads((self.root / "bundle.json").read_text())
        except (OSError, ValueError):
            raise BadBundle(f"{self.path} is not a trainwatch bundle (no readable bundle.json)",
                            "open a directory or .tar.gz written by `trainwatch dump`") from None
        if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
            raise BadBundle(f"{self.path} is not a trainwatch bundle (bundle.json of another format)")
        return data

    def _load_snapshot(self) -> Snapshot:
        try:
            snapshot = Snapshot.from_json((self.root / "snapshot.json").read_text())
        except OSError as exc:
            raise BadBundle(f"{self.path}: snapshot.json unreadable: {exc.strerror}") from None
        except SnapshotError as exc:
            raise BadBundle(f"{self.path}: damaged snapshot.json: {exc}") from None
        ranks = tuple(self._with_log_inside(r) for r in snapshot.ranks)
        return dataclasses.replace(snapshot, ranks=ranks, source=f"bundle:{self.path}")

    def _with_log_inside(self, rank: Rank) -> Rank:
        """The rank's log as the bundle holds it (``ranks/N/log-tail.txt``), and its telling tail
        where the snapshot was written without one (bundles from before the tail travelled in it)."""
        path = self._log_inside(rank.rank)
        tail = rank.log_tail
        if tail is None and path is not None:
            tail = RankLogs().shown_tail(path, rank.rank, rank.local_rank)
        return dataclasses.replace(rank, log_path=path, log_tail=tail)

    def _log_inside(self, rank: int | None) -> str | None:
        path = self.root / "ranks" / str(rank) / "log-tail.txt"
        return str(path) if rank is not None and path.is_file() else None

    def summary(self) -> str:
        try:
            return (self.root / "summary.md").read_text()
        except OSError as exc:
            raise BadBundle(f"{self.path}: summary.md unreadable: {exc.strerror}") from None

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        return self.snapshot

    def paused_judgement(self) -> AbstractContextManager[None]:
        """A bundle judges nothing: there is nothing to pause."""
        return contextlib.nullcontext()

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

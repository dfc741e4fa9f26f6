"""Evidence bundles from other nodes: ``trainwatch dump`` run on each node into a private temp
dir, streamed back as tar.gz and unpacked under ``<bundle>/hosts/<node>/``."""

from __future__ import annotations

import shlex
import shutil
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .calls import Runner, classify_failure
from .node_spec import DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S
from .reach import Remote


def dump_script(trainwatch: str, match: list[str], extra: list[str] | None = None) -> str:
    """Shell run on a node: dump into a private temp dir, stream it back as tar.gz on stdout."""
    dump = f"{trainwatch} {shlex.join(['dump', *match, *(extra or [])])}"
    return (
        'd=$(mktemp -d "${TMPDIR:-/tmp}/trainwatch-dump.XXXXXX") || exit 1\n'
        "trap 'rm -rf \"$d\"' EXIT\n"
        f'{dump} --out "$d/bundle" >&2\n'
        "rc=$?\n"
        'if [ -e "$d/bundle" ]; then tar -C "$d" -czf - bundle || exit 70; fi\n'
        "exit $rc\n"
    )


def safe_dirname(name: str) -> str:
    """A host or pod name usable as one path component."""
    cleaned = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name).strip(".")
    return cleaned or "host"


def remote_dump(remote: Remote, runner: Runner, trainwatch: str, match: list[str], dest: Path,
                timeout: float, extra: list[str] | None = None) -> str | None:
    """Dump ``remote``'s ranks and unpack the bundle into ``dest``; returns a note on failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(prefix="trainwatch-remote-", suffix=".tar.gz", dir=dest.parent,
                                     delete=False) as tmp:
        archive = Path(tmp.name)
    try:
        result = runner.run(remote.shell_argv(dump_script(trainwatch, match, extra)), timeout,
                            stdout_path=str(archive))
        size = archive.stat().st_size if archive.exists() else 0
        if size == 0:
            return f"{remote.name}: no bundle: {classify_failure(remote, result, timeout)}"
        try:
            _unpack(archive, dest)
        except (tarfile.TarError, OSError, EOFError) as exc:
            return f"{remote.name}: bundle could not be unpacked: {exc}"
        if result.returncode not in (0, None) or result.timed_out:
            return f"{remote.name}: bundle may be incomplete: {classify_failure(remote, result, timeout)}"
        return None
    finally:
        archive.unlink(missing_ok=True)


def _unpack(archive: Path, dest: Path) -> None:
    """Extract safely (no absolute paths, links or devices) and drop the single top folder."""
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(staging, filter="data")
        top = [p for p in staging.iterdir()]
        root = top[0] if len(top) == 1 and top[0].is_dir() else staging
        inner = [p for p in root.iterdir()]
        if len(inner) == 1 and inner[0].is_dir():  # dump wrote a folder inside --out
            root = inner[0]
        dest.mkdir(parents=True, exist_ok=True)
        for item in root.iterdir():
            shutil.move(str(item), str(dest / item.name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def collect_remote_bundles(remotes: list[Remote], bundle_dir: Path, timeout: float = DEFAULT_TIMEOUT_S, *,
                           trainwatch: str = "trainwatch", match: list[str], parallel: int = DEFAULT_PARALLEL,
                           runner: Runner | None = None) -> list[str]:
    """Fetch every node's bundle into ``<bundle_dir>/hosts/<name>/`` in parallel; notes for the summary."""
    runner = runner or Runner()
    hosts = Path(bundle_dir) / "hosts"
    notes: list[str] = []
    if not remotes:
        return notes
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(remotes)))) as pool:
        futures = {pool.submit(remote_dump, r, runner, trainwatch, match, hosts / safe_dirname(r.name), timeout): r
                   for r in remotes}
        for future in futures:
            note = future.result()
            notes.append(note or f"{futures[future].name}: bundle in hosts/{safe_dirname(futures[future].name)}/")
    return notes

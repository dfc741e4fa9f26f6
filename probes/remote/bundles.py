"""Evidence bundles from other nodes: each node's agent sends its own as a .tar.gz on its stream
(``StreamSource.collect_bundles``), unpacked here under ``<bundle>/hosts/<node>/``."""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path


def safe_dirname(name: str) -> str:
    """A host or pod name usable as one path component."""
    cleaned = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name).strip(".")
    return cleaned or "host"


def unpack_bundle(archive: Path, dest: Path) -> None:
    """Extract safely (no absolute paths, links or devices) and drop the single top folder."""
    dest.parent.mkdir(parents=True, exist_ok=True)
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

"""A tiny in-memory FUSE filesystem (mfusepy over libfuse 3) that the tests mount and then freeze.

Stopping this daemon with SIGSTOP is what a hung gcsfuse/s3fs/NFS mount looks like to the job: a
rank's file call on the mount waits in the kernel for an answer that never comes. Run:
``python memfs.py MOUNTPOINT`` (foreground; unmount with ``fusermount3 -u MOUNTPOINT``).
"""

from __future__ import annotations

import errno
import stat
import sys
import time

import mfusepy as fuse


class MemFS(fuse.Operations):
    def __init__(self) -> None:
        now = time.time()
        self.files: dict[str, bytearray] = {}
        self.root = {"st_mode": stat.S_IFDIR | 0o777, "st_nlink": 2, "st_ctime": now, "st_mtime": now,
                     "st_atime": now}

    def getattr(self, path, fh=None):
        if path == "/":
            return self.root
        if path not in self.files:
            raise fuse.FuseOSError(errno.ENOENT)
        now = time.time()
        return {"st_mode": stat.S_IFREG | 0o666, "st_nlink": 1, "st_size": len(self.files[path]),
                "st_ctime": now, "st_mtime": now, "st_atime": now}

    def readdir(self, path, fh):
        return [".", "..", *(name[1:] for name in self.files)]

    def create(self, path, mode, fi=None):
        self.files[path] = bytearray()
        return 0

    def open(self, path, flags):
        if path not in self.files:
            raise fuse.FuseOSError(errno.ENOENT)
        return 0

    def truncate(self, path, length, fh=None):
        del self.files[path][length:]

    def write(self, path, data, offset, fh):
        buf = self.files[path]
        buf[offset:offset + len(data)] = data
        return len(data)

    def read(self, path, size, offset, fh):
        return bytes(self.files[path][offset:offset + size])

    def unlink(self, path):
        self.files.pop(path, None)

    def rename(self, old, new):
        self.files[new] = self.files.pop(old)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return 0


if __name__ == "__main__":
    fuse.FUSE(MemFS(), sys.argv[1], foreground=True, nothreads=True, fsname="memfs")

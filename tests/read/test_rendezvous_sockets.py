"""The socket tables discovery reads to find a job through its store (no process: rows as the
kernel prints them in /proc/net/tcp{,6})."""

from __future__ import annotations

from trainwatch.probes.read.processes import rendezvous, sockets
from trainwatch.probes.read.processes.sockets import TcpSocket


def test_addresses_as_the_kernel_prints_them():
    assert sockets.address("0100007F:7530") == ("127.0.0.1", 30000)
    assert sockets.address("0000000000000000FFFF00000100007F:DD47") == ("127.0.0.1", 56647)  # IPv4-mapped
    assert sockets.address("00000000000000000000000000000000:0016") == ("::", 22)
    assert sockets.address("00000000000000000000000001000000:0016") == ("0:0:0:0:0:0:0:1", 22)


def test_a_socket_a_fork_copied_belongs_to_the_parent():
    parents = {11: 10, 12: 11}
    assert sockets.owners({10: [5], 11: [5, 6], 12: [6, 7]}, parents) == {5: 10, 6: 11, 7: 12}


def conn(inode: int, local: tuple[str, int], remote: tuple[str, int]) -> TcpSocket:
    return TcpSocket(inode, local, remote, sockets.ESTABLISHED)


LO = "127.0.0.1"


def job_table() -> tuple[dict[int, TcpSocket], dict[int, int]]:
    """Rank 0 (PID 100) serves a store on port 4000 and connects to it; ranks 1 (101) and 2 (102)
    connect to it; a rank on another node (10.0.0.2) does too; ranks 0 and 1 share a gloo pair; a
    driver (PID 50) holds a connection to each rank's own server (port 5000+)."""
    rows = [TcpSocket(1, ("::", 4000), ("::", 0), sockets.LISTEN)]
    owner = {1: 100}
    inode = 10
    for pid, port in ((100, 40001), (101, 40002), (102, 40003)):
        rows += [conn(inode, (LO, port), (LO, 4000)), conn(inode + 1, (LO, 4000), (LO, port))]
        owner.update({inode: pid, inode + 1: 100})
        inode += 2
    rows.append(conn(inode, ("10.0.0.1", 4000), ("10.0.0.2", 50000)))
    owner[inode] = 100
    rows += [TcpSocket(30, (LO, 7000), ("0.0.0.0", 0), sockets.LISTEN), conn(31, (LO, 7000), (LO, 45000)),
             conn(32, (LO, 45000), (LO, 7000))]
    owner.update({30: 101, 31: 101, 32: 100})
    for n, pid in enumerate((100, 101, 102)):
        rows += [TcpSocket(40 + n, ("::", 5000 + n), ("::", 0), sockets.LISTEN),
                 conn(50 + n, (LO, 5000 + n), (LO, 46000 + n)), conn(60 + n, (LO, 46000 + n), (LO, 5000 + n))]
        owner.update({40 + n: pid, 50 + n: pid, 60 + n: 50})
    return {row.inode: row for row in rows}, owner


def test_the_store_is_the_server_its_own_process_is_connected_to():
    table, owner = job_table()
    scan = rendezvous._read_table(table, owner, [], is_torch=lambda pid: True)
    assert [(s.port, s.host, s.clients, s.remote_clients) for s in scan.stores] == \
        [(4000, 100, (100, 101, 102), ("10.0.0.2",))]  # not gloo's listener, not the ranks' own servers
    store = scan.stores[0]
    assert scan.store_for(101) == (store, ()) and scan.store_for(100) == (store, ())
    assert scan.store_for(50) == (store, ())  # the driver: its peers are the store's clients
    assert scan.peers[50] == frozenset({100, 101, 102})
    assert store.text == "10.0.0.1:4000"  # as other nodes reach it
    assert scan.clients_of((LO, 4000)) == (100, 101, 102)
    assert scan.nothing_at((LO, 4100)) and not scan.nothing_at((LO, 4000))


def test_a_self_connected_server_without_torch_is_no_store():
    table, owner = job_table()
    assert rendezvous._read_table(table, owner, [], is_torch=lambda pid: False).stores == ()


def test_fds_that_may_not_be_read_give_a_note_not_a_crash(monkeypatch):
    """Another user's process: its fds are refused; the scan says so and goes on."""
    import errno
    import os
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    real = os.listdir

    def listdir(path):
        if str(path) == f"/proc/{other.pid}/fd":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path)

    try:
        monkeypatch.setattr(sockets.os, "listdir", listdir)
        assert sockets.socket_inodes(other.pid) is None
        scan = rendezvous.scan(os.getpid())
        assert any(str(other.pid) in n and "could not be read (another user's processes)" in n for n in scan.notes), \
            scan.notes
    finally:
        other.kill()
        other.wait()

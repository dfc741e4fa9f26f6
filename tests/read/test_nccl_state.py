"""NCCL-only sources against the real files and sockets they read: a FIFO, a RAS server, dump files."""

import os
import socket
import threading
import time


from ras_server import FIXTURES, RasServer, takes
from trainwatch.probes.read.collectives import nccl_state, ras


def test_fr_prefixes_default_to_torch_cache(tmp_path):
    env = {"HOME": "/home/a", "TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"}
    assert nccl_state.fr_prefixes(env) == ["/x/fr_", "/home/a/.cache/torch/comm_lib_trace_rank_"]
    assert nccl_state.fr_prefixes({"XDG_CACHE_HOME": "/c"}) == ["/c/torch/comm_lib_trace_rank_"]


def test_fr_files_on_disk(tmp_path):
    (tmp_path / "fr_2").write_bytes(b'{"entries": []}')
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_"), "HOME": str(tmp_path)}
    [found] = nccl_state.fr_files_on_disk(2, env)
    assert found.data == b'{"entries": []}' and found.origin == str(tmp_path / "fr_2")
    [missing] = nccl_state.fr_files_on_disk(3, env)
    assert missing.data is None and "fr_3" in missing.note
    (tmp_path / "fr_4").mkdir()  # there, but not readable as a dump: said, not skipped
    [unreadable] = nccl_state.fr_files_on_disk(4, env)
    assert unreadable.data is None and f"unreadable: {tmp_path / 'fr_4'}: Is a directory" in unreadable.note


def test_pipe_nobody_reading_is_a_note(tmp_path):
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo)
    assert "nobody reads" in nccl_state.trigger_pipe(fifo)
    assert "no pipe" in nccl_state.trigger_pipe(tmp_path / "absent.pipe")
    (tmp_path / "plain").write_text("x")
    assert "not a named pipe" in nccl_state.trigger_pipe(tmp_path / "plain")


def test_pipe_dump_collects_the_file(tmp_path):
    """A reader thread plays the rank's watchdog: on a write, it dumps its trace to the temp file."""
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_"), "HOME": str(tmp_path)}
    fifo = tmp_path / "pipe_1.pipe"
    os.mkfifo(fifo)
    got = []

    def watchdog():
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        deadline = time.monotonic() + 5
        try:
            while time.monotonic() < deadline:
                try:
                    data = os.read(fd, 100)
                except BlockingIOError:
                    data = b""
                if data:
                    got.append(data)
                    (tmp_path / "trace_1").write_bytes(b'{"entries": [], "version": "2.10"}')
                    return
                time.sleep(0.02)
        finally:
            os.close(fd)

    reader = threading.Thread(target=watchdog)
    reader.start()
    time.sleep(0.1)
    found = nccl_state.dump_through_pipe(1, env, wait_s=3)
    reader.join()
    assert got and found.data is not None and found.source == "pipe", found.note


def test_ras_status_against_a_local_server():
    """The raw text report, for bundles, through the RAS client (a stand-in server on loopback)."""
    with RasServer(takes("dead")) as server:
        found = ras.query("127.0.0.1", server.port, timeout=2, want_json=False)
    assert found.raw == (FIXTURES / "synthetic-dead-a.txt").read_bytes()
    assert server.commands[0] == "CLIENT PROTOCOL 2" and server.commands[-1] == "VERBOSE STATUS"
    assert "SET FORMAT json" not in server.commands  # the text report is what a person reads
    summary = nccl_state.summarize_ras(found.raw.decode())
    assert any("Process 5202 on node 10.0.0.12" in line for line in summary), summary


def test_ras_absent_or_silent_is_a_note():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    found = ras.query("127.0.0.1", port, timeout=1, want_json=False)
    assert found.raw is None and "no NCCL RAS" in found.note
    started = time.monotonic()
    with RasServer(takes("healthy"), silent=True) as server:
        found = ras.query("127.0.0.1", server.port, timeout=0.5, want_json=False)
    assert time.monotonic() - started < 5  # bounded even when the server never answers
    assert found.raw is None and "did not answer" in found.note


def test_ras_address_parsing():
    assert ras.address({}) == ("localhost", 28028)
    assert ras.address({"NCCL_RAS_ADDR": "10.0.0.1:3000"}) == ("10.0.0.1", 3000)
    assert ras.address({"NCCL_RAS_ADDR": "[::1]:3000"}) == ("::1", 3000)


def test_settings_and_debug_file_substitution(tmp_path):
    env = {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "CUDA_VISIBLE_DEVICES": "0",
           "HOME": "/x", "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
    assert set(nccl_state.settings(env)) == {"NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                            "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG_FILE"}
    (tmp_path / "nccl.node1.42.log").write_text("NCCL INFO hello\n")
    [found] = nccl_state.nccl_debug_files(env, 42, "node1")
    assert found.data == b"NCCL INFO hello\n"
    [missing] = nccl_state.nccl_debug_files(env, 43, "node1")
    assert missing.data is None and "nccl.node1.43.log" in missing.note


def test_debug_server_without_store_is_a_note():
    urls, why = nccl_state.debug_server_urls(None, None, [0])
    assert urls == {} and "MASTER_ADDR" in why


def test_debug_server_handler_unreachable_is_a_note():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    found = nccl_state.fetch_debug_handler(f"http://127.0.0.1:{port}", "fr_trace_json", timeout=1)
    assert found.data is None and "fr_trace_json" in found.note


def test_a_dump_written_in_halves_is_read_whole(tmp_path):
    """torch writes the dump in place: a half-written pickle is waited out, not taken."""
    from pathlib import Path

    from trainwatch.probes.read.collectives import flightrec

    whole = (Path(__file__).parents[1] / "fixtures" / "fr" / "h100" / "pipe-dump-rank0.pickle").read_bytes()
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_")}
    started = time.time()

    def writer():
        with open(tmp_path / "trace_0", "wb") as out:
            out.write(whole[: len(whole) // 2])
            out.flush()
            time.sleep(1.0)  # longer than the settle check: the size alone would look final
            out.write(whole[len(whole) // 2:])

    thread = threading.Thread(target=writer)
    thread.start()
    found = nccl_state.await_dump(0, env, started, wait_s=5, accept=flightrec.is_trace)
    thread.join()
    assert found.data == whole, found.note
    assert nccl_state.PIPE_WAIT_S == 15.0  # 5.7 s measured on an H100: 3 s was too short


def test_pipe_wait_can_be_stopped(tmp_path):
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "trace_")}
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    found = nccl_state.await_dump(0, env, time.time(), wait_s=10, stop=stop)
    assert time.monotonic() - started < 2 and found.data is None and "stopped" in found.note

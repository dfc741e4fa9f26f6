"""Bundles asked of the agents already running: each comes back on its agent's stream in parts and
is unpacked under hosts/<node>/; a node whose agent sends none, or only part of one, is named.

The agents are stand-ins (real processes speaking the wire: a hello, an answer, and their bundle
when asked), so the whole viewer side runs: StreamSource's launches, reader and collection."""

from __future__ import annotations

import io
import random
import sys
import tarfile
import textwrap
from pathlib import Path

from trainwatch.probes.remote.launches import Launch, popen_agent
from trainwatch.probes.remote.reach import SshRemote
from trainwatch.probes.remote.streams import StreamSource
from trainwatch.probes.remote.wire import BUNDLE_PART, bundle_lines, decode_line, encode_line
from trainwatch.probes.snapshot import Frame, Job, Rank, Snapshot, ThreadStack, Verdict

AGENT = textwrap.dedent("""\
    import json, sys
    name, answer, archive, mode = sys.argv[1:5]
    print(json.dumps({"kind": "trainwatch-node", "v": 1, "node": name, "hello": True}), flush=True)
    print(open(answer).read().strip(), flush=True)
    sys.path[:0] = sys.argv[5:]
    from trainwatch.probes.remote.wire import bundle_lines
    for line in sys.stdin:
        request = json.loads(line)
        if "bundle" not in request:
            continue
        data = open(archive, "rb").read()
        lines = bundle_lines(name, request["bundle"], data, "disk full" if mode == "refuse" else None)
        if mode == "cut":
            lines = lines[:1] + lines[2:]  # a part lost on the way
        for out in lines:
            print(out, flush=True)
    """)


def answer_line(host: str, rank: int) -> str:
    job = Job(launcher="torchrun", pid=10, host=host, world_size=3, master_addr="a", master_port=1)
    threads = (ThreadStack("MainThread", 7, (Frame("all_reduce", "/w/c10d.py", 9),), is_main=True),)
    record = Rank(rank=rank, pid=100 + rank, host=host, state="stuck", phase="collective", op="all_reduce",
                  threads=threads)
    snap = Snapshot(job=job, ranks=(record,),
                    verdict=Verdict("hang", (), ""), taken_at=1.0, window_s=1.0)
    return encode_line(snap, host, seq=1)


def archive_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"trainwatch-bundle/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_every_nodes_bundle_comes_back_on_its_agents_stream(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    big = random.Random(7).randbytes(3 * BUNDLE_PART + 777)  # does not compress: several parts
    modes = {"n0": "send", "n1": "refuse", "n2": "cut"}
    for n, name in enumerate(modes):
        (tmp_path / f"{name}.answer").write_text(answer_line(name, n))
        (tmp_path / f"{name}.tar.gz").write_bytes(archive_of({"ranks/0/stacks.txt": b"train.py:12\n",
                                                              "blob.bin": big}))
    src = str(Path(__file__).resolve().parents[2])

    def spawn(launch: Launch):
        name = launch.names[0]
        return popen_agent(Launch([sys.executable, str(script), name, str(tmp_path / f"{name}.answer"),
                                   str(tmp_path / f"{name}.tar.gz"), modes[name], src], launch.names, launch.remote))

    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()
    source = StreamSource(None, [SshRemote(name) for name in modes], match=["--match", "a:1"], interval=1.0,
                          window=0.5, timeout=20, world_size=3, spawn=spawn, once=True)
    try:
        assert {r.host for r in source.poll().ranks} == set(modes)
        notes = source.collect_bundles(bundle_dir, timeout=20)
    finally:
        source.close()
    assert notes == ["n0: bundle in hosts/n0/", "n1: no bundle: disk full", "n2: no bundle: 3 of 4 parts arrived"]
    assert (bundle_dir / "hosts" / "n0" / "ranks" / "0" / "stacks.txt").read_text() == "train.py:12\n"
    assert (bundle_dir / "hosts" / "n0" / "blob.bin").read_bytes() == big
    assert sorted(p.name for p in bundle_dir.iterdir()) == ["hosts"]  # nothing of the parts is left
    assert sorted(p.name for p in (bundle_dir / "hosts").iterdir()) == ["n0"]


def test_a_bundle_is_whole_lines_of_the_wire_and_an_error_is_one():
    lines = bundle_lines("n7", "r1", b"x" * (2 * BUNDLE_PART + 1))
    assert len(lines) == 4 and '"end": true' in lines[-1] and '"parts": 3' in lines[-1]
    (refused,) = bundle_lines("n7", "r1", b"", "no job read here yet")
    assert '"error": "no job read here yet"' in refused
    assert decode_line(answer_line("n7", 0)).node == "n7"  # the same wire carries answers
